"""Loading and checking simulator specs (JSON; the node side has no YAML library).

A spec describes one node: its GPUs (model, owner team, MIG mode and layout), its users and
teams, and the workloads that run on it. Every mistake is reported as a `SpecError` whose path
names the offending field (``gpus[2].model: unknown model 'A100-41GB' (known: ...)``); the
backend turns that into a one-line `BackendUnavailable`.

The format is documented in docs/simulator.md; in short::

    {"hostname": "gpu-a01", "seed": 7, "driver_version": "550.54.15",
     "users": {"alice": 1001}, "groups": {"cv-lab": ["alice"]}, "tenants": {"vision": ["alice"]},
     "gpus": [{"model": "A100-SXM4-40GB", "count": 2, "owner": "vision",
               "mig": {"enabled": true, "layout": ["3g.20gb", "2g.10gb:0", "1g.5gb"]}}],
     "workloads": [{"kind": "training", "user": "alice", "gpu": 0, "instance": 0}]}
"""

from __future__ import annotations

import datetime
import json
import math
import os
import pkgutil
import re
from dataclasses import dataclass, field, replace
from typing import Any, Dict, List, Mapping, NoReturn, Optional, Pattern, Sequence, Tuple, Union

from gpuops.core.mig.catalog import GpuInstanceProfile
from gpuops.core.units import UnitError, parse_bytes, parse_duration, parse_percent
from gpuops.node.sim import workloads as wl
from gpuops.node.sim.device import Hardware, known_models, resolve_hardware

MAX_GPUS = 64
MAX_WORKLOADS = 1024
MAX_USERS = 4096
DEFAULT_START = -30 * 86400.0  # workloads without a start have been running for a month
SPEC_VERSION = 1

# Fields a spec may mark unsupported on a GPU, so upper layers meet n/a values.
UNSUPPORTED_FIELDS = (
    "utilization_gpu",
    "utilization_memory",
    "memory",
    "power",
    "temperature",
    "sm_clock",
    "memory_clock",
    "power_limit",
    "process_memory",
)

_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.@-]{0,63}\Z")
_HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?\Z")
_VERSION_RE = re.compile(r"^\d{1,4}(\.\d{1,4}){0,3}\Z")
_OFFSET_RE = re.compile(r"^([+-])(\d{1,2}):?(\d{2})\Z")


class SpecError(Exception):
    """A spec mistake; `path` names the field (``gpus[2].model``), `message` says what is wrong."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__("%s: %s" % (path, message) if path else message)
        self.path = path
        self.message = message


def _fail(path: str, message: str) -> NoReturn:
    raise SpecError(path, message)


_KEY_RE = re.compile(r"^[A-Za-z0-9_@-][A-Za-z0-9_.@-]*\Z")


def _join(path: str, key: str) -> str:
    """`path.key`, or `path["odd key"]` when the key has characters that would garble the path."""
    if not _KEY_RE.fullmatch(key) or len(key) > 64:  # fullmatch: "$" would allow a final newline
        return "%s[%s]" % (path, json.dumps(key[:64]))
    return "%s.%s" % (path, key) if path else key


# ---- the parsed spec ------------------------------------------------------------------------


@dataclass(frozen=True)
class InstanceSpec:
    """One GPU instance of a MIG layout, in creation order."""

    profile: Union[str, int]  # name ("3g.20gb") or profile id (9)
    start: Optional[int]  # memory slice; None: the driver's default placement
    compute_instances: Tuple[Union[str, int], ...]  # CI profiles; empty: the GI's default CI
    path: str


@dataclass(frozen=True)
class GpuSpec:
    index: int
    hardware: Hardware
    owner: Optional[str]
    mig_enabled: bool
    mig_pending: Optional[bool]  # None: same as mig_enabled
    layout: Tuple[InstanceSpec, ...]
    lost: bool
    lost_at: Optional[float]  # seconds after the epoch
    unsupported: Tuple[str, ...]
    path: str
    compute_mode: Optional[str] = None  # AMD partition modes; None: the model's default (SPX, NPS1)
    memory_mode: Optional[str] = None


@dataclass(frozen=True)
class Footprint:
    """Memory a workload allocates on each target: a byte count, or a share of the target."""

    bytes: Optional[int] = None
    fraction: Optional[float] = None

    def on(self, total: int, default_fraction: float) -> int:
        if self.bytes is not None:
            return self.bytes
        return int(total * (self.fraction if self.fraction is not None else default_fraction))


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    kind: str
    tenant: Optional[str]
    user: str
    command: str
    gpus: Tuple[int, ...]  # empty only for a queued workload without a target yet
    instance: Optional[int]  # index into the GPU's MIG layout
    compute_instance: int  # index into that instance's compute instances
    memory: Footprint
    start: Optional[float]  # seconds after the epoch; None: queued until started
    stop: Optional[float]
    duration: Optional[float]
    params: Mapping[str, float]
    limiter: bool  # runs under gpuops' limiter, which tags its processes with the tenant
    path: str
    groups: Tuple[str, ...] = ()  # unix groups of its user (spec `groups` listing the user), in spec order


@dataclass(frozen=True)
class SimSpec:
    source: str
    description: str
    hostname: str
    seed: int
    epoch: Optional[float]  # absolute time the spec's relative times count from; None: start-up
    utc_offset: float  # seconds east of UTC, for the diurnal models
    driver_version: str
    cuda_driver_version: str
    users: Mapping[str, int]
    tenants: Mapping[str, Tuple[str, ...]]
    gpus: Tuple[GpuSpec, ...]
    workloads: Tuple[WorkloadSpec, ...]
    groups: Mapping[str, Tuple[str, ...]] = field(default_factory=dict)  # unix group -> its users


# ---- small typed readers --------------------------------------------------------------------


def _object(value: Any, path: str, known: Sequence[str]) -> Dict[str, Any]:
    if not isinstance(value, dict):
        _fail(path, "expected an object, got %s" % _kind(value))
    for key in value:
        if not isinstance(key, str):
            _fail(path, "keys must be strings, got %r" % (key,))
        if key not in known:
            _fail(_join(path, key), "unknown key (known: %s)" % ", ".join(known))
    return value


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _string(value: Any, path: str, pattern: Optional[Pattern[str]] = None, what: str = "") -> str:
    if not isinstance(value, str) or not value.strip():
        _fail(path, "expected a non-empty string, got %s" % _kind(value))
    if len(value) > 4096:
        _fail(path, "too long (%d characters)" % len(value))
    if pattern is not None and not pattern.match(value):
        _fail(path, "%r is not a valid %s" % (value[:80], what or "value"))
    return value


def _int(value: Any, path: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(path, "expected an integer, got %s" % _kind(value))
    if not low <= value <= high:
        _fail(path, "%d is out of range (%d..%d)" % (value, low, high))
    return value


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, bool):
        _fail(path, "expected true or false, got %s" % _kind(value))
    return value


def _list(value: Any, path: str, limit: int) -> List[Any]:
    if not isinstance(value, list):
        _fail(path, "expected a list, got %s" % _kind(value))
    if len(value) > limit:
        _fail(path, "at most %d items, got %d" % (limit, len(value)))
    return value


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(path, "expected a number, got %s" % _kind(value))
    number = float(value)
    if not math.isfinite(number):
        _fail(path, "expected a finite number")
    return number


def _offset_time(value: Any, path: str) -> float:
    """A time relative to the epoch: seconds (may be negative) or "-3d", "+2h", "90m"."""
    if isinstance(value, str):
        text = value.strip()
        sign = 1.0
        if text[:1] in "+-" and text:
            sign = -1.0 if text[0] == "-" else 1.0
            text = text[1:]
        try:
            result = sign * parse_duration(text)
        except UnitError as exc:
            _fail(path, str(exc))
    else:
        result = _number(value, path)
    if abs(result) > 100 * 365 * 86400.0:
        _fail(path, "more than a century away from the epoch")
    return result


def _epoch(value: Any, path: str) -> float:
    if isinstance(value, str):
        text = value.strip()
        if text.endswith("Z") or text.endswith("z"):
            text = text[:-1] + "+00:00"
        try:
            moment = datetime.datetime.fromisoformat(text)
        except ValueError:
            _fail(path, "expected seconds since 1970 or an ISO date such as 2026-03-02T00:00:00Z")
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=datetime.timezone.utc)
        try:
            return moment.timestamp()
        except (OverflowError, ValueError, OSError):
            _fail(path, "date out of range")
    number = _number(value, path)
    if not 0 <= number < 1e11:
        _fail(path, "expected seconds since 1970")
    return number


def _utc_offset(value: Any, path: str) -> float:
    """ "+08:00", "-0530", or a number of hours; returns seconds."""
    if isinstance(value, str):
        match = _OFFSET_RE.match(value.strip())
        if not match:
            _fail(path, "expected an offset such as +08:00 or -05:30, or hours")
        sign, hours, minutes = match.groups()
        total = int(hours) * 3600 + int(minutes) * 60
        if int(minutes) >= 60:
            _fail(path, "minutes must be below 60")
        seconds = float(-total if sign == "-" else total)
    else:
        seconds = _number(value, path) * 3600.0
    if abs(seconds) > 14 * 3600:
        _fail(path, "offset beyond +/-14 hours")
    return seconds


# ---- top level ------------------------------------------------------------------------------

TOP_KEYS = (
    "version",
    "description",
    "hostname",
    "seed",
    "epoch",
    "utc_offset",
    "driver_version",
    "cuda_driver_version",
    "users",
    "groups",
    "tenants",
    "gpus",
    "workloads",
)
GPU_KEYS = ("model", "count", "owner", "mig", "partition", "lost", "lost_at", "unsupported")
PARTITION_KEYS = ("compute", "memory")
MIG_KEYS = ("enabled", "pending", "layout")
INSTANCE_KEYS = ("profile", "start", "compute_instances")
WORKLOAD_KEYS = (
    "name",
    "kind",
    "tenant",
    "user",
    "command",
    "gpu",
    "gpus",
    "instance",
    "compute_instance",
    "memory",
    "start",
    "stop",
    "duration",
    "params",
    "limiter",
)


def parse_spec(data: Any, source: str = "<dict>") -> SimSpec:
    """Check a spec given as JSON data; raises SpecError with the path of the first mistake."""
    top = _object(data, "", TOP_KEYS)
    if "version" in top:
        _int(top["version"], "version", SPEC_VERSION, SPEC_VERSION)
    description = _string(top["description"], "description") if "description" in top else ""
    hostname = _string(top.get("hostname", "sim-node"), "hostname", _HOST_RE, "host name")
    seed = _int(top.get("seed", 0), "seed", 0, 2**63 - 1)
    epoch = _epoch(top["epoch"], "epoch") if "epoch" in top else None
    utc_offset = _utc_offset(top["utc_offset"], "utc_offset") if "utc_offset" in top else 0.0
    driver = _string(top.get("driver_version", "550.54.15"), "driver_version", _VERSION_RE, "driver version")
    cuda = _string(top.get("cuda_driver_version", "12.4"), "cuda_driver_version", _VERSION_RE, "CUDA version")
    users = _parse_users(top.get("users", {}), "users")
    groups = _parse_groups(top.get("groups", {}), "groups", users)
    tenants = _parse_tenants(top.get("tenants", {}), "tenants", users)
    gpus = _parse_gpus(top.get("gpus", []), "gpus", tenants)
    workloads = _parse_workloads(top.get("workloads", []), "workloads", users, tenants, gpus)
    if groups:
        workloads = tuple(replace(w, groups=groups_of(w.user, groups)) for w in workloads)
    return SimSpec(
        source=source,
        description=description,
        hostname=hostname,
        seed=seed,
        epoch=epoch,
        utc_offset=utc_offset,
        driver_version=driver,
        cuda_driver_version=cuda,
        users=users,
        tenants=tenants,
        gpus=gpus,
        workloads=workloads,
        groups=groups,
    )


def _parse_users(value: Any, path: str) -> Dict[str, int]:
    if not isinstance(value, dict):
        _fail(path, "expected an object of user name -> uid, got %s" % _kind(value))
    if len(value) > MAX_USERS:
        _fail(path, "at most %d users" % MAX_USERS)
    users: Dict[str, int] = {}
    for name, uid in value.items():
        where = _join(path, str(name))
        _string(name, where, _NAME_RE, "user name")
        users[name] = _int(uid, where, 0, 2**32 - 2)
    return users


def _parse_groups(value: Any, path: str, users: Mapping[str, int]) -> Dict[str, Tuple[str, ...]]:
    """Unix groups and their members, as /etc/group lists them: {"cv-lab": ["alice", "bob"]}."""
    if not isinstance(value, dict):
        _fail(path, "expected an object of group name -> list of users, got %s" % _kind(value))
    if len(value) > MAX_USERS:
        _fail(path, "at most %d groups" % MAX_USERS)
    groups: Dict[str, Tuple[str, ...]] = {}
    for group, members in value.items():
        where = _join(path, str(group))
        _string(group, where, _NAME_RE, "group name")
        names: List[str] = []
        for i, member in enumerate(_list(members, where, MAX_USERS)):
            at = "%s[%d]" % (where, i)
            _string(member, at, _NAME_RE, "user name")
            if users and member not in users:
                _fail(at, "unknown user %r (not in users)" % member)
            if member in names:
                _fail(at, "user %r is listed twice" % member)
            names.append(member)
        groups[group] = tuple(names)
    return groups


def groups_of(user: str, groups: Mapping[str, Sequence[str]]) -> Tuple[str, ...]:
    """The groups listing `user`, in spec order (what the node reports for its processes)."""
    return tuple(group for group, members in groups.items() if user in members)


def _parse_tenants(value: Any, path: str, users: Mapping[str, int]) -> Dict[str, Tuple[str, ...]]:
    if not isinstance(value, dict):
        _fail(path, "expected an object of team -> list of users, got %s" % _kind(value))
    tenants: Dict[str, Tuple[str, ...]] = {}
    for team, members in value.items():
        where = _join(path, str(team))
        _string(team, where, _NAME_RE, "team name")
        names = []
        for i, member in enumerate(_list(members, where, MAX_USERS)):
            at = "%s[%d]" % (where, i)
            _string(member, at, _NAME_RE, "user name")
            if users and member not in users:
                _fail(at, "unknown user %r (not in users)" % member)
            names.append(member)
        tenants[team] = tuple(names)
    return tenants


def _parse_gpus(value: Any, path: str, tenants: Mapping[str, Tuple[str, ...]]) -> Tuple[GpuSpec, ...]:
    out: List[GpuSpec] = []
    for i, entry in enumerate(_list(value, path, MAX_GPUS)):
        where = "%s[%d]" % (path, i)
        if isinstance(entry, str):
            entry = {"model": entry}
        item = _object(entry, where, GPU_KEYS)
        if "model" not in item:
            _fail(_join(where, "model"), "missing (known: %s)" % ", ".join(known_models()))
        model_text = _string(item["model"], _join(where, "model"))
        hardware = resolve_hardware(model_text)
        if hardware is None:
            _fail(
                _join(where, "model"),
                "unknown model %r (known: %s)" % (model_text[:80], ", ".join(known_models())),
            )
        count = _int(item.get("count", 1), _join(where, "count"), 1, MAX_GPUS)
        if len(out) + count > MAX_GPUS:
            _fail(_join(where, "count"), "a node has at most %d GPUs" % MAX_GPUS)
        owner = None
        if "owner" in item and item["owner"] is not None:
            owner = _string(item["owner"], _join(where, "owner"), _NAME_RE, "team name")
            if tenants and owner not in tenants:
                _fail(
                    _join(where, "owner"), "unknown team %r (known: %s)" % (owner, ", ".join(sorted(tenants)))
                )
        enabled, pending, layout = _parse_mig(item.get("mig", False), _join(where, "mig"), hardware)
        compute_mode, memory_mode = (
            _parse_partition(item["partition"], _join(where, "partition"), hardware)
            if "partition" in item
            else (None, None)
        )
        lost = _bool(item.get("lost", False), _join(where, "lost"))
        lost_at = _offset_time(item["lost_at"], _join(where, "lost_at")) if "lost_at" in item else None
        unsupported: List[str] = []
        for j, name in enumerate(_list(item.get("unsupported", []), _join(where, "unsupported"), 32)):
            at = "%s.unsupported[%d]" % (where, j)
            if name not in UNSUPPORTED_FIELDS:
                _fail(at, "unknown field %r (known: %s)" % (name, ", ".join(UNSUPPORTED_FIELDS)))
            unsupported.append(name)
        for _ in range(count):
            out.append(
                GpuSpec(
                    index=len(out),
                    hardware=hardware,
                    owner=owner,
                    mig_enabled=enabled,
                    mig_pending=pending,
                    layout=layout,
                    lost=lost,
                    lost_at=lost_at,
                    unsupported=tuple(unsupported),
                    path=where,
                    compute_mode=compute_mode,
                    memory_mode=memory_mode,
                )
            )
    return tuple(out)


def _parse_partition(value: Any, path: str, hardware: Hardware) -> Tuple[Optional[str], Optional[str]]:
    """{"compute": "CPX", "memory": "NPS4"} on a GPU with partition modes; either may be left out."""
    item = _object(value, path, PARTITION_KEYS)
    model = hardware.partition
    if model is None:
        _fail(path, "%s has no partition modes (AMD Instinct MI300 class only)" % hardware.name)
    modes: List[Optional[str]] = []
    for key, known in (("compute", tuple(model.compute)), ("memory", model.memory)):
        if key not in item:
            modes.append(None)
            continue
        mode = _string(item[key], _join(path, key))
        if mode not in known:
            _fail(
                _join(path, key),
                "%s has no %s mode %r (known: %s)" % (model.key, key, mode[:20], ", ".join(known)),
            )
        modes.append(mode)
    return modes[0], modes[1]


def _parse_mig(
    value: Any, path: str, hardware: Hardware
) -> Tuple[bool, Optional[bool], Tuple[InstanceSpec, ...]]:
    if isinstance(value, bool):
        value = {"enabled": value}
    item = _object(value, path, MIG_KEYS)
    enabled = _bool(item.get("enabled", False), _join(path, "enabled"))
    pending = _bool(item["pending"], _join(path, "pending")) if "pending" in item else None
    model = hardware.mig
    if model is None and (enabled or pending):
        _fail(_join(path, "enabled"), "%s does not support MIG" % hardware.name)
    if model is not None and model.architecture != "ampere" and pending is not None and pending != enabled:
        _fail(
            _join(path, "pending"),
            "%s switches MIG mode without a reset; it is never pending" % hardware.name,
        )
    layout: List[InstanceSpec] = []
    raw = _list(item.get("layout", []), _join(path, "layout"), 16)
    if raw and not enabled:
        _fail(_join(path, "layout"), "a MIG layout needs mig.enabled: true")
    for i, entry in enumerate(raw):
        where = "%s.layout[%d]" % (path, i)
        layout.append(_parse_instance(entry, where, hardware))
    return enabled, pending, tuple(layout)


def _parse_instance(entry: Any, path: str, hardware: Hardware) -> InstanceSpec:
    model = hardware.mig
    assert model is not None
    start: Optional[int] = None
    cis: Tuple[Union[str, int], ...] = ()
    if isinstance(entry, str):
        # nvidia-smi's own syntax: "3g.20gb", "9", "3g.20gb:4", "9:4".
        text, sep, where_start = entry.partition(":")
        profile: Union[str, int] = int(text) if _is_number(text) else text.strip()
        if sep:
            if not _is_number(where_start) or len(where_start.strip()) > 2:
                _fail(path, "expected PROFILE or PROFILE:START, got %r" % entry[:80])
            start = int(where_start)
    elif isinstance(entry, int) and not isinstance(entry, bool):
        profile = entry
    else:
        item = _object(entry, path, INSTANCE_KEYS)
        if "profile" not in item:
            _fail(_join(path, "profile"), "missing")
        raw = item["profile"]
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            _fail(_join(path, "profile"), "expected a profile name or id, got %s" % _kind(raw))
        profile = raw
        if "start" in item:
            start = _int(item["start"], _join(path, "start"), 0, 63)
        ci_list: List[Union[str, int]] = []
        for j, ci in enumerate(_list(item.get("compute_instances", []), _join(path, "compute_instances"), 8)):
            if isinstance(ci, bool) or not isinstance(ci, (str, int)):
                _fail(
                    "%s.compute_instances[%d]" % (path, j),
                    "expected a profile name or id, got %s" % _kind(ci),
                )
            ci_list.append(ci)
        cis = tuple(ci_list)
    try:
        gip = model.profile(profile)
    except (KeyError, ValueError, TypeError):
        _fail(
            path,
            "unknown GPU instance profile %r for %s (known: %s)"
            % (profile, model.key, ", ".join(p.name for p in model.profiles)),
        )
    for j, ci in enumerate(cis):
        if resolve_compute_profile(gip, ci) is None:
            _fail(
                "%s.compute_instances[%d]" % (path, j),
                "unknown compute instance profile %r for %s (known: %s)"
                % (ci, gip.name, ", ".join(c.name for c in gip.compute_profiles)),
            )
    return InstanceSpec(profile=profile, start=start, compute_instances=cis, path=path)


def _is_number(text: str) -> bool:
    text = text.strip()
    return 0 < len(text) <= 6 and text.isascii() and text.isdigit()


def resolve_compute_profile(profile: GpuInstanceProfile, wanted: Union[str, int]) -> Optional[int]:
    """A compute-instance profile id from an id (0-4), "1c", "1c.3g.20gb" or the GI's own name."""
    try:
        return int(profile.compute_profile(wanted).id)
    except (KeyError, ValueError, TypeError):
        return None


# ---- workloads ------------------------------------------------------------------------------


def _parse_workloads(
    value: Any,
    path: str,
    users: Mapping[str, int],
    tenants: Mapping[str, Tuple[str, ...]],
    gpus: Sequence[GpuSpec],
) -> Tuple[WorkloadSpec, ...]:
    out: List[WorkloadSpec] = []
    names = set()
    for i, entry in enumerate(_list(value, path, MAX_WORKLOADS)):
        where = "%s[%d]" % (path, i)
        spec = _parse_workload(entry, where, i, users, tenants, gpus)
        if spec.name in names:
            _fail(_join(where, "name"), "duplicate workload name %r" % spec.name)
        names.add(spec.name)
        out.append(spec)
    return tuple(out)


def _parse_workload(
    entry: Any,
    path: str,
    position: int,
    users: Mapping[str, int],
    tenants: Mapping[str, Tuple[str, ...]],
    gpus: Sequence[GpuSpec],
) -> WorkloadSpec:
    item = _object(entry, path, WORKLOAD_KEYS)
    if "kind" not in item:
        _fail(_join(path, "kind"), "missing (known: %s)" % ", ".join(wl.MODELS))
    kind = item["kind"]
    model = wl.get_model(kind) if isinstance(kind, str) else None
    if model is None:
        _fail(_join(path, "kind"), "unknown workload kind %r (known: %s)" % (kind, ", ".join(wl.MODELS)))
    name = (
        _string(item["name"], _join(path, "name"), _NAME_RE, "workload name")
        if "name" in item
        else "%s-%d" % (model.kind, position)
    )
    tenant, user = _parse_owner(item, path, users, tenants)
    command = _string(item["command"], _join(path, "command")) if "command" in item else model.default_command

    # Schedule: start/stop relative to the epoch; start "pending" queues the workload.
    start: Optional[float] = DEFAULT_START
    if "start" in item:
        raw = item["start"]
        start = None if raw in ("pending", None) else _offset_time(raw, _join(path, "start"))
    stop = (
        _offset_time(item["stop"], _join(path, "stop"))
        if "stop" in item and item["stop"] is not None
        else None
    )
    duration = None
    if "duration" in item:
        if stop is not None:
            _fail(_join(path, "duration"), "give stop or duration, not both")
        duration = _positive_duration(item["duration"], _join(path, "duration"))
        if start is not None:
            stop = start + duration
    if start is not None and stop is not None and stop <= start:
        _fail(_join(path, "stop"), "stops before it starts")

    # Target: whole GPUs, or one MIG instance (index into that GPU's layout).
    targets: List[int] = []
    if "gpu" in item and "gpus" in item:
        _fail(_join(path, "gpus"), "give gpu or gpus, not both")
    if "gpu" in item:
        targets = [_gpu_index(item["gpu"], _join(path, "gpu"), gpus)]
    elif "gpus" in item:
        raw_gpus = _list(item["gpus"], _join(path, "gpus"), MAX_GPUS)
        for j, g in enumerate(raw_gpus):
            index = _gpu_index(g, "%s.gpus[%d]" % (path, j), gpus)
            if index in targets:
                _fail("%s.gpus[%d]" % (path, j), "GPU %d listed twice" % index)
            targets.append(index)
    if not targets and start is not None:
        _fail(_join(path, "gpu"), "missing (only a workload with start: pending may lack a target)")
    instance: Optional[int] = None
    compute_instance = 0
    if "instance" in item:
        if len(targets) != 1:
            _fail(_join(path, "instance"), "a MIG instance target needs exactly one gpu")
        gpu = gpus[targets[0]]
        if not gpu.layout:
            _fail(_join(path, "instance"), "GPU %d has no MIG layout in the spec" % gpu.index)
        instance = _int(item["instance"], _join(path, "instance"), 0, len(gpu.layout) - 1)
        ci_count = max(len(gpu.layout[instance].compute_instances), 1)
        if "compute_instance" in item:
            compute_instance = _int(
                item["compute_instance"], _join(path, "compute_instance"), 0, ci_count - 1
            )
    elif "compute_instance" in item:
        _fail(_join(path, "compute_instance"), "needs instance")
    elif targets and any(gpus[g].mig_enabled for g in targets) and start is not None and start <= 0:
        _fail(_join(path, "gpu"), "GPU %d runs MIG: name the instance (index into its layout)" % targets[0])

    memory = _parse_memory(item.get("memory"), _join(path, "memory"), [gpus[g] for g in targets], instance)
    params = _parse_params(model, item.get("params", {}), _join(path, "params"))
    limiter = _bool(item.get("limiter", False), _join(path, "limiter"))
    return WorkloadSpec(
        name=name,
        kind=model.kind,
        tenant=tenant,
        user=user,
        command=command,
        gpus=tuple(targets),
        instance=instance,
        compute_instance=compute_instance,
        memory=memory,
        start=start,
        stop=stop,
        duration=duration,
        params=params,
        limiter=limiter,
        path=path,
    )


def _positive_duration(value: Any, path: str) -> float:
    try:
        if isinstance(value, bool) or not isinstance(value, (str, int, float)):
            raise UnitError("expected a duration such as 2h, got %s" % _kind(value))
        seconds = parse_duration(value)
    except UnitError as exc:
        _fail(path, str(exc))
    if seconds <= 0 or seconds > 100 * 365 * 86400.0:
        _fail(path, "expected a positive duration below a century")
    return seconds


def _gpu_index(value: Any, path: str, gpus: Sequence[GpuSpec]) -> int:
    if not gpus:
        _fail(path, "the spec has no GPUs")
    return _int(value, path, 0, len(gpus) - 1)


def _parse_owner(
    item: Mapping[str, Any], path: str, users: Mapping[str, int], tenants: Mapping[str, Tuple[str, ...]]
) -> Tuple[Optional[str], str]:
    tenant: Optional[str] = None
    if "tenant" in item and item["tenant"] is not None:
        tenant = _string(item["tenant"], _join(path, "tenant"), _NAME_RE, "team name")
        if tenants and tenant not in tenants:
            _fail(_join(path, "tenant"), "unknown team %r (known: %s)" % (tenant, ", ".join(sorted(tenants))))
    if "user" in item:
        user = _string(item["user"], _join(path, "user"), _NAME_RE, "user name")
        if users and user not in users:
            _fail(_join(path, "user"), "unknown user %r (known: %s)" % (user, ", ".join(sorted(users)[:20])))
        if tenant is not None and tenants.get(tenant) and user not in tenants[tenant]:
            _fail(_join(path, "user"), "user %r is not a member of team %r" % (user, tenant))
    elif tenant is not None and tenants.get(tenant):
        user = tenants[tenant][0]
    else:
        user = "root"
    if tenant is None:
        teams = [t for t, members in tenants.items() if user in members]
        if len(teams) == 1:
            tenant = teams[0]
    return tenant, user


def _parse_memory(value: Any, path: str, targets: Sequence[GpuSpec], instance: Optional[int]) -> Footprint:
    if value is None:
        return Footprint()
    if isinstance(value, str) and value.strip().endswith("%"):
        try:
            return Footprint(fraction=parse_percent(value) / 100.0)
        except UnitError as exc:
            _fail(path, str(exc))
    try:
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise UnitError("expected a size such as 20GiB or a share such as 80%%, got %s" % _kind(value))
        size = parse_bytes(value)
    except UnitError as exc:
        _fail(path, str(exc))
    for gpu in targets:
        total = gpu.hardware.memory_total_bytes
        if instance is not None and gpu.hardware.mig is not None:
            found = gpu.hardware.mig.find_profile(gpu.layout[instance].profile)
            if found is not None:
                total = int(found.memory_mib) * 1024 * 1024
        if size > total:
            _fail(path, "%d bytes do not fit in the %d bytes of GPU %d's target" % (size, total, gpu.index))
    return Footprint(bytes=size)


def _parse_params(model: wl.WorkloadModel, value: Any, path: str) -> Dict[str, float]:
    known = tuple(p.name for p in model.params)
    item = _object(value, path, known)
    params = model.defaults()
    for p in model.params:
        if p.name not in item:
            continue
        where = _join(path, p.name)
        raw = item[p.name]
        try:
            if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
                raise UnitError("expected a number, got %s" % _kind(raw))
            if p.unit == "percent":
                number = parse_percent(raw)
            elif p.unit == "duration":
                number = parse_duration(raw)
            else:
                number = _number(raw, where)
        except UnitError as exc:
            _fail(where, str(exc))
        if p.unit == "hour" and not 0 <= number < 24:
            _fail(where, "an hour of the day lies in 0..24")
        if p.unit == "fraction" and not 0 <= number <= 1:
            _fail(where, "a fraction lies in 0..1")
        if not 0 <= number <= 1e9:
            _fail(where, "out of range")
        params[p.name] = number
    return params


# ---- sources --------------------------------------------------------------------------------


def _reject_duplicates(pairs: List[Tuple[str, Any]]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError("duplicate key %r" % key)
        out[key] = value
    return out


def parse_json(text: str, source: str) -> SimSpec:
    """Parse spec text; a JSON mistake becomes a SpecError at "line L column C"."""
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as exc:
        _fail("line %d column %d" % (exc.lineno, exc.colno), "invalid JSON: %s" % exc.msg)
    except (ValueError, RecursionError) as exc:
        _fail("", "invalid JSON: %s" % exc)
    return parse_spec(data, source)


def builtin_scenarios() -> Tuple[str, ...]:
    """Names of the specs shipped in gpuops/node/sim/scenarios (works from a zipapp too)."""
    names: List[str] = []
    try:
        from importlib import resources

        files = getattr(resources, "files", None)
        if files is not None:
            for entry in files("gpuops.node.sim").joinpath("scenarios").iterdir():
                if entry.name.endswith(".json"):
                    names.append(entry.name[: -len(".json")])
        else:  # Python 3.8
            here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios")
            names = [n[: -len(".json")] for n in os.listdir(here) if n.endswith(".json")]
    except (OSError, ImportError, TypeError, AttributeError):
        pass
    return tuple(sorted(names))


def builtin_text(name: str) -> Optional[str]:
    if not re.match(r"^[A-Za-z0-9_-]+$", name):
        return None
    try:
        data = pkgutil.get_data("gpuops.node.sim", "scenarios/%s.json" % name)
    except (OSError, ValueError):
        return None
    return data.decode("utf-8") if data is not None else None


DEFAULT_SCENARIO = "demo-node"


def load_spec(source: Union[str, Mapping[str, Any], None]) -> SimSpec:
    """A spec from a dict, a file path, or the name of a built-in scenario (None: the demo)."""
    if source is None:
        source = DEFAULT_SCENARIO
    if not isinstance(source, str):
        return parse_spec(source, "<dict>")
    if os.path.isfile(source):
        try:
            with open(source, encoding="utf-8") as handle:
                text = handle.read(16 * 1024 * 1024 + 1)
        except (OSError, UnicodeDecodeError) as exc:
            _fail("", "cannot read: %s" % exc)
        if len(text) > 16 * 1024 * 1024:
            _fail("", "larger than 16 MiB")
        return parse_json(text, source)
    name = source[: -len(".json")] if source.endswith(".json") else source
    text_or_none = builtin_text(name) if os.sep not in source else None
    if text_or_none is None:
        _fail(
            "",
            "no such file, and not a built-in scenario (built-in: %s)" % ", ".join(builtin_scenarios()),
        )
    return parse_json(text_or_none, "builtin:" + name)
