"""fleet.yaml: the inventory of GPU nodes, the teams that own them and how to reach them.

    fleet = load_fleet("fleet.yaml")          # raises SpecError (.errors: list[SpecIssue])
    fleet.ssh_settings("gpu-a-01")            # SshSettings: host, port, user, jump, timeouts, ...
    fleet.agent_settings("gpu-a-01")          # AgentSettings: mode, python, backend, sim_spec
    fleet.gpu_owner("gpu-a-01", 4)            # 'nlp'
    fleet.team_of_user("alice", groups=["cv"])
    fleet.nodes_matching("gpu-a-*,zone=a")
    fleet.desired_for("gpu-a-01", 0, uuid, "NVIDIA H100 80GB HBM3")   # DesiredGpu(mig=, mps=, limiter=)
    text = dump_fleet(fleet)                  # YAML that load_fleet reads back equal

The format is documented in docs/fleet-yaml.md. Modules by role: `model.py` (the file's top
level, nodes, teams), `carve_entry.py` (a carve: entry's YAML shape), `desired.py` (what it
resolves to per kind), `mig_solve.py` (a mig: layout solved for a model), `resolve.py` (which
entries select a GPU), `rules.py`, `carve_checks.py` and `checks.py` (rules), `desired_gpu.py`
(plan time: one live GPU), `loader.py`, `dump.py`, `migparted.py`.
"""

from __future__ import annotations

from gpuops.spec.carve_entry import (
    CarveEntry,
    GpuSelect,
    LimiterSpec,
    LimiterTenantSpec,
    MigSpec,
    MpsSpec,
    Select,
)
from gpuops.spec.desired import (
    DesiredLimiter,
    DesiredMig,
    DesiredMps,
    DesiredMpsTenant,
)
from gpuops.spec.desired_gpu import DesiredGpu
from gpuops.spec.dump import dump_fleet
from gpuops.spec.errors import SpecError, SpecIssue
from gpuops.spec.loader import check_fleet, fleet_from_data, load_fleet, parse_fleet
from gpuops.spec.mig_solve import SolvedInstance, SolvedLayout, solve_layout
from gpuops.spec.model import (
    AgentOptions,
    AgentSettings,
    Fleet,
    JumpHost,
    JumpSettings,
    NodeEntry,
    SshDefaults,
    SshOptions,
    SshSettings,
    Team,
)
from gpuops.spec.schema import fleet_json_schema
from gpuops.spec.selectors import (
    LabelTerm,
    Selector,
    SelectorError,
    format_gpu_indices,
    parse_gpu_indices,
    parse_selector,
)
from gpuops.spec.types import SPEC_VERSION

__all__ = [
    "SPEC_VERSION",
    "AgentOptions",
    "AgentSettings",
    "CarveEntry",
    "DesiredGpu",
    "DesiredLimiter",
    "DesiredMig",
    "DesiredMps",
    "DesiredMpsTenant",
    "Fleet",
    "GpuSelect",
    "JumpHost",
    "JumpSettings",
    "LabelTerm",
    "LimiterSpec",
    "LimiterTenantSpec",
    "MigSpec",
    "MpsSpec",
    "NodeEntry",
    "Select",
    "Selector",
    "SelectorError",
    "SolvedInstance",
    "SolvedLayout",
    "SpecError",
    "SpecIssue",
    "SshDefaults",
    "SshOptions",
    "SshSettings",
    "Team",
    "check_fleet",
    "dump_fleet",
    "fleet_from_data",
    "fleet_json_schema",
    "format_gpu_indices",
    "load_fleet",
    "parse_fleet",
    "parse_gpu_indices",
    "parse_selector",
    "solve_layout",
]
