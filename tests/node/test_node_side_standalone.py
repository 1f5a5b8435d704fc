"""The node side runs alone: only gpuops/core and gpuops/node copied, on the oldest Python we promise.

This is what a node that never had gpuops installed gets (the fleet pushes exactly these files),
so an accidental import of fleet/, cli/ or a third-party package from node/ fails here.
"""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuops.core import protocol as proto
from tests.agent_helpers import REPO


def _node_tree(tmp_path: Path) -> Path:
    root = tmp_path / "node-side"
    pkg = root / "gpuops"
    pkg.mkdir(parents=True)
    shutil.copy(Path(REPO, "gpuops", "__init__.py"), pkg / "__init__.py")
    for part in ("core", "node"):
        shutil.copytree(Path(REPO, "gpuops", part), pkg / part, ignore=shutil.ignore_patterns("__pycache__"))
    return root


def _python38() -> str | None:
    candidates = [
        shutil.which("python3.8"),
        "/usr/bin/python3.8",
        *glob.glob("/root/.pyenv/versions/3.8*/bin/python3.8"),
    ]
    for candidate in candidates:
        if not candidate:
            continue
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=20,
            )
        except OSError:
            continue
        if out.returncode == 0 and out.stdout.strip() == "3.8":
            return candidate
    return None


def _run(python: str, root: Path, code: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    # -I -S: no PYTHONPATH, no user or site packages (so not the venv's installed gpuops either);
    # the copied tree is the only place gpuops can come from.
    bootstrap = f"import sys; sys.path.insert(0, {str(root)!r}); " + code
    return subprocess.run([python, "-I", "-S", "-c", bootstrap], input=stdin, capture_output=True, timeout=60)


def _talk(python: str, root: Path) -> list[dict[str, object]]:
    where = _run(python, root, "import gpuops.node.agent, gpuops; print(gpuops.__file__)")
    assert where.returncode == 0, where.stderr.decode()
    assert where.stdout.decode().startswith(str(root)), where.stdout
    serve = "from gpuops.node.main import main; sys.exit(main(['agent', '--stdio', '--backend', 'sim']))"
    out = _run(python, root, serve, proto.request(1, "hello") + proto.request(2, "sample"))
    assert out.returncode == 0, out.stderr.decode()
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_node_side_alone_serves_with_this_python(tmp_path: Path) -> None:
    replies = {m["id"]: m for m in _talk(sys.executable, _node_tree(tmp_path))}
    assert replies[1]["ok"] and replies[2]["ok"], replies


def test_node_side_alone_serves_with_python_3_8(tmp_path: Path) -> None:
    python = _python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine (vermin still checks the syntax)")
    replies = {m["id"]: m for m in _talk(python, _node_tree(tmp_path))}
    assert replies[1]["ok"] and replies[1]["result"]["python"].startswith("3.8"), replies
    assert replies[2]["ok"], replies
