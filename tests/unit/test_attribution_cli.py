"""`gpuops discover --local` shows each process's tenant and its source, through a real local
agent over the simulated backend: without a fleet.yaml the limiter's label, else the GPU's owner,
else unattributed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SPEC = {
    "hostname": "sim-local",
    "users": {"alice": 1001, "bob": 1002, "eve": 1003},
    "groups": {"linguists": ["eve"]},
    "tenants": {"vision": ["alice"], "nlp": ["bob"]},
    "gpus": [
        {"model": "A100-SXM4-40GB", "count": 1, "owner": "vision"},
        {"model": "A100-SXM4-40GB", "count": 1},
    ],
    "workloads": [
        {"name": "limited", "kind": "training", "tenant": "nlp", "user": "bob", "gpu": 0, "limiter": True},
        {"name": "owned", "kind": "training", "user": "eve", "gpu": 0},
        {"name": "stray", "kind": "training", "user": "eve", "gpu": 1},
    ],
}


def test_discover_local_tenant_column(tmp_path: Path) -> None:
    spec = tmp_path / "node.json"
    spec.write_text(json.dumps(SPEC))
    done = subprocess.run(
        [sys.executable, "-m", "gpuops", "discover", "--local", "--backend", "sim", "--sim-spec", str(spec)],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert done.returncode == 0, done.stderr
    rows = {}
    for line in done.stdout.splitlines():
        cells = [c.strip() for c in line.split("│")[1:-1]]
        if len(cells) == 7 and cells[2].isdigit():  # GPU, MIG, PID, User, Tenant, Memory, Command
            rows[(cells[0], cells[3])] = cells[4]
    assert rows == {("0", "bob"): "nlp (limiter)", ("0", "eve"): "vision (owner)", ("1", "eve"): "- (none)"}
