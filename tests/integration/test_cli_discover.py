"""`gpuops discover --local` as a user runs it: a real process, a real local agent."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.agent_helpers import REPO


def _gpuops(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


def test_sim_table_shows_gpus_mig_and_processes() -> None:
    result = _gpuops("discover", "--local", "--backend", "sim")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "backend sim" in out
    assert "A100" in out or "H100" in out
    assert "GI " in out  # at least one MIG instance in the demo node
    assert "Processes" in out


def test_sim_json_is_the_model() -> None:
    result = _gpuops("discover", "--local", "--backend", "sim", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    assert document["backend"] == "sim"
    assert document["gpus"]
    for gpu in document["gpus"]:
        assert gpu["sample"]["timestamp"] > 0
        assert {"index", "uuid", "name", "pci_bus_id"} <= set(gpu["info"])


def test_without_nvml_it_says_what_to_do() -> None:
    # An empty library path makes sure no real driver is found, even on a GPU machine.
    result = _gpuops("discover", "--local", env={"GPUOPS_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1"})
    assert result.returncode == 1
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "NVML is unavailable" in lines[0]
    assert "--backend sim" in lines[0]


def test_bad_sim_spec_is_one_line(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spec = tmp_path / "broken.json"
    spec.write_text('{"gpus": [{"model": "A100-41GB"}]}')
    result = _gpuops("discover", "--local", "--backend", "sim", "--sim-spec", str(spec))
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "A100-41GB" in result.stderr


def test_discover_needs_a_target() -> None:
    result = _gpuops("discover")
    assert result.returncode == 2
    assert "--local" in result.stderr


def test_node_text_that_looks_like_markup_is_shown_as_it_is(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # A process's command line is the node's text, not rich markup: '[/oops]' once crashed the
    # table (MarkupError traceback) and '[bold]' would have been swallowed.
    spec = tmp_path / "node.json"
    command = "train [/oops] [bold]x[/bold]"
    spec.write_text(
        json.dumps(
            {
                "version": 1,
                "gpus": [{"model": "A100-SXM4-40GB"}],
                "workloads": [
                    {"name": "w", "kind": "training", "user": "alice", "gpu": 0, "command": command}
                ],
            }
        )
    )
    result = _gpuops("discover", "--local", "--backend", "sim", "--sim-spec", str(spec))
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert command in result.stdout
