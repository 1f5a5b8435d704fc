"""The layer contracts of docs/architecture.md (pyproject.toml, [tool.importlinter]) are enforced:
`make lint` runs lint-imports, and an import that breaks a layer makes it fail."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(tree))  # this copy of gpuops, not the installed one
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"], cwd=tree, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "gpuops", tmp_path / "gpuops", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_its_contracts(tree: Path) -> None:
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_tui_contract_lists_every_fleet_module_but_the_source_protocol() -> None:
    """import-linter cannot forbid a package but one of its modules: the `tui` contract lists
    fleet/'s modules one by one, so a new one must be added there."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["id"] == "tui")
    fleet = ROOT / "gpuops" / "fleet"
    modules = {p.stem for p in fleet.glob("*.py") if p.stem != "__init__"}
    modules |= {p.parent.name for p in fleet.glob("*/__init__.py")}
    listed = {
        m.removeprefix("gpuops.fleet.")
        for m in contract["forbidden_modules"]
        if m.startswith("gpuops.fleet.")
    }
    assert listed == modules - {"source"}


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("gpuops/core/leak.py", "import gpuops.fleet.ssh\n", "core/ is the base"),
        ("gpuops/node/leak.py", "from gpuops.spec import Fleet\n", "node/ ships alone"),
        # an upward import inside node/: the history store reaching back into the agent
        ("gpuops/node/history/recorder.py", "from gpuops.node.agent import Agent\n", "node/ inside"),
        ("gpuops/tui/leak.py", "from gpuops.node.agent import Agent\n", "through the protocol only"),
        ("gpuops/fleet/leak.py", "from gpuops.plan import apply\n", "operator layers"),
        ("gpuops/fleet/leak.py", "from gpuops.views.grid import Group\n", "operator layers"),
        ("gpuops/views/leak.py", "from gpuops.tui import render\n", "operator layers"),
        ("gpuops/node/leak.py", "import gpuops.views.format\n", "node/ ships alone"),
        # the seam has no exceptions: no operator module but the simulator's reaches into node/
        (
            "gpuops/fleet/leak.py",
            "from gpuops.node.backends.sim import SimBackend\n",
            "through the protocol only",
        ),
        (
            "gpuops/views/leak.py",
            "from gpuops.node.health import HealthMonitor\n",
            "through the protocol only",
        ),
        # the simulator is a layer of its own: above node/ and fleet/, beside tui/ and exporter/
        ("gpuops/node/leak.py", "from gpuops.simfleet import build_fleet\n", "node/ ships alone"),
        ("gpuops/core/leak.py", "import gpuops.simfleet.scenarios\n", "core/ is the base"),
        ("gpuops/fleet/leak.py", "from gpuops.simfleet.source import SimSource\n", "operator layers"),
        ("gpuops/tenancy/leak.py", "from gpuops.simfleet import SimFleetPlan\n", "operator layers"),
        ("gpuops/tui/leak.py", "from gpuops.simfleet import launch\n", "operator layers"),
        # spec/ checks attributor names against the registry below it, not against tenancy/
        ("gpuops/spec/leak.py", "from gpuops.tenancy import load_attributor\n", "operator layers"),
        ("gpuops/attributors.py", "from gpuops.spec import Fleet\n", "operator layers"),
        ("gpuops/core/leak.py", "from gpuops.attributors import BUILTIN\n", "core/ is the base"),
        # tui/ draws view models: views/ and the source protocol, nothing else of the operator side
        ("gpuops/tui/leak.py", "from gpuops.tenancy.ownership import UNOWNED\n", "tui/ draws view models"),
        ("gpuops/tui/leak.py", "from gpuops.fleet.collector import Collector\n", "tui/ draws view models"),
        ("gpuops/tui/leak.py", "import gpuops.fleet.promql.source\n", "tui/ draws view models"),
        ("gpuops/tui/screens/leak.py", "from gpuops.plan.model import Plan\n", "tui/ draws view models"),
        ("gpuops/tui/leak.py", "from gpuops.spec import Fleet\n", "tui/ draws view models"),
    ],
)
def test_a_layer_violation_fails_the_lint(tree: Path, module: str, line: str, contract: str) -> None:
    (tree / module).write_text(line)
    result = _lint(tree)
    assert result.returncode != 0
    broken = result.stdout.split("Broken contracts", 1)[-1]
    assert contract in broken and "BROKEN" in result.stdout, result.stdout
