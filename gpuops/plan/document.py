"""A saved plan's JSON document read back into a Plan, every field checked.

Everything `apply` sends or shows is checked here, the payloads above all (they are what runs):
nothing later indexes a key that may be missing or compares values of the wrong type. Each
error names its place in the document (`plan.json: nodes[0].gpus[2].mig.layout: ...`).
"""

from __future__ import annotations

from typing import Any, TypeVar

from gpuops.core.codec import DecodeError, from_json
from gpuops.core.protocol import MigChange, MpsSettings, PartitionChange
from gpuops.core.tenant_table import TenantSpec
from gpuops.plan.model import (
    ADD,
    CHANGE,
    LIMITER,
    MIG,
    MPS,
    PARTITION,
    PLAN_FORMAT,
    PLAN_VERSION,
    REMOVE,
    Action,
    GpuPlan,
    NodePlan,
    PayloadError,
    Plan,
    PlanError,
    Proc,
)

T = TypeVar("T")
C = TypeVar("C", MigChange, PartitionChange)

_TEXT = "a string"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)


def _req(data: Any, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if not isinstance(data, dict) or key not in data:
        raise PlanError(f"{where}: missing {key!r}")
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise PlanError(f"{where}.{key}: wrong type ({type(value).__name__})")
    return value


def _opt(data: dict[str, Any], key: str, check: Any, what: str, where: str) -> Any:
    """data[key] when it is null or passes `check`; missing counts as null."""
    value = data.get(key)
    if value is not None and not check(value):
        raise PlanError(f"{where}.{key}: expected {what} or null ({type(value).__name__})")
    return value


def _texts(data: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    value = data.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise PlanError(f"{where}.{key}: expected a list of strings")
    return tuple(value)


def _text(data: dict[str, Any], key: str, where: str) -> str:
    value = data.get(key, "")
    if not isinstance(value, str):
        raise PlanError(f"{where}.{key}: expected {_TEXT} ({type(value).__name__})")
    return value


# ---- payloads ------------------------------------------------------------------------------------


def _gpu_change(cls: type[C], data: dict[str, Any], key: str, where: str, index: int) -> C | None:
    """A GPU's MIG or partition change as the node gets it. Its `gpu` is the GPU's (plans saved
    before the payloads were the wire's changes have none: it is taken from the GPU); a plan lists
    what it saw (`expect`) and the processes it stops (`known_pids`, none when missing), so the
    node checks both."""
    value = data.get(key)
    if isinstance(value, dict):
        value = {"gpu": index, "known_pids": [], **value}
    change = _payload(cls, {key: value}, key, where)
    if change is None:
        return None
    at = f"{where}.{key}"
    if change.gpu != index:
        raise PayloadError(f"{at}.gpu: GPU {change.gpu} in the plan of GPU {index}")
    if change.expect is None:
        raise PayloadError(f"{at}.expect: missing (what the plan saw, which the node checks)")
    if change.known_pids is None:
        raise PayloadError(f"{at}.known_pids: expected a list of process ids")
    return change


def _payload(cls: type[T], data: dict[str, Any], key: str, where: str) -> T | None:
    """A payload, as core/codec.py carries it on the wire: every field and the checks beside its
    type (core/protocol.py, core/tenant_table.py). A refusal is a PayloadError."""
    value = data.get(key)
    if value is None:
        return None
    try:
        return from_json(cls, value, f"{where}.{key}")
    except DecodeError as exc:
        raise PayloadError(str(exc)) from None


def _limiter(data: dict[str, Any], where: str) -> tuple[TenantSpec, ...] | None:
    lines = _payload(tuple[TenantSpec, ...], data, "limiter", where)
    if lines is None:
        return None
    names: list[str] = []
    for i, line in enumerate(lines):
        at = f"{where}.limiter[{i}]"
        if line.name in names:
            raise PayloadError(f"{at}: tenant {line.name!r} is listed twice")
        if line.gpus:
            raise PayloadError(f"{at}.gpus: a GPU's lines name no GPUs (they are its own)")
        names.append(line.name)
    return lines


# ---- actions, GPUs, nodes --------------------------------------------------------------------------


def _action(data: Any, where: str) -> Action:
    marker = _req(data, "marker", str, where)
    kind = _req(data, "kind", str, where)
    if marker not in (ADD, CHANGE, REMOVE) or kind not in (MIG, MPS, LIMITER, PARTITION):
        raise PlanError(f"{where}: unknown action {kind!r} {marker!r}")
    procs = []
    for i, p in enumerate(_req(data, "processes", list, where)):
        at = f"{where}.processes[{i}]"
        procs.append(Proc(_req(p, "pid", int, at), _text(p, "user", at), _text(p, "command", at)))
    disruptive = data.get("disruptive", False)
    if not isinstance(disruptive, bool):
        raise PlanError(f"{where}.disruptive: expected true or false")
    return Action(kind, marker, _req(data, "text", str, where), disruptive, tuple(procs))


def _gpu(data: Any, where: str) -> GpuPlan:
    if not isinstance(data, dict):
        raise PlanError(f"{where}: expected an object")
    index = _req(data, "index", int, where)
    return GpuPlan(
        index=index,
        uuid=_req(data, "uuid", str, where),
        name=_req(data, "name", str, where),
        fingerprint=_req(data, "fingerprint", str, where),
        live=_req(data, "live", dict, where),
        actions=tuple(
            _action(a, f"{where}.actions[{i}]") for i, a in enumerate(_req(data, "actions", list, where))
        ),
        problems=_texts(data, "problems", where),
        mig=_gpu_change(MigChange, data, MIG, where, index),
        mps=_payload(MpsSettings, data, MPS, where),
        limiter=_limiter(data, where),
        partition=_gpu_change(PartitionChange, data, PARTITION, where, index),
        notes=_texts(data, "notes", where),
    )


def _node(data: Any, where: str) -> NodePlan:
    if not isinstance(data, dict):
        raise PlanError(f"{where}: expected an object")
    name = _req(data, "name", str, where)
    gpus: list[GpuPlan] = []
    for j, g in enumerate(_req(data, "gpus", list, where)):
        gpu = _gpu(g, f"{where}.gpus[{j}]")
        if any(known.index == gpu.index for known in gpus):
            raise PlanError(f"{where}.gpus[{j}]: GPU {gpu.index} is listed twice")
        gpus.append(gpu)
    return NodePlan(
        name=name,
        gpus=tuple(gpus),
        error=_text(data, "error", where),
        kind=_text(data, "kind", where),
        limiter_generation=_req(data, "limiter_generation", int, where),
        problems=_texts(data, "problems", where),
    )


def plan_from_json(data: Any, source: str = "plan.json") -> Plan:
    """A plan read back; raises PlanError naming the field that is wrong."""
    if not isinstance(data, dict) or data.get("format") != PLAN_FORMAT:
        raise PlanError(f'{source}: not a gpuops plan (no "format": "{PLAN_FORMAT}")')
    version = data.get("version")
    if not _is_int(version) or version != PLAN_VERSION:
        raise PlanError(f"{source}: plan version {data.get('version')!r}; this gpuops reads {PLAN_VERSION}")
    nodes: list[NodePlan] = []
    for i, n in enumerate(_req(data, "nodes", list, source)):
        node = _node(n, f"{source}: nodes[{i}]")
        if any(known.name == node.name for known in nodes):
            raise PlanError(f"{source}: nodes[{i}]: node {node.name!r} is listed twice")
        nodes.append(node)
    created = _opt(data, "created", _is_number, "a time in seconds", source)
    return Plan(
        tuple(nodes),
        fleet_file=_text(data, "fleet_file", source),
        fleet_digest=_text(data, "fleet_digest", source),
        created=float(created or 0.0),
    )
