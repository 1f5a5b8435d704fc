"""History on the node side alone (only gpuops/core and gpuops/node, no site packages), on this
Python and on Python 3.8 where one exists: what a pushed zipapp or a copied node side runs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpuops.core import protocol as proto
from gpuops.core.history import history_from_json
from tests.node.test_node_side_standalone import _node_tree, _python38


def _record_then_serve(python: str, root: Path, history: Path) -> dict[int, dict[str, object]]:
    boot = (
        f"import sys; sys.path.insert(0, {str(root)!r}); "
        "from gpuops.node.main import main; sys.exit(main(sys.argv[1:]))"
    )
    recorder = subprocess.Popen(
        [
            python,
            "-I",
            "-S",
            "-c",
            boot,
            "agent",
            "--record",
            "--backend",
            "sim",
            "--history-dir",
            str(history),
            "--record-interval",
            "0.1",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while not (history / "recorder.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)
    finally:
        recorder.terminate()
        _out, err = recorder.communicate(timeout=30)
    assert recorder.returncode == 0, err.decode()
    served = subprocess.run(
        [
            python,
            "-I",
            "-S",
            "-c",
            boot,
            "agent",
            "--stdio",
            "--backend",
            "sim",
            "--history-dir",
            str(history),
        ],
        input=proto.request(1, "history", {"resolution": "minute"}) + proto.request(2, "history"),
        capture_output=True,
        timeout=60,
    )
    assert served.returncode == 0, served.stderr.decode()
    return {m["id"]: m for m in map(json.loads, served.stdout.splitlines())}


def _check(replies: dict[int, dict[str, object]]) -> None:
    minute, hour = (history_from_json(replies[i]["result"]) for i in (1, 2))
    assert minute.buckets and hour.buckets and minute.recording
    assert sum(b.gpus[0].seconds for b in minute.buckets) == pytest.approx(
        sum(b.gpus[0].seconds for b in hour.buckets), abs=0.01
    )


def test_history_on_the_node_side_alone(tmp_path: Path) -> None:
    _check(_record_then_serve(sys.executable, _node_tree(tmp_path), tmp_path / "h"))


def test_history_on_python_3_8(tmp_path: Path) -> None:
    python = _python38()
    if python is None:
        pytest.skip("no Python 3.8 interpreter on this machine (vermin still checks the syntax)")
    _check(_record_then_serve(python, _node_tree(tmp_path), tmp_path / "h"))
