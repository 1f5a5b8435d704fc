"""How figures look on screen (gpuops.tui.render)."""

from __future__ import annotations

from gpuops.tui import render


def test_sparkline() -> None:
    assert render.sparkline([], 4) == "    "
    assert render.sparkline([0, 50, 100], 3, 100) == "▁▅█"
    assert render.sparkline([1.0] * 100, 10) == "█" * 10
    assert len(render.sparkline(list(range(1000)), 7)) == 7
    assert render.sparkline([5, 5], 4, 10) == "  ▅▅"
