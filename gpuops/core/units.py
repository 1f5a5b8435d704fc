"""Parsing and printing of the units operators type: sizes, percentages and durations.

Binary suffixes (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB, GB, TB) powers
of 1000, as IEC says. Single-letter suffixes (k, m, g, t, as HAMi-core and MPS accept) are
binary, because that is what those tools mean by them.
"""

from __future__ import annotations

import math
import re
from typing import Union

_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1024,
    "kib": 1024,
    "kb": 1000,
    "m": 1024**2,
    "mib": 1024**2,
    "mb": 1000**2,
    "g": 1024**3,
    "gib": 1024**3,
    "gb": 1000**3,
    "t": 1024**4,
    "tib": 1024**4,
    "tb": 1000**4,
}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*\Z")
_PERCENT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%?\s*\Z")
_DURATION_RE = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


class UnitError(ValueError):
    """A value could not be read; the message says what was expected."""


def parse_bytes(text: Union[str, int]) -> int:
    """'8GiB' -> 8589934592; '512M' -> 536870912; a bare integer is bytes."""
    if isinstance(text, bool):
        raise UnitError("expected a size such as 8GiB, got %r" % (text,))
    if isinstance(text, int):
        if text < 0:
            raise UnitError("a size cannot be negative: %d" % text)
        return text
    match = _SIZE_RE.match(str(text))
    if not match:
        raise UnitError("expected a size such as 8GiB or 512MiB, got %r" % (text,))
    number, unit = match.groups()
    factor = _SIZE_UNITS.get(unit.lower())
    if factor is None:
        raise UnitError(
            "unknown size unit %r in %r (use B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)" % (unit, text)
        )
    value = float(number) * factor
    if value != math.floor(value):
        raise UnitError("%r is not a whole number of bytes" % (text,))
    return int(value)


def format_bytes(value: int, precision: int = 1) -> str:
    """8589934592 -> '8GiB'; 5100273664 -> '4.8GiB'. Binary units, trailing zeros dropped."""
    if value < 0:
        return "-" + format_bytes(-value, precision)
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= factor:
            number = ("%.*f" % (precision, value / factor)).rstrip("0").rstrip(".")
            return number + unit
    return "%dB" % value


def parse_percent(text: Union[str, int, float]) -> float:
    """'30%' or '30' or 30 -> 30.0; must lie in [0, 100]."""
    if isinstance(text, bool):
        raise UnitError("expected a percentage such as 30%%, got %r" % (text,))
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        match = _PERCENT_RE.match(text)
        if not match:
            raise UnitError("expected a percentage such as 30%%, got %r" % (text,))
        value = float(match.group(1))
    if not 0.0 <= value <= 100.0:
        raise UnitError("a percentage must lie between 0%% and 100%%, got %r" % (text,))
    return value


def format_percent(value: float) -> str:
    """30.0 -> '30%'; 12.345 -> '12.3%'."""
    return ("%.1f" % value).rstrip("0").rstrip(".") + "%"


def parse_duration(text: Union[str, int, float]) -> float:
    """'1s' -> 1.0, '500ms' -> 0.5, '1h30m' -> 5400.0, '7d' -> 604800.0; a bare number is seconds."""
    if isinstance(text, bool):
        raise UnitError("expected a duration such as 1s or 7d, got %r" % (text,))
    if isinstance(text, (int, float)):
        if text < 0 or not math.isfinite(text):
            raise UnitError("a duration must be a non-negative number of seconds, got %r" % (text,))
        return float(text)
    compact = text.strip().lower().replace(" ", "")
    try:
        return parse_duration(float(compact))
    except ValueError:
        pass
    pos = 0
    total = 0.0
    for match in _DURATION_RE.finditer(compact):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _DURATION_UNITS[match.group(2)]
        pos = match.end()
    if pos != len(compact) or not compact:
        raise UnitError("expected a duration such as 500ms, 1s, 5m, 24h or 7d, got %r" % (text,))
    return total


def format_duration(seconds: float) -> str:
    """0.5 -> '500ms', 90 -> '1m30s', 86400 -> '1d'."""
    if seconds < 1:
        return "%dms" % round(seconds * 1000)
    remaining = round(seconds)
    parts = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if remaining >= size:
            parts.append("%d%s" % (remaining // size, unit))
            remaining %= size
    return "".join(parts[:2])
