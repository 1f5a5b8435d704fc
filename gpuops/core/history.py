"""Accounting over time: the node's bounded minute and hour rollups, and their JSON form.

Shared by the node (which records them, gpuops/node/history/) and the operator (which reads
them with the agent's `history` request). Pure: frozen dataclasses and functions, valid Python
3.8, standard library only. The format is described in docs/history.md.

A `Bucket` is one aligned minute or hour (UTC). Per GPU (`GpuUsage`) it holds what the GPU did
in that time, and per *key* (`UserUsage`: unix user, groups, tenant label, MIG GPU instance)
what that key's processes held and used. Figures are time integrals over the samples the
recorder took, each sample standing for the time since the previous one (at most two recording
intervals: a longer gap is not counted):

- a whole GPU is shared between the keys with processes on it by the memory they hold (equally
  when none holds any); its busy time is its utilization (100% while processes are present when
  the node does not report utilization);
- on MIG, each GPU instance is `instance_fraction` of the GPU, shared between its processes'
  keys by memory; an instance with processes is busy by its SMs' utilization where NVML's GPM
  gives it (Hopper and newer: `busy == held * util/100` for its keys), else all of it while held
  (Ampere, or an instance's first sample: `busy == held`). The live views count GPU-time the same
  way (gpuops/views/tenants.py), and so do the PromQL history rules
  (deploy/prometheus/gpuops-history.rules.yml).

`gpu_shares` computes one sample's shares; the recorder multiplies them by the sample's time.

`bucket_fault` says whether a bucket's figures can be true (busy or held time within the time
sampled and the bucket's length, memory within the GPU's, process counts within what any node
runs); `screened` turns the buckets whose figures cannot be into unreadable time, as a corrupt
file's is (docs/history.md, "Figures that cannot be true").
"""

from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass, replace
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpuops.core.busy import busy_fraction as busy_fraction  # GPU-time's one rule (core/busy.py)
from gpuops.core.model import Gpu, GpuInstance, GpuProcess, NotAvailable

MINUTE = 60.0
HOUR = 3600.0
RESOLUTIONS = {"minute": MINUTE, "hour": HOUR}

OTHER_USER = "(other)"  # the key that holds everything past MAX_KEYS keys of a GPU in a bucket
MAX_KEYS = 64  # user keys per GPU per bucket, "(other)" included


@dataclass(frozen=True)
class UserUsage:
    """What one key's processes held and used on one GPU in one bucket."""

    user: str  # unix user name, "" when unknown; "(other)" for keys merged past the bound
    groups: Tuple[str, ...]  # as GpuProcess.groups (primary first)
    tenant: Optional[str]  # the limiter region's tenant label (GpuProcess.tenant), else None
    tenant_source: str  # GpuProcess.tenant_source ("" when none)
    gpu_instance_id: Optional[int]  # MIG GPU instance, None when not on MIG
    seconds: float  # seconds during which this key had a process on the GPU
    held: float  # GPU-equivalent-seconds of presence: sum(weight * dt)
    busy: float  # GPU-time seconds: sum(weight * util/100 * dt); MIG: the slice's GPM util, else 100
    memory: float  # byte-seconds: sum(memory held by the key's processes * dt)
    memory_max: int  # largest total memory of the key at one sample
    process_max: int  # largest memory of one process of the key at one sample
    processes: int  # most processes of the key at one sample


@dataclass(frozen=True)
class GpuUsage:
    """What one GPU did in one bucket."""

    index: int
    uuid: str
    name: str  # as GpuInfo
    memory_total: int  # bytes (0 when unknown)
    owner: Optional[str]  # Gpu.owner as the node reports it
    mig: bool  # MIG mode on during (any part of) the bucket
    seconds: float  # sampled seconds covered for this GPU
    # GPU-time seconds: sum(util/100 * dt); on MIG: sum(fraction of the GPU held by instances
    # with processes * dt)
    busy: float
    memory: float  # byte-seconds of device memory used
    memory_max: int  # most device memory used at one sample
    users: Tuple[UserUsage, ...]


@dataclass(frozen=True)
class Bucket:
    start: float  # aligned: a multiple of span (UTC)
    span: float  # 60.0 (minute) or 3600.0 (hour)
    gpus: Tuple[GpuUsage, ...]

    def __getattr__(self, name: str) -> Any:
        # Only for a missing attribute: `gpus` of a bucket decoded with keep_json=True, built when
        # first asked for (equality, repr, tests). A node answering `history` never asks: it
        # sends the JSON it checked, and does not allocate every figure's objects twice.
        kept = self.__dict__.get(_KEPT) if name == "gpus" else None
        if kept is None:
            raise AttributeError(name)
        if isinstance(kept, str):  # only its checked text was kept (a node's file line)
            kept = json.loads(kept)
        built = _fast_bucket(kept, keep_json=False)
        gpus = built.gpus if built is not None else _checked_bucket(kept).gpus
        self.__dict__["gpus"] = gpus
        return gpus


@dataclass(frozen=True)
class Unreadable:
    """Time of a history whose buckets the node could not read (a corrupt file, or one moved
    aside as corrupt): neither idle nor busy, unknown. `reason` names the file and the fault."""

    since: float
    until: float
    reason: str

    def covers(self, start: float, span: float) -> bool:
        """Whether the bucket [start, start + span) overlaps this time."""
        return start < self.until and start + span > self.since


@dataclass(frozen=True)
class History:
    resolution: str  # "minute" | "hour"
    since: float
    until: float
    # A recorder wrote within the last 3 flush intervals (see docs/history.md).
    recording: bool
    oldest: Optional[float]  # start of the oldest bucket kept (of this resolution)
    buckets: Tuple[Bucket, ...]  # ordered by start
    # Times within [since, until) whose buckets could not be read: a hole in the evidence, not a
    # gap in recording. Sent only when there are some (older operators reject unknown keys: a
    # reply with holes fails loudly there instead of being taken as complete).
    unreadable: Tuple[Unreadable, ...] = ()


# ---- shares of one sample ----------------------------------------------------------------------

_PROFILE_SLICES = re.compile(r"^(\d+)g\.")
_FRACTIONS: Dict[Tuple[Optional[str], str, int], float] = {}


def instance_fraction(gpu: Gpu, gi: GpuInstance) -> float:
    """The share of its GPU a MIG GPU instance is: compute slices over the GPU's (3g of 7 = 3/7),
    else memory slices over the model's. The view models (gpuops/views/) use it too, so
    history and the screens agree."""
    key = (gpu.info.mig_model, gi.profile_name, gi.size)
    found = _FRACTIONS.get(key)
    if found is None:
        found = _fraction(*key)
        if len(_FRACTIONS) < 4096:
            _FRACTIONS[key] = found
    return found


def _fraction(mig_model: Optional[str], profile: str, size: int) -> float:
    from gpuops.core.mig.catalog import find_model

    model = find_model(mig_model) if mig_model else None
    match = _PROFILE_SLICES.match(profile)
    if model is not None and match is not None and model.compute_slice_count:
        return min(1.0, int(match.group(1)) / model.compute_slice_count)
    if model is not None and model.memory_slice_count:
        return min(1.0, size / model.memory_slice_count)
    return min(1.0, size / 8)


def _int(value: object) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _num(value: object) -> Optional[float]:
    if isinstance(value, (bool, NotAvailable)):
        return None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


Key = Tuple[str, Tuple[str, ...], Optional[str], str, Optional[int]]


def key_of(process: GpuProcess) -> Key:
    """(user, groups, tenant, tenant_source, gpu_instance_id): what a UserUsage is kept per."""
    return (process.user, process.groups, process.tenant, process.tenant_source, process.gpu_instance_id)


@dataclass(frozen=True)
class KeyShare:
    """One key's part of one sample of a GPU (multiply by dt for a bucket's integrals)."""

    key: Key
    weight: float  # GPU-equivalents held
    busy: float  # GPU-equivalents busy (weight * util/100; on MIG the slice's GPM util, else = weight)
    memory: int  # bytes its processes hold
    process_max: int  # bytes of its largest process
    processes: int


@dataclass(frozen=True)
class GpuShare:
    """One sample of one GPU, as the recorder integrates it."""

    busy: float  # fraction of the GPU busy (util/100; MIG: instances in use, each by its GPM util)
    memory: int  # device memory used, bytes
    mig: bool
    keys: Tuple[KeyShare, ...]


def _process_memory(processes: Sequence[GpuProcess], fallback: Optional[int]) -> List[int]:
    """Memory per process; where NVML did not say, an equal share of what the device holds."""
    known = [_int(p.used_memory_bytes) for p in processes]
    if all(k is not None for k in known):
        return [k or 0 for k in known]
    share = (fallback or 0) // max(1, len(processes))
    return [k if k is not None else share for k in known]


def _key_shares(
    processes: Sequence[GpuProcess], memories: Sequence[int], scale: float, util: Optional[float]
) -> List[KeyShare]:
    """Keys of processes sharing one device (a GPU or one MIG instance) that is `scale` of the
    GPU, by memory held (equally when none holds any)."""
    held: Dict[Key, List[int]] = {}  # key -> [memory, process_max, processes]
    for p, m in zip(processes, memories):
        acc = held.get(key_of(p))
        if acc is None:
            held[key_of(p)] = [m, m, 1]
        else:
            acc[0] += m
            acc[1] = max(acc[1], m)
            acc[2] += 1
    total = sum(a[0] for a in held.values())
    out = []
    for key, (memory, process_max, count) in held.items():
        weight = scale * (memory / total if total > 0 else 1.0 / len(held))
        busy = weight if util is None else weight * util
        out.append(KeyShare(key, weight, busy, memory, process_max, count))
    return out


def gpu_shares(gpu: Gpu) -> GpuShare:
    """What one sample of `gpu` says: how busy it is and which keys hold what share of it."""
    sample = gpu.sample
    mig = gpu.mig is not None and gpu.mig.current
    if mig:
        assert gpu.mig is not None
        instances = {m.gpu_instance_id: m for m in gpu.mig_samples}
        keys: List[KeyShare] = []
        busy = 0.0
        used = 0
        for gi in gpu.mig.gpu_instances:
            ms = instances.get(gi.id)
            gi_used = _int(ms.memory_used_bytes) if ms is not None else None
            used += gi_used or 0
            procs = [p for p in gpu.processes if p.gpu_instance_id == gi.id]
            if not procs:
                continue
            fraction = instance_fraction(gpu, gi)
            # GPU-time: the slice's SM utilization where NVML's GPM gives it, else all of it while
            # a process holds it (as the live views count it: docs/tui.md, GPU-time).
            gi_util = _num(ms.sm_utilization_percent) if ms is not None else None
            gi_fraction = busy_fraction(gi_util)
            busy += fraction if gi_fraction is None else fraction * gi_fraction
            keys.extend(_key_shares(procs, _process_memory(procs, gi_used), fraction, gi_fraction))
        device_used = _int(sample.memory_used_bytes) if sample is not None else None
        if device_used is None:
            device_used = used or sum(_int(p.used_memory_bytes) or 0 for p in gpu.processes)
        return GpuShare(min(1.0, busy), device_used, True, tuple(keys))
    util = _num(sample.utilization_gpu_percent) if sample is not None else None
    util_fraction = busy_fraction(util)
    device_used = _int(sample.memory_used_bytes) if sample is not None else None
    memories = _process_memory(gpu.processes, device_used)
    if device_used is None:
        device_used = sum(memories)
    if gpu.processes:
        keys = _key_shares(gpu.processes, memories, 1.0, util_fraction)
        busy = 1.0 if util_fraction is None else util_fraction
    else:
        keys = []
        busy = util_fraction or 0.0
    return GpuShare(busy, device_used, False, tuple(keys))


# ---- JSON ------------------------------------------------------------------------------------


def user_to_json(u: UserUsage) -> Dict[str, Any]:
    return {
        "user": u.user,
        "groups": list(u.groups),
        "tenant": u.tenant,
        "tenant_source": u.tenant_source,
        "gpu_instance_id": u.gpu_instance_id,
        "seconds": u.seconds,
        "held": u.held,
        "busy": u.busy,
        "memory": u.memory,
        "memory_max": u.memory_max,
        "process_max": u.process_max,
        "processes": u.processes,
    }


def gpu_to_json(g: GpuUsage) -> Dict[str, Any]:
    return {
        "index": g.index,
        "uuid": g.uuid,
        "name": g.name,
        "memory_total": g.memory_total,
        "owner": g.owner,
        "mig": g.mig,
        "seconds": g.seconds,
        "busy": g.busy,
        "memory": g.memory,
        "memory_max": g.memory_max,
        "users": [user_to_json(u) for u in g.users],
    }


def keep_only_text(b: Bucket, text: str) -> None:
    """A bucket decoded with keep_json=True keeps `text`, the JSON it was decoded from, instead
    of the decoded objects: bucket_to_json and `gpus` parse it again when asked."""
    b.__dict__[_KEPT] = text


def bucket_to_json(b: Bucket) -> Dict[str, Any]:
    # A bucket decoded with keep_json=True (a node's own files) is the object it came from: the
    # node answers `history` without building every bucket's JSON again. Callers must not
    # change what this returns.
    kept = b.__dict__.get(_KEPT)
    if isinstance(kept, str):  # the checked line of a node's file, kept instead of its objects
        return json.loads(kept)  # type: ignore[no-any-return]
    if kept is not None:
        return kept  # type: ignore[no-any-return]
    return {"start": b.start, "span": b.span, "gpus": [gpu_to_json(g) for g in b.gpus]}


def history_to_json(h: History) -> Dict[str, Any]:
    out = {
        "resolution": h.resolution,
        "since": h.since,
        "until": h.until,
        "recording": h.recording,
        "oldest": h.oldest,
        "buckets": [bucket_to_json(b) for b in h.buckets],
    }
    if h.unreadable:
        out["unreadable"] = [{"since": u.since, "until": u.until, "reason": u.reason} for u in h.unreadable]
    return out


_MAX_INT = 2**63
_MAX_TIME = 1e11  # seconds since 1970: year 5138
_INF = float("inf")
_KEPT = "_json"  # instance dictionary key of the JSON a bucket was decoded from (not a field)
_FAULT = "_fault"  # instance dictionary key of bucket_fault's answer, found while decoding
_new = object.__new__
_set_state = object.__setattr__


def _obj(data: Any, path: str, keys: Tuple[str, ...]) -> Dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError("%s: expected an object" % path)
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError("%s: missing %r" % (path, missing[0]))
    unknown = sorted(str(k) for k in data if k not in keys)
    if unknown:
        raise ValueError("%s: unknown key %r" % (path, unknown[0][:64]))
    return data


def _str(data: Any, path: str) -> str:
    if not isinstance(data, str):
        raise ValueError("%s: expected a string" % path)
    return data


def _opt_str(data: Any, path: str) -> Optional[str]:
    return None if data is None else _str(data, path)


def _bool(data: Any, path: str) -> bool:
    if not isinstance(data, bool):
        raise ValueError("%s: expected true or false" % path)
    return data


def _count(data: Any, path: str) -> int:
    if not isinstance(data, int) or isinstance(data, bool) or not 0 <= data < _MAX_INT:
        raise ValueError("%s: expected a whole number >= 0" % path)
    return int(data)


def _amount(data: Any, path: str) -> float:
    if isinstance(data, bool) or not isinstance(data, (int, float)):
        raise ValueError("%s: expected a number" % path)
    value = float(data)
    if not (math.isfinite(value) and value >= 0.0):
        raise ValueError("%s: expected a finite number >= 0" % path)
    return value


def _time(data: Any, path: str) -> float:
    value = _amount(data, path)
    if value > _MAX_TIME:
        raise ValueError("%s: not a time (seconds since 1970)" % path)
    return value


def _list(data: Any, path: str) -> List[Any]:
    if not isinstance(data, list):
        raise ValueError("%s: expected a list" % path)
    return data


_USER_KEYS = (
    "user",
    "groups",
    "tenant",
    "tenant_source",
    "gpu_instance_id",
    "seconds",
    "held",
    "busy",
    "memory",
    "memory_max",
    "process_max",
    "processes",
)
_GPU_KEYS = (
    "index",
    "uuid",
    "name",
    "memory_total",
    "owner",
    "mig",
    "seconds",
    "busy",
    "memory",
    "memory_max",
    "users",
)


def user_from_json(data: Any, path: str = "UserUsage") -> UserUsage:
    d = _obj(data, path, _USER_KEYS)
    groups = tuple(
        _str(g, "%s.groups[%d]" % (path, n)) for n, g in enumerate(_list(d["groups"], path + ".groups"))
    )
    gi = d["gpu_instance_id"]
    return UserUsage(
        user=_str(d["user"], path + ".user"),
        groups=groups,
        tenant=_opt_str(d["tenant"], path + ".tenant"),
        tenant_source=_str(d["tenant_source"], path + ".tenant_source"),
        gpu_instance_id=None if gi is None else _count(gi, path + ".gpu_instance_id"),
        seconds=_amount(d["seconds"], path + ".seconds"),
        held=_amount(d["held"], path + ".held"),
        busy=_amount(d["busy"], path + ".busy"),
        memory=_amount(d["memory"], path + ".memory"),
        memory_max=_count(d["memory_max"], path + ".memory_max"),
        process_max=_count(d["process_max"], path + ".process_max"),
        processes=_count(d["processes"], path + ".processes"),
    )


def gpu_from_json(data: Any, path: str = "GpuUsage") -> GpuUsage:
    d = _obj(data, path, _GPU_KEYS)
    users = []
    seen = set()
    for n, item in enumerate(_list(d["users"], path + ".users")):
        u = user_from_json(item, "%s.users[%d]" % (path, n))
        key = (u.user, u.groups, u.tenant, u.tenant_source, u.gpu_instance_id)
        if key in seen:
            raise ValueError("%s.users[%d]: the same key twice" % (path, n))
        seen.add(key)
        users.append(u)
    return GpuUsage(
        index=_count(d["index"], path + ".index"),
        uuid=_str(d["uuid"], path + ".uuid"),
        name=_str(d["name"], path + ".name"),
        memory_total=_count(d["memory_total"], path + ".memory_total"),
        owner=_opt_str(d["owner"], path + ".owner"),
        mig=_bool(d["mig"], path + ".mig"),
        seconds=_amount(d["seconds"], path + ".seconds"),
        busy=_amount(d["busy"], path + ".busy"),
        memory=_amount(d["memory"], path + ".memory"),
        memory_max=_count(d["memory_max"], path + ".memory_max"),
        users=tuple(users),
    )


def _fast_bucket(data: Any, keep_json: bool) -> Optional[Bucket]:
    """The bucket when `data` is exactly what `bucket_to_json` writes (each value of its plain
    JSON type: floats where the figure is a float, no extra key, no key twice); else None, and
    `_checked_bucket` decodes it (an int for a float) or says what is wrong and where. The same
    checks as there, written as one type test and one range test per value, with the instances'
    dictionaries set whole (no __init__, no setattr per field): decoding is most of what the operator does
    with a reply, and reading its files most of what a node does to answer."""
    if type(data) is not dict or len(data) != 3:
        return None
    try:
        start = data["start"]
        span = data["span"]
        gpu_items = data["gpus"]
    except KeyError:
        return None
    if not (
        type(start) is float
        and type(span) is float
        and span in (HOUR, MINUTE)
        and 0.0 <= start <= _MAX_TIME
        and math.fmod(start, span) == 0.0
        and type(gpu_items) is list
    ):
        return None
    gpus = []
    indices = set()
    fault: Optional[str] = None  # the first figure that cannot be true (bucket_fault)
    for g in gpu_items:
        if type(g) is not dict or len(g) != 11:
            return None
        try:
            index = g["index"]
            uuid = g["uuid"]
            name = g["name"]
            total = g["memory_total"]
            owner = g["owner"]
            mig = g["mig"]
            seconds = g["seconds"]
            busy = g["busy"]
            memory = g["memory"]
            mmax = g["memory_max"]
            user_items = g["users"]
        except KeyError:
            return None
        if not (
            type(uuid) is str
            and type(name) is str
            and type(mig) is bool
            and type(index) is int
            and type(total) is int
            and type(mmax) is int
            and 0 <= index < _MAX_INT
            and 0 <= total < _MAX_INT
            and 0 <= mmax < _MAX_INT
            and index not in indices
            and (owner is None or type(owner) is str)
            and type(seconds) is float
            and type(busy) is float
            and type(memory) is float
            and seconds >= 0.0
            and busy >= 0.0
            and memory >= 0.0
            and seconds + busy + memory < _INF  # each finite (none is NaN: NaN >= 0 is false)
            and type(user_items) is list
        ):
            return None
        indices.add(index)
        users: List[UserUsage] = []
        keys = set()
        cap = total if total > 0 else MAX_GPU_MEMORY
        held_sum = 0.0
        for u in user_items:
            if type(u) is not dict or len(u) != 12:
                return None
            try:
                user = u["user"]
                group_items = u["groups"]
                tenant = u["tenant"]
                source = u["tenant_source"]
                gi = u["gpu_instance_id"]
                u_seconds = u["seconds"]
                u_held = u["held"]
                u_busy = u["busy"]
                u_memory = u["memory"]
                u_mmax = u["memory_max"]
                u_pmax = u["process_max"]
                u_count = u["processes"]
            except KeyError:
                return None
            if not (
                type(group_items) is list
                and type(user) is str
                and type(source) is str
                and (tenant is None or type(tenant) is str)
                and (gi is None or (type(gi) is int and 0 <= gi < _MAX_INT))
                and type(u_seconds) is float
                and type(u_held) is float
                and type(u_busy) is float
                and type(u_memory) is float
                and u_seconds >= 0.0
                and u_held >= 0.0
                and u_busy >= 0.0
                and u_memory >= 0.0
                and u_seconds + u_held + u_busy + u_memory < _INF
                and type(u_mmax) is int
                and type(u_pmax) is int
                and type(u_count) is int
                and 0 <= u_mmax < _MAX_INT
                and 0 <= u_pmax < _MAX_INT
                and 0 <= u_count < _MAX_INT
            ):
                return None
            groups = tuple(group_items)
            for group in groups:
                if type(group) is not str:
                    return None
            key = (user, groups, tenant, source, gi)
            if key in keys:
                return None
            keys.add(key)
            held_sum += u_held
            # user_fault's bounds written out (a call per key costed a fifth of the decoding); it
            # says which one, where one fails. A hypothesis test holds the two to each other.
            if fault is None and (
                u_seconds > seconds * _ROOM + 1.0
                or u_held > u_seconds * _ROOM + 1.0
                or u_busy > u_held * _ROOM + 1.0
                or u_mmax > cap
                or u_pmax > u_mmax
                or u_memory > u_mmax * u_seconds * _ROOM + 1.0
                or u_count > MAX_PROCESSES
            ):
                fault = _user_fault(
                    index, user, cap, seconds, u_seconds, u_held, u_busy, u_memory, u_mmax, u_pmax, u_count
                )
            if keep_json:
                continue
            # Literal keys: the interned names attribute lookups find by identity (the parser's
            # keys are equal strings, not the same ones: reading the figures back took twice as
            # long).
            usage = _new(UserUsage)
            _set_state(
                usage,
                "__dict__",
                {
                    "user": user,
                    "groups": groups,
                    "tenant": tenant,
                    "tenant_source": source,
                    "gpu_instance_id": gi,
                    "seconds": u_seconds,
                    "held": u_held,
                    "busy": u_busy,
                    "memory": u_memory,
                    "memory_max": u_mmax,
                    "process_max": u_pmax,
                    "processes": u_count,
                },
            )
            users.append(usage)
        if fault is None and (
            seconds > span * _ROOM + 1.0
            or busy > seconds * _ROOM + 1.0
            or held_sum > seconds * _ROOM + 1.0
            or total > MAX_GPU_MEMORY
            or mmax > cap
            or memory > mmax * seconds * _ROOM + 1.0
        ):
            fault = _gpu_fault(span, index, total, seconds, busy, memory, mmax, held_sum)
        if keep_json:
            continue
        gpu = _new(GpuUsage)
        _set_state(
            gpu,
            "__dict__",
            {
                "index": index,
                "uuid": uuid,
                "name": name,
                "memory_total": total,
                "owner": owner,
                "mig": mig,
                "seconds": seconds,
                "busy": busy,
                "memory": memory,
                "memory_max": mmax,
                "users": tuple(users),
            },
        )
        gpus.append(gpu)
    # Kept: `gpus` is built from `data` when first asked for (Bucket.__getattr__).
    b_state: Dict[str, Any] = {"start": start, "span": span, _FAULT: fault}
    if keep_json:
        b_state[_KEPT] = data
    else:
        b_state["gpus"] = tuple(gpus)
    bucket = _new(Bucket)
    _set_state(bucket, "__dict__", b_state)
    return bucket


def bucket_from_json(data: Any, path: str = "Bucket", keep_json: bool = False) -> Bucket:
    """A bucket, every field checked; raises ValueError("path: what is wrong"). `keep_json`:
    when `data` is exactly in bucket_to_json's form, the bucket keeps it, `bucket_to_json`
    gives it back as it is and `gpus` is built from it when first used, so the caller must not
    change `data` afterwards; for a node's own files, not for replies (the operator would keep
    every parsed reply alive)."""
    fast = _fast_bucket(data, keep_json)
    return fast if fast is not None else _checked_bucket(data, path)


def _checked_bucket(data: Any, path: str = "Bucket") -> Bucket:
    d = _obj(data, path, ("start", "span", "gpus"))
    span = _amount(d["span"], path + ".span")
    if span not in (MINUTE, HOUR):
        raise ValueError("%s.span: expected 60 or 3600" % path)
    start = _time(d["start"], path + ".start")
    if math.fmod(start, span) != 0.0:
        raise ValueError("%s.start: not a multiple of the span" % path)
    gpus = []
    indices = set()
    for n, item in enumerate(_list(d["gpus"], path + ".gpus")):
        g = gpu_from_json(item, "%s.gpus[%d]" % (path, n))
        if g.index in indices:
            raise ValueError("%s.gpus[%d].index: GPU %d twice" % (path, n, g.index))
        indices.add(g.index)
        gpus.append(g)
    return Bucket(start=start, span=span, gpus=tuple(gpus))


def history_from_json(data: Any) -> History:
    """Rebuild a History, checking every field; raises ValueError("path: what is wrong")."""
    path = "History"
    keys = ("resolution", "since", "until", "recording", "oldest", "buckets")
    optional = isinstance(data, dict) and "unreadable" in data
    d = _obj(data, path, (*keys, "unreadable") if optional else keys)
    resolution = d["resolution"]
    if not isinstance(resolution, str) or resolution not in RESOLUTIONS:
        raise ValueError("%s.resolution: expected 'minute' or 'hour'" % path)
    span = RESOLUTIONS[resolution]
    since = _time(d["since"], path + ".since")
    until = _time(d["until"], path + ".until")
    if until < since:
        raise ValueError("%s.until: before since" % path)
    oldest = None if d["oldest"] is None else _time(d["oldest"], path + ".oldest")
    buckets: List[Bucket] = []
    for n, item in enumerate(_list(d["buckets"], path + ".buckets")):
        at = "%s.buckets[%d]" % (path, n)
        b = bucket_from_json(item, at)
        if b.span != span:
            raise ValueError("%s.span: %g in a history of %s buckets" % (at, b.span, resolution))
        if buckets and b.start <= buckets[-1].start:
            raise ValueError("%s.start: buckets must be ordered by start, each once" % at)
        buckets.append(b)
    unreadable = []
    for n, item in enumerate(_list(d["unreadable"], path + ".unreadable") if optional else []):
        at = "%s.unreadable[%d]" % (path, n)
        u = _obj(item, at, ("since", "until", "reason"))
        start, end = _time(u["since"], at + ".since"), _time(u["until"], at + ".until")
        if end < start:
            raise ValueError("%s.until: before since" % at)
        unreadable.append(Unreadable(start, end, _str(u["reason"], at + ".reason")[:500]))
    return History(
        resolution=str(resolution),
        since=since,
        until=until,
        recording=_bool(d["recording"], path + ".recording"),
        oldest=oldest,
        buckets=tuple(buckets),
        unreadable=tuple(unreadable),
    )


# ---- figures that can be true ------------------------------------------------------------------

MAX_GPU_MEMORY = 1 << 50  # bytes: no GPU has more (1 PiB); the bound where a GPU's total is unknown
MAX_PROCESSES = 1 << 22  # Linux's PID_MAX_LIMIT: no node runs more processes at once
# Room over a limit for the rounding of written figures (seconds to 3 decimals, bytes whole) and
# for what the recorder counted before it kept a bucket within its length (a clock set back).
SLACK = 0.01
_ROOM = 1.0 + SLACK


def _over(value: float, limit: float) -> bool:
    return value > limit * _ROOM + 1.0


def _sane(*values: float) -> bool:
    """Each figure finite and >= 0 (a bucket built in code may hold anything)."""
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < _INF for v in values)


def gpu_fault(
    span: float,
    index: int,
    total: int,
    seconds: float,
    busy: float,
    memory: float,
    memory_max: int,
    held: float,
) -> Optional[str]:
    """Why one GPU's figures in a bucket of `span` seconds cannot be true (`held`: its keys'
    held seconds, summed), or None."""
    if not _sane(span, index, total, seconds, busy, memory, memory_max, held):
        return "GPU %s: a figure that is negative or not a number" % (index,)
    return _gpu_fault(span, index, total, seconds, busy, memory, memory_max, held)


def _gpu_fault(
    span: float,
    index: int,
    total: int,
    seconds: float,
    busy: float,
    memory: float,
    memory_max: int,
    held: float,
) -> Optional[str]:
    """gpu_fault of figures known to be numbers >= 0 (the decoder's fast path has checked)."""
    if _over(seconds, span):
        return "GPU %d: sampled %gs, more than the bucket's %gs" % (index, seconds, span)
    if _over(busy, seconds):
        return "GPU %d: busy %gs, more than the %gs it was sampled" % (index, busy, seconds)
    if _over(held, seconds):
        return "GPU %d: held %gs by its keys, more than the %gs it was sampled" % (index, held, seconds)
    if total > MAX_GPU_MEMORY:
        return "GPU %d: %d bytes of memory, more than any GPU has" % (index, total)
    cap = total if total > 0 else MAX_GPU_MEMORY
    if memory_max > cap:
        return "GPU %d: %d bytes used at once, more than its %d" % (index, memory_max, cap)
    if _over(memory, float(memory_max) * seconds):
        return "GPU %d: memory %g byte-seconds, more than %d bytes for %gs" % (
            index,
            memory,
            memory_max,
            seconds,
        )
    return None


def user_fault(
    index: int,
    user: str,
    cap: int,
    gpu_seconds: float,
    seconds: float,
    held: float,
    busy: float,
    memory: float,
    memory_max: int,
    process_max: int,
    processes: int,
) -> Optional[str]:
    """Why one key's figures on GPU `index` cannot be true, or None. `cap`: the GPU's memory (or
    MAX_GPU_MEMORY where it is not known); `gpu_seconds`: the time the GPU was sampled."""
    if not _sane(cap, gpu_seconds, seconds, held, busy, memory, memory_max, process_max, processes):
        return "GPU %s, user %r: a figure that is negative or not a number" % (index, str(user)[:40])
    return _user_fault(
        index, user, cap, gpu_seconds, seconds, held, busy, memory, memory_max, process_max, processes
    )


def _user_fault(
    index: int,
    user: str,
    cap: int,
    gpu_seconds: float,
    seconds: float,
    held: float,
    busy: float,
    memory: float,
    memory_max: int,
    process_max: int,
    processes: int,
) -> Optional[str]:
    """user_fault of figures known to be numbers >= 0 (the decoder's fast path has checked)."""
    if _over(seconds, gpu_seconds):
        problem = "present %gs, more than the %gs the GPU was sampled" % (seconds, gpu_seconds)
    elif _over(held, seconds):
        problem = "held %gs, more than the %gs present" % (held, seconds)
    elif _over(busy, held):
        problem = "busy %gs, more than the %gs held" % (busy, held)
    elif memory_max > cap:
        problem = "%d bytes at once, more than the GPU's %d" % (memory_max, cap)
    elif process_max > memory_max:
        problem = "one process of %d bytes, more than all of them (%d)" % (process_max, memory_max)
    elif _over(memory, float(memory_max) * seconds):
        problem = "memory %g byte-seconds, more than %d bytes for %gs" % (memory, memory_max, seconds)
    elif processes > MAX_PROCESSES:
        problem = "%d processes, more than any node runs" % processes
    else:
        return None
    return "GPU %d, user %r: %s" % (index, str(user)[:40], problem)


_UNCHECKED = object()


def bucket_fault(bucket: Bucket) -> Optional[str]:
    """Why a bucket's figures cannot be true (the first such figure, with its GPU and key), or
    None when they can: time sampled within the bucket, busy within held within present time,
    keys' held time within the GPU's, memory within the GPU's (1 PiB where its total is not
    known) and within the most used at once for the time, a process within its key, process counts
    within any node's, every figure finite and >= 0. Never raises."""
    found = bucket.__dict__.get(_FAULT, _UNCHECKED)  # found while decoding (the fast path)
    if found is not _UNCHECKED:
        return found if isinstance(found, str) else None
    span = bucket.span
    for g in bucket.gpus:
        total = g.memory_total if isinstance(g.memory_total, int) else 0
        cap = total if total > 0 else MAX_GPU_MEMORY
        held = 0.0
        for u in g.users:
            fault = user_fault(
                g.index,
                u.user,
                cap,
                g.seconds,
                u.seconds,
                u.held,
                u.busy,
                u.memory,
                u.memory_max,
                u.process_max,
                u.processes,
            )
            if fault is not None:
                return fault
            held += u.held if _sane(u.held) else 0.0
        fault = gpu_fault(span, g.index, g.memory_total, g.seconds, g.busy, g.memory, g.memory_max, held)
        if fault is not None:
            return fault
    return None


def bucket_when(bucket: Bucket) -> str:
    """'the hour of 2026-01-01 05:00 UTC' (or 'the minute of ...'): which bucket, for people."""
    what = "hour" if bucket.span == HOUR else "minute" if bucket.span == MINUTE else "bucket"
    try:
        at = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(bucket.start))
    except (ValueError, OverflowError, OSError):
        at = "%g" % bucket.start
    return "the %s of %s" % (what, at)


def screened(history: History, where: str = "") -> History:
    """The history without the buckets whose figures cannot be true (`bucket_fault`): their time
    is unreadable, with the hour and the figure as the reason (`where` before it: a file)."""
    kept: List[Bucket] = []
    lost: List[Unreadable] = []
    for b in history.buckets:
        fault = bucket_fault(b)
        if fault is None:
            kept.append(b)
        else:
            reason = "%s%s: figures that cannot be true: %s" % (where, bucket_when(b), fault)
            lost.append(Unreadable(b.start, b.start + b.span, reason[:500]))
    if not lost:
        return history
    holes = sorted(history.unreadable + tuple(lost), key=lambda u: (u.since, u.until))
    return replace(history, buckets=tuple(kept), unreadable=tuple(holes))
