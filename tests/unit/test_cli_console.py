"""Command output captured without a terminal (a script, cron, CI) keeps wide tables readable."""

from __future__ import annotations

import os
import subprocess
import sys

PROGRAM = """
from rich.table import Table
from gpuops.cli.console import CliConsole
table = Table()
for i in range(12):
    table.add_column(f"Column {i}")
table.add_row(*[f"value-{i:03d}" for i in range(12)])
CliConsole().print(table)
"""


def run(columns: str | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = columns
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return done.stdout


def test_no_terminal_gives_wide_tables() -> None:
    out = run(None)
    width = max(len(line) for line in out.splitlines())
    assert 80 < width <= 160, out
    assert "…" not in out and all(f"value-{i:03d}" in out for i in range(12))


def test_columns_in_the_environment_still_decides() -> None:
    out = run("60")
    assert max(len(line) for line in out.splitlines()) <= 60
    assert "…" in out  # rich cuts the cells to fit, as asked
