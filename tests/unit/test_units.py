from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops.core.units import (
    UnitError,
    format_bytes,
    format_duration,
    format_percent,
    parse_bytes,
    parse_duration,
    parse_percent,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8GiB", 8 * 1024**3),
        ("8gib", 8 * 1024**3),
        ("512MiB", 512 * 1024**2),
        ("512M", 512 * 1024**2),  # MPS / HAMi-core style single letters are binary
        ("1G", 1024**3),
        ("10GB", 10 * 1000**3),
        ("1.5GiB", 1536 * 1024**2),
        ("4096", 4096),
        (" 2 KiB ", 2048),
        (123, 123),
    ],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "8 GiBs", "-1GiB", "8XB", "1.3B", "eight", True, -5])
def test_parse_bytes_rejects(text: object) -> None:
    with pytest.raises(UnitError):
        parse_bytes(text)  # type: ignore[arg-type]


def test_format_bytes() -> None:
    assert format_bytes(8 * 1024**3) == "8GiB"
    assert format_bytes(4864 * 1024**2) == "4.8GiB"
    assert format_bytes(512) == "512B"
    assert format_bytes(1536 * 1024) == "1.5MiB"


@given(st.integers(min_value=0, max_value=2**50))
def test_format_parse_round_trip_is_close(value: int) -> None:
    # Printing rounds to one decimal; reading it back must land within that rounding.
    back = parse_bytes(format_bytes(value, precision=3)) if "." not in format_bytes(value, 3) else None
    if back is not None:
        assert back == value or abs(back - value) / max(value, 1) < 0.001


def test_percent() -> None:
    assert parse_percent("30%") == 30.0
    assert parse_percent("30") == 30.0
    assert parse_percent(12.5) == 12.5
    assert format_percent(30.0) == "30%"
    assert format_percent(12.345) == "12.3%"
    for bad in ["101%", "-1%", "x%", "", True]:
        with pytest.raises(UnitError):
            parse_percent(bad)  # type: ignore[arg-type]


def test_duration() -> None:
    assert parse_duration("1s") == 1.0
    assert parse_duration("500ms") == 0.5
    assert parse_duration("1h30m") == 5400.0
    assert parse_duration("7d") == 7 * 86400
    assert parse_duration("2.5") == 2.5
    assert format_duration(0.5) == "500ms"
    assert format_duration(90) == "1m30s"
    assert format_duration(86400) == "1d"
    for bad in ["", "1x", "s", "1s2", "-1s", True]:
        with pytest.raises(UnitError):
            parse_duration(bad)  # type: ignore[arg-type]


@given(st.text(max_size=20))
def test_parsers_never_raise_anything_but_unit_error(text: str) -> None:
    for parser in (parse_bytes, parse_percent, parse_duration):
        with contextlib.suppress(UnitError):
            parser(text)
