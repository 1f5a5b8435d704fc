"""The NVML backend and the agent against a real driver: compared with nvidia-smi's own view."""

from __future__ import annotations

import json
import subprocess
import sys

from gpuops.core.model import NotAvailable
from gpuops.node.backends.nvml import NvmlBackend


def _smi(query: str) -> list[list[str]]:
    out = subprocess.run(
        ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return [[field.strip() for field in line.split(",")] for line in out.strip().splitlines()]


def test_inventory_matches_nvidia_smi() -> None:
    backend = NvmlBackend()
    try:
        node = backend.inventory()
        sample = backend.sample()
    finally:
        backend.close()
    rows = _smi("index,uuid,name,memory.total,mig.mode.current")
    assert len(node.gpus) == len(rows)
    for gpu, (index, uuid, name, mem_mib, _mig) in zip(node.gpus, rows, strict=True):
        assert gpu.info.index == int(index)
        assert gpu.info.uuid == uuid
        assert gpu.info.name == name
        assert not isinstance(gpu.info.memory_total_bytes, NotAvailable)
        assert abs(gpu.info.memory_total_bytes / 2**20 - int(mem_mib)) <= 1
    for gpu in sample.gpus:
        assert gpu.sample is not None
        assert not isinstance(gpu.sample.memory_used_bytes, NotAvailable)
        assert not isinstance(gpu.sample.temperature_celsius, NotAvailable)


def test_discover_local_on_the_real_gpu() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpuops", "discover", "--local", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert document["backend"] == "nvml"
    assert len(document["gpus"]) == len(_smi("index"))
