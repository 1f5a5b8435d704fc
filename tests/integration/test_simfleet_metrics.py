"""`gpuops sim up` starts an exporter per simulated node; `gpuops sim status --json` says where."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.agent_helpers import REPO
from tests.integration.metrics_helpers import one, parse, promtool_problems, scrape


def _gpuops(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args], capture_output=True, text=True, timeout=120, cwd=REPO
    )


def _status(directory: Path) -> tuple[int, dict[str, Any]]:
    result = _gpuops("sim", "status", "--dir", str(directory), "--json")
    return result.returncode, json.loads(result.stdout)


def test_each_simulated_node_serves_its_metrics(tmp_path: Path) -> None:
    directory = tmp_path / "sim"
    up = _gpuops("sim", "up", "--dir", str(directory), "--nodes", "3")
    assert up.returncode == 0, up.stderr
    try:
        code, status = _status(directory)
        assert code == 0 and status["state"] == "running"
        nodes = status["nodes"]
        assert len(nodes) == 3
        urls = [n["metrics_url"] for n in nodes]
        assert len(set(urls)) == 3
        assert all(u.startswith("http://127.0.0.1:") and u.endswith("/metrics") for u in urls)
        before = {n["name"]: parse(scrape(n["metrics_url"])) for n in nodes}
        discovered = _gpuops("discover", "-f", status["fleet"], "--json")
        assert discovered.returncode == 0, discovered.stderr
        texts = {n["name"]: scrape(n["metrics_url"]) for n in nodes}
    finally:
        down = _gpuops("sim", "down", "--dir", str(directory))
    assert down.returncode == 0, down.stderr
    after = {name: parse(text) for name, text in texts.items()}
    fleet = {n["name"]: n for n in json.loads(discovered.stdout)["nodes"]}
    for name, series in after.items():
        node = fleet[name]
        assert node["state"] == "live"
        assert one(series, "gpuops_node_up", node=name) == 1.0
        gpus = node["sample"]["gpus"]
        assert len(series["gpuops_gpu_info"]) == len(gpus)
        for gpu in gpus:
            labels = {"node": name, "gpu": str(gpu["info"]["index"]), "UUID": gpu["info"]["uuid"]}
            info = one(
                series,
                "gpuops_gpu_info",
                modelName=gpu["info"]["name"],
                pci_bus_id=gpu["info"]["pci_bus_id"],
                driver_version=node["inventory"]["driver_version"],
                **labels,
            )
            assert info == 1.0
            total = one(series, "gpuops_gpu_memory_total_bytes", **labels)
            assert total == gpu["sample"]["memory_total_bytes"]
            # discover's sample lies between the exporter's samples before and after it
            # (within one sample each way).
            used = [one(s[name], "gpuops_gpu_memory_used_bytes", **labels) for s in (before, after)]
            assert used[0] is not None and used[1] is not None
            assert min(used) <= gpu["sample"]["memory_used_bytes"] <= max(used), (name, labels, used)
        problems = promtool_problems(texts[name])
        assert not problems, problems
    code, status = _status(directory)
    assert code == 1 and status == {
        "state": "stopped",
        "dir": str(directory),
        "pid": None,
        "nodes": [],
        "prometheus_url": None,
    }
