"""How figures look on screen: colours of the heat scales, short texts with units, sparklines.

Presentation only (no fleet logic): every function maps a value to text or a style.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.style import Style
from rich.text import Text

from gpuops.core.busy import BUSY_PERCENT
from gpuops.core.units import format_bytes, format_duration
from gpuops.fleet.source import CONNECTING, LIVE, STALE, UNREACHABLE
from gpuops.tui import theme
from gpuops.views import format as fmt

NA = fmt.NA

# Utilization: grey when idle (under BUSY_PERCENT, 5%: the waste to see), then greens, brighter
# when busier (theme.UTIL_SCALE): (below this percent, background, text).
UTIL_STEPS: tuple[tuple[float, str, str], ...] = tuple(
    (limit, bg, fg)
    for limit, (bg, fg) in zip((BUSY_PERCENT, 25.0, 50.0, 75.0, 90.0, 101.0), theme.UTIL_SCALE, strict=True)
)
# Memory in use: greys to blues (theme.MEM_SCALE).
MEM_STEPS: tuple[tuple[float, str, str], ...] = tuple(
    (limit, bg, fg)
    for limit, (bg, fg) in zip((5.0, 25.0, 50.0, 75.0, 90.0, 101.0), theme.MEM_SCALE, strict=True)
)


def cell_style(colours: tuple[str, str], bold: bool | None = None, italic: bool | None = None) -> Style:
    """A cell's style from the theme's (background, text)."""
    return Style(bgcolor=colours[0], color=colours[1], bold=bold, italic=italic)


NO_DATA = cell_style(theme.NO_DATA)
LOST_STYLE = cell_style(theme.LOST, bold=True)
FREE_STYLE = cell_style(theme.UNCARVED, italic=True)
SLICE_BUSY = cell_style(theme.SLICE_BUSY)
SLICE_IDLE = cell_style(theme.SLICE_IDLE)
# Held idle: memory or processes on capacity doing no work (under 5%): it looks taken, so it
# gets a colour no utilization has.
HELD_STYLE = cell_style(theme.HELD_CELL, bold=True)
HELD_TEXT = f"bold {theme.HELD}"

STATE_COLOUR = {
    LIVE: theme.LIVE,
    STALE: theme.STALE,
    UNREACHABLE: theme.UNREACHABLE,
    CONNECTING: theme.CONNECTING,
}
STATE_GLYPH = {LIVE: "●", STALE: "◐", UNREACHABLE: "✖", CONNECTING: "○"}

_util_cache: dict[int, Style] = {}
_mem_cache: dict[int, Style] = {}


def _step(value: float, steps: tuple[tuple[float, str, str], ...], cache: dict[int, Style]) -> Style:
    key = int(value)
    style = cache.get(key)
    if style is None:
        for limit, bg, fg in steps:
            if value < limit:
                style = Style(bgcolor=bg, color=fg)
                break
        else:
            bg, fg = steps[-1][1], steps[-1][2]
            style = Style(bgcolor=bg, color=fg)
        cache[key] = style
    return style


def util_style(percent: float | None) -> Style:
    return NO_DATA if percent is None else _step(percent, UTIL_STEPS, _util_cache)


def mem_style(percent: float | None) -> Style:
    return NO_DATA if percent is None else _step(percent, MEM_STEPS, _mem_cache)


def pct3(value: float | None) -> str:
    """A percentage in exactly 3 columns, for grid cells: ' 96', '100', '  -'."""
    if value is None:
        return "  -"
    return f"{min(999, round(value)):3d}"


def mem3(value: float | None) -> str:
    """A memory percentage in 3 columns that never run into the utilization before it: a full
    GPU is 'MAX' (as nvitop writes it), not '100', which beside ' 96' would read '96100'."""
    if value is not None and round(value) >= 100:
        return "MAX"
    return pct3(value)


def percent(value: float | None) -> str:
    return NA if value is None else f"{value:.0f}%"


def size(value: int | None) -> str:
    return NA if value is None else format_bytes(value)


def share(used: int, total: int) -> str:
    """'85% of 640GiB'."""
    return f"{100 * used / total:.0f}% of {format_bytes(total)}" if total else NA


def gpus(value: float) -> str:
    """GPU-equivalents: '8', '3.6', '0'."""
    if abs(value - round(value)) < 0.05:
        return str(round(value))
    return f"{value:.1f}"


def count(n: int, noun: str) -> str:
    """'1 node', '8 nodes', '1 GPU', '48 GPUs'."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def age(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    return format_duration(seconds)


def state_text(state: str, age_seconds: float | None = None) -> Text:
    colour = STATE_COLOUR.get(state, "")
    text = Text(f"{STATE_GLYPH.get(state, '?')} {state}", style=colour)
    if state in (STALE, UNREACHABLE) and age_seconds is not None:
        text.append(f" {age(age_seconds)}", style=colour)
    return text


SPARK = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int, top: float | None = None, span: int | None = None) -> str:
    """The last `width` buckets of a series as block characters, scaled to `top` (default: max).
    Longer series are averaged into `width` buckets; an empty series gives spaces. `span`: the
    points the whole time shown has, when the series holds only its last ones (a team that
    appeared later in the session): it then takes its share of the width, right-aligned, blank
    before, instead of being stretched over all of it."""
    if width <= 0:
        return ""
    if not values:
        return " " * width
    if span is not None and span > width and len(values) < span:
        width_now = max(1, round(len(values) * width / span))
        return sparkline(values, width_now, top).rjust(width)
    n = len(values)
    if n > width:
        buckets = []
        for i in range(width):
            lo, hi = i * n // width, (i + 1) * n // width
            chunk = values[lo:hi] or values[lo : lo + 1]
            buckets.append(sum(chunk) / len(chunk))
    else:
        buckets = list(values)
    peak = top if top is not None else max(buckets)
    if peak <= 0:
        line = SPARK[0] * len(buckets)
    else:
        line = "".join(
            SPARK[min(len(SPARK) - 1, max(0, round(v / peak * (len(SPARK) - 1))))] for v in buckets
        )
    return line.rjust(width)
