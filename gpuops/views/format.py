"""Turning model values into short, unit-carrying strings for tables (CLI and TUI)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpuops.core.model import GpuInstance, NotAvailable
from gpuops.core.units import format_bytes, format_percent

NA = "n/a"


def metric(value: Any, fmt: Callable[[Any], str]) -> str:
    if value is None or isinstance(value, NotAvailable):
        return NA
    return fmt(value)


def percent(value: Any) -> str:
    return metric(value, lambda v: format_percent(float(v)))


def size(value: Any) -> str:
    return metric(value, lambda v: format_bytes(int(v)))


def watts(value: Any) -> str:
    return metric(value, lambda v: f"{float(v):.0f} W")


def celsius(value: Any) -> str:
    return metric(value, lambda v: f"{float(v):.0f} °C")


def mhz(value: Any) -> str:
    return metric(value, lambda v: f"{int(v)} MHz")


def memory_usage(used: Any, total: Any) -> str:
    if isinstance(used, NotAvailable) or isinstance(total, NotAvailable) or not total:
        return f"{size(used)} / {size(total)}"
    return f"{size(used)} / {size(total)} ({format_percent(100.0 * used / total)})"


def slice_range(gi: GpuInstance) -> str:
    last = gi.start + gi.size - 1
    return f"slice {gi.start}" if gi.size == 1 else f"slices {gi.start}-{last}"


def slice_map(instances: tuple[GpuInstance, ...], slices: int) -> str:
    """'[A A B . C C C C]': which GI holds each memory slice, by letter in listing order."""
    cells = ["."] * slices
    for n, gi in enumerate(sorted(instances, key=lambda g: g.start)):
        for s in range(gi.start, min(gi.start + gi.size, slices)):
            cells[s] = chr(ord("A") + n % 26)
    return "[" + " ".join(cells) + "]"
