"""A plan: per node and GPU, what `apply` will change, what it disrupts, and the live state it was
made from. Saved as JSON (`gpuops plan -o plan.json`) and read back by `gpuops apply --plan`."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

PLAN_FORMAT = "gpuops-plan"
PLAN_VERSION = 1

MIG, MPS, LIMITER = "mig", "mps", "limiter"
ADD, CHANGE, REMOVE = "+", "~", "-"


class PlanError(ValueError):
    """A saved plan that cannot be used; the message says why (and where)."""


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

    kind: str  # mig | mps | limiter
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
    mig: dict[str, Any] | None = None  # {"layout": MigLayout json, "expect": fingerprint}
    mps: dict[str, Any] | None = None  # the MPS settings wanted (see diff.mps_payload)
    limiter: list[dict[str, Any]] | None = None  # the tenant lines wanted on this GPU

    @property
    def changes(self) -> bool:
        return bool(self.actions)

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
            "mig": self.mig,
            "mps": self.mps,
            "limiter": self.limiter,
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


# ---- reading a saved plan ------------------------------------------------------------------------


def _req(data: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise PlanError(f"{where}: missing {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise PlanError(f"{where}.{key}: wrong type ({type(value).__name__})")
    return value


def _opt_dict(data: dict[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = data.get(key)
    if value is not None and not isinstance(value, dict):
        raise PlanError(f"{where}.{key}: expected an object")
    return value


def _action(data: Any, where: str) -> Action:
    marker = _req(data, "marker", str, where)
    kind = _req(data, "kind", str, where)
    if marker not in (ADD, CHANGE, REMOVE) or kind not in (MIG, MPS, LIMITER):
        raise PlanError(f"{where}: unknown action {kind!r} {marker!r}")
    procs = []
    for i, p in enumerate(_req(data, "processes", list, where)):
        procs.append(
            Proc(
                _req(p, "pid", int, f"{where}.processes[{i}]"),
                str(p.get("user", "")),
                str(p.get("command", "")),
            )
        )
    return Action(kind, marker, _req(data, "text", str, where), bool(data.get("disruptive")), tuple(procs))


def _gpu(data: Any, where: str) -> GpuPlan:
    limiter = data.get("limiter") if isinstance(data, dict) else None
    if limiter is not None and not (isinstance(limiter, list) and all(isinstance(t, dict) for t in limiter)):
        raise PlanError(f"{where}.limiter: expected a list of tenant lines")
    return GpuPlan(
        index=_req(data, "index", int, where),
        uuid=_req(data, "uuid", str, where),
        name=_req(data, "name", str, where),
        fingerprint=_req(data, "fingerprint", str, where),
        live=_req(data, "live", dict, where),
        actions=tuple(
            _action(a, f"{where}.actions[{i}]") for i, a in enumerate(_req(data, "actions", list, where))
        ),
        problems=tuple(str(p) for p in _req(data, "problems", list, where)),
        mig=_opt_dict(data, "mig", where),
        mps=_opt_dict(data, "mps", where),
        limiter=limiter,
    )


def plan_from_json(data: Any, source: str = "plan.json") -> Plan:
    """A plan read back; raises PlanError naming the field that is wrong."""
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise PlanError(f'{source}: not a gpuops plan (no "format": "{PLAN_FORMAT}")')
    if data.get("version") != PLAN_VERSION:
        raise PlanError(f"{source}: plan version {data.get('version')!r}; this gpuops reads {PLAN_VERSION}")
    nodes = []
    for i, n in enumerate(_req(data, "nodes", list, source)):
        where = f"{source}: nodes[{i}]"
        nodes.append(
            NodePlan(
                name=_req(n, "name", str, where),
                gpus=tuple(_gpu(g, f"{where}.gpus[{j}]") for j, g in enumerate(_req(n, "gpus", list, where))),
                error=str(n.get("error", "")),
                kind=str(n.get("kind", "")),
                limiter_generation=_req(n, "limiter_generation", int, where),
                problems=tuple(str(p) for p in n.get("problems", [])),
            )
        )
    return Plan(
        tuple(nodes),
        fleet_file=str(data.get("fleet_file", "")),
        fleet_digest=str(data.get("fleet_digest", "")),
        created=float(data.get("created") or 0.0),
    )
