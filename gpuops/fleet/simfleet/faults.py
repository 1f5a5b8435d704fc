"""Faults injected into a simulated node's GPUs, to rehearse what apply does when hardware or the
agent fails half-way (docs/simulator.md, "Faults").

A fault is a small JSON file, `DIR/state/<node>/faults.json`, read by the node's backend on each
MIG call (never on the sampling path):

    {"op": "create_gpu_instance", "at": 3, "effect": "nvml_error", "code": "INSUFFICIENT_RESOURCES"}

`at`: the how-manieth call of `op` from now fires (1 = the next one). Effects:
- `nvml_error`: the call fails as NVML would, with `code` (one of backends.base.ERROR_CODES);
- `kill`: the agent serving the call dies there, as if SIGKILLed: its SSH session drops and
  nothing after that point runs (no rollback); the GPU keeps whatever was done so far, as real
  hardware does, and the node's MIG journal says what was under way.
A fault fires once, then its file is removed.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuops.core.atomic_file import atomic_write
from gpuops.node.backends.base import ERROR_CODES, BackendError

FAULTS_FILE = "faults.json"
OPS = ("create_gpu_instance", "create_compute_instance", "destroy_gpu_instance", "set_mig_mode")
EFFECTS = ("nvml_error", "kill")


class AgentKilled(BaseException):
    """The simulated agent dies here; nothing in the agent catches a BaseException."""


def inject(node_state_dir: Path, op: str, at: int, effect: str, code: str = "UNKNOWN") -> None:
    """Arm a fault for one simulated node (its state directory: DIR/state/<node>)."""
    if op not in OPS or effect not in EFFECTS or at < 1 or code not in ERROR_CODES:
        raise ValueError(f"bad fault: op {op!r}, at {at}, effect {effect!r}, code {code!r}")
    node_state_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps({"op": op, "at": at, "effect": effect, "code": code})
    atomic_write(node_state_dir / FAULTS_FILE, text, 0o666, umask=True, durable=False)


class FaultyBackend:
    """A simulated backend that fails where faults.json says; every other call passes through."""

    def __init__(self, backend: Any, node_state_dir: Path, on_kill: Callable[[], None] | None = None) -> None:
        self._backend = backend
        self._path = node_state_dir / FAULTS_FILE
        self.on_kill = on_kill

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def _check(self, op: str) -> None:
        try:
            fault = json.loads(self._path.read_text())
        except (OSError, ValueError):
            return
        if not isinstance(fault, dict) or fault.get("op") != op:
            return
        at = fault.get("at")
        if not isinstance(at, int) or at > 1:
            fault["at"] = (at if isinstance(at, int) else 2) - 1
            self._path.write_text(json.dumps(fault))
            return
        with contextlib.suppress(OSError):
            self._path.unlink()
        if fault.get("effect") == "kill":
            if self.on_kill is not None:
                self.on_kill()
            raise AgentKilled(f"injected: agent killed during {op}")
        code = fault.get("code") if fault.get("code") in ERROR_CODES else "UNKNOWN"
        raise BackendError(str(code), f"injected fault on {op}")

    def set_mig_mode(self, gpu: int, enabled: bool) -> Any:
        self._check("set_mig_mode")
        return self._backend.set_mig_mode(gpu, enabled)

    def create_gpu_instance(self, gpu: int, profile_id: int, start: int | None = None) -> Any:
        self._check("create_gpu_instance")
        return self._backend.create_gpu_instance(gpu, profile_id, start)

    def destroy_gpu_instance(self, gpu: int, gpu_instance_id: int) -> None:
        self._check("destroy_gpu_instance")
        self._backend.destroy_gpu_instance(gpu, gpu_instance_id)

    def create_compute_instance(self, gpu: int, gpu_instance_id: int, profile_id: int, *args: Any) -> Any:
        self._check("create_compute_instance")
        return self._backend.create_compute_instance(gpu, gpu_instance_id, profile_id, *args)
