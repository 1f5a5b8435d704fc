"""Debian's ``promtool``: lint an exposition, check and unit-test rule files.

Each call returns the finished process (exit status, stdout, stderr) so a test can show
promtool's own words when it fails; every run is bounded (60 s).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path

from tests.promtest.prometheus import INSTALL_HINT

PROMTOOL = "/usr/bin/promtool"


@cache
def promtool_binary() -> str | None:
    if os.access(PROMTOOL, os.X_OK):
        return PROMTOOL
    return shutil.which("promtool")


def promtool_unavailable_reason() -> str | None:
    """Why promtool cannot run here (a skip reason), or None when it can."""
    if promtool_binary() is None:
        return f"Debian's prometheus is not installed ({PROMTOOL} missing); {INSTALL_HINT}"
    return None


def promtool(
    *args: str, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    binary = promtool_binary()
    if binary is None:
        raise RuntimeError(promtool_unavailable_reason())
    return subprocess.run(
        [binary, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False, cwd=cwd
    )


def check_metrics(exposition: str | bytes) -> subprocess.CompletedProcess[str]:
    """``promtool check metrics`` on an exposition: exit 0 clean, 3 with lint problems (on stdout)."""
    text = exposition.decode() if isinstance(exposition, bytes) else exposition
    return promtool("check", "metrics", stdin=text)


def check_rules(*files: Path) -> subprocess.CompletedProcess[str]:
    """``promtool check rules``: syntax, PromQL, templates, duplicate names."""
    return promtool("check", "rules", *(str(f) for f in files))


def test_rules(*files: Path) -> subprocess.CompletedProcess[str]:
    """``promtool test rules``: the unit tests' input series, expected alerts and recorded values.

    Run from the tests file's directory, as promtool resolves ``rule_files`` relative to it.
    """
    first = Path(files[0]).resolve()
    return promtool("test", "rules", *(str(Path(f).resolve()) for f in files), cwd=first.parent)


# pytest would collect a module-level function named test_*; this one is a helper.
test_rules.__test__ = False  # type: ignore[attr-defined]


# dcgm-exporter's `modelName` label (docs/metrics.md keeps it so dashboards written for dcgm-exporter
# join unchanged) is the one camelCase name promtool's lint reports; any other problem is one.
ACCEPTED_CAMEL_CASE = frozenset({"modelName"})
_CAMEL_LINT = "label names should be written in 'snake_case' not 'camelCase'"


def lint_problems(exposition: str | bytes) -> list[str]:
    """``promtool check metrics`` problems, less the camelCase lint that ``modelName`` earns.

    The label names written camelCase are checked here instead, so no other one slips through.
    """
    text = exposition.decode() if isinstance(exposition, bytes) else exposition
    labels = set(re.findall(r"[{,]([A-Za-z_][A-Za-z0-9_]*)=", text))
    problems = [f"label {name} is camelCase" for name in sorted(labels) if re.search(r"[a-z][A-Z]", name)]
    problems = [p for p in problems if p.split()[1] not in ACCEPTED_CAMEL_CASE]
    result = check_metrics(text)
    lines = (result.stdout + result.stderr).splitlines()
    problems += [line for line in lines if line.strip() and not line.endswith(_CAMEL_LINT)]
    if result.returncode not in (0, 3) or (result.returncode == 3 and not lines):
        problems.append(f"promtool check metrics exited {result.returncode}")
    return problems
