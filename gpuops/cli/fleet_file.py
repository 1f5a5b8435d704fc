"""Loading fleet.yaml for a command: one located line and exit 1 when it is wrong. Kept apart
from cli/fleet.py (the live views) so that a command's `--help` loads no SSH client."""

from __future__ import annotations

from pathlib import Path

from gpuops.cli.errors import fail
from gpuops.spec import Fleet, SpecError, load_fleet


def load_or_fail(path: Path) -> Fleet:
    try:
        return load_fleet(str(path))
    except SpecError as exc:
        fail(str(exc).replace("\n", "\n       "))
