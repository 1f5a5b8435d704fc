"""A plan: per node and GPU, what `apply` will change, what it disrupts, and the live state it was
made from. Saved as JSON (`gpuops plan -o plan.json`, plan/saved.py) and read back by
`gpuops apply --plan` (plan/document.py)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from gpuops.core.codec import to_json
from gpuops.core.protocol import MigChange, MpsSettings, PartitionChange
from gpuops.core.tenant_table import TenantSpec

PLAN_FORMAT = "gpuops-plan"
PLAN_VERSION = 2  # 2: the document carries a digest of itself (plan/saved.py)

MIG, MPS, LIMITER, PARTITION = "mig", "mps", "limiter", "partition"
ADD, CHANGE, REMOVE = "+", "~", "-"


class PlanError(ValueError):
    """A saved plan that cannot be used; the message says why (and where)."""


class PayloadError(PlanError):
    """A payload of a saved plan that its type's checks refuse (core/protocol.py: what the node
    would refuse), located in the plan. Said once the file's digest is known to match: an edit
    nobody signed is an edit first (plan/saved.py)."""


@dataclass(frozen=True)
class Proc:
    """A process that an action would stop."""

    pid: int
    user: str = ""
    command: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "user": self.user, "command": self.command}

    def __str__(self) -> str:
        who = self.user or "?"
        return f"pid {self.pid} ({who}{', ' + self.command if self.command else ''})"


@dataclass(frozen=True)
class Action:
    """One line of the plan: `marker` + `text`; `disruptive` when running work is affected or a
    daemon restarts (MIG mode change, destroyed instances, MPS daemon restart or stop)."""

    kind: str  # mig | mps | limiter | partition
    marker: str  # + ~ -
    text: str
    disruptive: bool = False
    processes: tuple[Proc, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "marker": self.marker,
            "text": self.text,
            "disruptive": self.disruptive,
            "processes": [p.to_json() for p in self.processes],
        }


# ---- payloads: what apply sends to a GPU's node, saved in the plan as they will be sent --------
# MIG and partition: the GPU's change of a mig_apply / partition_apply request as it is sent
# (core/protocol.py MigChange, PartitionChange); MPS: the settings of every daemon of the GPU
# (core/protocol.py MpsSettings, whose `change(gpu, device)` is each daemon's mps_apply change);
# limiter: the GPU's tenant lines (core/tenant_table.py TenantSpec). core/codec.py writes and
# reads them (plan/document.py), with the checks beside each type.


@dataclass(frozen=True)
class GpuPlan:
    """One GPU: its actions and problems, the payloads `apply` sends to the agent, and the live
    state the plan was made from (`live`, compared with `fingerprint`)."""

    index: int
    uuid: str
    name: str
    fingerprint: str
    live: dict[str, Any]
    actions: tuple[Action, ...] = ()
    problems: tuple[str, ...] = ()
    mig: MigChange | None = None
    mps: MpsSettings | None = None
    limiter: tuple[TenantSpec, ...] | None = None  # the tenant lines wanted on this GPU (no gpus)
    partition: PartitionChange | None = None
    notes: tuple[str, ...] = ()  # shown with the plan, never applied (what fleet.yaml leaves alone)

    @property
    def changes(self) -> bool:
        return bool(self.actions)

    @property
    def has_payload(self) -> bool:
        """Whether apply would send anything for this GPU (the actions are only its description)."""
        return (
            self.mig is not None
            or self.mps is not None
            or self.limiter is not None
            or self.partition is not None
        )

    def kinds(self) -> set[str]:
        return {a.kind for a in self.actions}

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "name": self.name,
            "fingerprint": self.fingerprint,
            "live": self.live,
            "actions": [a.to_json() for a in self.actions],
            "problems": list(self.problems),
            "mig": to_json(self.mig),
            "mps": to_json(self.mps),
            "limiter": to_json(self.limiter),
            # Only on GPUs it changes: plans of NVIDIA GPUs stay as they were, key for key.
            **({"partition": to_json(self.partition)} if self.partition is not None else {}),
            **({"notes": list(self.notes)} if self.notes else {}),
        }


@dataclass(frozen=True)
class NodePlan:
    name: str
    gpus: tuple[GpuPlan, ...] = ()
    error: str = ""  # the node could not be read
    kind: str = ""
    limiter_generation: int = 0
    problems: tuple[str, ...] = ()  # node-wide

    @property
    def changes(self) -> bool:
        return any(g.changes for g in self.gpus)

    @property
    def failed(self) -> bool:
        return bool(self.error or self.problems or any(g.problems for g in self.gpus))

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "error": self.error,
            "kind": self.kind,
            "limiter_generation": self.limiter_generation,
            "problems": list(self.problems),
            "gpus": [g.to_json() for g in self.gpus],
        }


@dataclass(frozen=True)
class Plan:
    nodes: tuple[NodePlan, ...]
    fleet_file: str = ""
    fleet_digest: str = ""  # sha256 of fleet.yaml's bytes
    created: float = 0.0

    @property
    def changes(self) -> bool:
        return any(n.changes for n in self.nodes)

    @property
    def failed(self) -> bool:
        return any(n.failed for n in self.nodes)

    def exit_code(self) -> int:
        """terraform plan -detailed-exitcode: 0 nothing to do, 1 error, 2 changes."""
        if self.failed:
            return 1
        return 2 if self.changes else 0

    def counts(self) -> dict[str, int]:
        actions = [a for n in self.nodes for g in n.gpus for a in g.actions]
        return {
            "add": sum(a.marker == ADD for a in actions),
            "change": sum(a.marker == CHANGE for a in actions),
            "remove": sum(a.marker == REMOVE for a in actions),
            "disruptive": sum(a.disruptive for a in actions),
            "nodes": sum(n.changes for n in self.nodes),
            "gpus": sum(g.changes for n in self.nodes for g in n.gpus),
        }

    def to_json(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "version": PLAN_VERSION,
            "fleet_file": self.fleet_file,
            "fleet_digest": self.fleet_digest,
            "created": self.created,
            "summary": self.counts(),
            "nodes": [n.to_json() for n in self.nodes],
        }


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def state_fingerprint(document: Any) -> str:
    text = json.dumps(document, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]
