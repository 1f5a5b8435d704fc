"""A simulated GPU fleet on loopback: real SSH servers (asyncssh) in one process, one port and one
simulated node backend per node, and the fleet.yaml, known_hosts and client key to reach them.

- `scenarios.py`: which nodes and teams, and a sim spec per node (`build_fleet`);
- `server.py`: the SSH servers (`SimFleetServer`);
- `runner.py`: the serving process and `launch()`/`stop()` for `gpuops sim up/down`.
"""

from __future__ import annotations

from gpuops.simfleet.runner import (
    Launched,
    SimFleetError,
    SimPaths,
    default_dir,
    launch,
    read_state,
    running_pid,
    stop,
)
from gpuops.simfleet.scenarios import SCENARIOS, ScenarioError, SimFleetPlan, SimNode, build_fleet

__all__ = [
    "SCENARIOS",
    "Launched",
    "ScenarioError",
    "SimFleetError",
    "SimFleetPlan",
    "SimNode",
    "SimPaths",
    "build_fleet",
    "default_dir",
    "launch",
    "read_state",
    "running_pid",
    "stop",
]
