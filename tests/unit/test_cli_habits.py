"""What a shell user expects of any command (issue 18 item 8): `--version`, `-h` as `--help` on
every command, and help that shows a value placeholder only for options that take a value."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import gpuops

REPO = Path(__file__).resolve().parents[2]


def _gpuops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": "120", "NO_COLOR": "1", "TERM": "dumb"},
    )


def test_version_prints_name_and_version() -> None:
    done = _gpuops("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"gpuops {gpuops.__version__}\n"


@pytest.mark.parametrize("args", [("-h",), ("discover", "-h"), ("sim", "up", "-h")])
def test_short_help_is_help(args: tuple[str, ...]) -> None:
    short, long = _gpuops(*args), _gpuops(*args[:-1], "--help")
    assert short.returncode == 0, short.stderr
    assert short.stdout == long.stdout
    assert "Usage:" in short.stdout


def _option_rows(help_text: str) -> dict[str, str]:
    """Each option's row of a rich help panel: its long name to the rest of the row."""
    rows = {}
    for line in help_text.splitlines():
        found = re.match(r"[│|]\s+(--[\w-]+)(.*)", line)
        if found:
            rows[found.group(1)] = found.group(2)
    return rows


def test_flags_show_no_value_and_values_show_click_metavars() -> None:
    rows = _option_rows(_gpuops("discover", "--help").stdout)
    for flag in ("--local", "--json", "--help"):
        # A flag's row goes from its name (and short name) straight to its help text.
        assert re.match(r"\s+(-\w\s+)?[A-Z]", rows[flag]), rows[flag]
    assert re.match(r"\s+TEXT\s", rows["--backend"]), rows["--backend"]
    assert re.match(r"\s+-f\s+PATH\s", rows["--fleet"]), rows["--fleet"]
    assert re.match(r"\s+FLOAT\s", rows["--timeout"]), rows["--timeout"]
    assert "<bool>" not in _gpuops("sim", "up", "--help").stdout
    assert "<str>" not in _gpuops("--help").stdout
