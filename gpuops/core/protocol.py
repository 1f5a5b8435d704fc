"""The agent protocol: versioned JSON lines, the only seam between operator side and node side.

One JSON object per line, UTF-8. Requests carry an id chosen by the client; every reply echoes
it. A `watch` request is answered by a stream of events with the same id, ended by a final reply
when it is cancelled or has sent `count` events.

    -> {"v": 1, "id": 1, "op": "hello", "args": {"versions": [1]}}
    <- {"v": 1, "id": 1, "ok": true, "result": {"protocol": 1, "backend": "sim", ...}}
    -> {"v": 1, "id": 2, "op": "watch", "args": {"interval": 1.0, "delta": true}}
    <- {"v": 1, "id": 2, "event": "sample", "seq": 0, "result": {...NodeSample...}}
    <- {"v": 1, "id": 2, "event": "sample", "seq": 1, "delta": {"~": {...what changed...}}}

With `"rows": [field names of a GPU's sample]` as well (agents offering the "rows" capability),
the events after the first carry `"rows": [timestamp, [row per GPU], [GPU deltas]]` instead of
`delta` (core/delta.py `sample_rows`): each GPU's sample a row of values, null where unchanged.
With `"align": true` (the "align" capability) the samples after the first are taken at the
multiples of the interval on the node's clock, so every node of a fleet samples together.
With `"extras": [names]` (the "extras" capability; `sample` takes it too) the samples carry
fields that older operators would reject as unknown (core/codec.py decodes strictly), each only
when asked for (`EXTRAS`): "mig_utilization" (each MIG instance's `sm_utilization_percent`,
NVML's GPM) and "health" (the sample's `health`: the agent's NVML events and XID counts). A new
field is added this way, so that the protocol stays version 1 for old and new on both sides.
    -> {"v": 1, "id": 3, "op": "cancel", "args": {"id": 2}}
    <- {"v": 1, "id": 2, "ok": true, "result": {"events": 5, "cancelled": true}}
    <- {"v": 1, "id": 3, "ok": true, "result": {"cancelled": 2}}

Errors: {"v": 1, "id": <id or null>, "ok": false, "error": {"code": CODE, "message": TEXT}}.

The ops (`OPS`), each with its arguments' checker below:

- `hello` (versions), `inventory`, `sample`, `watch` (interval, count, delta, rows, align) and `cancel`
  (the id of a watch): what the node has and does, once or as a stream;
- `config`: the node's MPS daemons and limiter table, for `gpuops plan`;
- `mig_apply`, `mps_apply`, `limiter_apply`, `partition_apply`: the changes of `gpuops apply`
  (`MigApplyRequest`, `PartitionApplyRequest`, `MpsApplyRequest`, `LimiterApplyRequest`:
  dataclasses core/codec.py carries, each with its checks beside it, decoded by the agent with
  `codec.decode_args`);
- `history` (resolution "hour" or "minute", since, until, compress: `history_args`): the usage
  buckets the node's recorder kept (docs/history.md), for `gpuops tenants`, `rebalance` and the
  TUI's Pool screen; with `compress: "zlib"` (agents whose hello lists `history-zlib`) the result
  is `{"zlib": BASE64}`, the same result's JSON deflated (`inflate_history`).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import re
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from gpuops.core.mig.layout import MigLayout
from gpuops.core.tenant_table import TenantSpec

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)

# A request line is small; anything bigger is garbage or an attack on the agent's memory.
MAX_REQUEST_BYTES = 64 * 1024
# Replies carry whole nodes (hundreds of processes on an 8-GPU box fit easily).
MAX_REPLY_BYTES = 16 * 1024 * 1024

OPS = (
    "hello",
    "inventory",
    "sample",
    "watch",
    "cancel",
    "mig_apply",
    "config",
    "mps_apply",
    "limiter_apply",
    "history",
    "partition_apply",
)
MAX_CHANGES = 64  # GPUs changed by one mig_apply request, devices by one mps_apply request
MAX_TENANTS = 64  # tenants of one MPS device, lines of the limiter table
MAX_USERS = 64  # users of one MPS tenant
MAX_LIMITER_GPUS = 256  # GPU references of one limiter line

# Optional parts of a sample, sent only to a client that names them (`extras_arg`).
EXTRA_MIG_UTILIZATION = "mig_utilization"
EXTRA_HEALTH = "health"
EXTRAS = (EXTRA_MIG_UTILIZATION, EXTRA_HEALTH)

MIN_WATCH_INTERVAL = 0.05
MAX_WATCH_INTERVAL = 3600.0
MAX_WATCHES = 8

# Error codes, as both sides understand them.
PARSE_ERROR = "parse_error"  # the line is not JSON
INVALID_REQUEST = "invalid_request"  # JSON, but not a well-formed request
TOO_LARGE = "too_large"  # the line exceeds MAX_REQUEST_BYTES
UNSUPPORTED_VERSION = "unsupported_version"
UNKNOWN_OP = "unknown_op"
INVALID_ARGS = "invalid_args"
DUPLICATE_ID = "duplicate_id"  # a watch with this id is still running
TOO_MANY_WATCHES = "too_many_watches"
BACKEND_ERROR = "backend_error"  # the backend refused (message starts with the NVML code)
BACKEND_UNAVAILABLE = "backend_unavailable"  # no NVML, bad sim spec: the agent cannot serve
BUSY = "busy"  # another apply holds the node lock
STALE = "stale"  # the node changed since the plan was made (limiter table generation)
INTERNAL = "internal"

RequestId = Union[int, str]


class ProtocolError(ValueError):
    """A message broke the protocol; `code` is one of the error codes above."""

    def __init__(self, code: str, message: str, request_id: Optional[RequestId] = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.request_id = request_id


@dataclass(frozen=True)
class Request:
    id: RequestId
    op: str
    args: Dict[str, Any]


def _valid_id(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return -(2**53) <= value <= 2**53
    return isinstance(value, str) and 0 < len(value) <= 128


def parse_request(line: bytes) -> Request:
    """Decode and validate one request line; raises ProtocolError with the right code."""
    if len(line) > MAX_REQUEST_BYTES:
        raise ProtocolError(TOO_LARGE, "request of %d bytes exceeds %d" % (len(line), MAX_REQUEST_BYTES))
    try:
        data = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(PARSE_ERROR, "not a JSON line: %s" % (str(exc)[:200],)) from None
    if not isinstance(data, dict):
        raise ProtocolError(INVALID_REQUEST, "a request must be a JSON object")
    request_id = data.get("id")
    rid = request_id if _valid_id(request_id) else None
    if rid is None:
        raise ProtocolError(INVALID_REQUEST, "'id' must be an integer or a short string")
    version = data.get("v")
    if version not in SUPPORTED_VERSIONS or isinstance(version, bool):
        raise ProtocolError(
            UNSUPPORTED_VERSION,
            "protocol version %r is not supported (supported: %s)"
            % (version, ", ".join(str(v) for v in SUPPORTED_VERSIONS)),
            rid,
        )
    op = data.get("op")
    if not isinstance(op, str):
        raise ProtocolError(INVALID_REQUEST, "'op' must be a string", rid)
    if op not in OPS:
        raise ProtocolError(UNKNOWN_OP, "unknown op %r (known: %s)" % (op[:64], ", ".join(OPS)), rid)
    args = data.get("args", {})
    if not isinstance(args, dict):
        raise ProtocolError(INVALID_ARGS, "'args' must be an object", rid)
    unknown = sorted(set(data) - {"v", "id", "op", "args"})
    if unknown:
        raise ProtocolError(INVALID_REQUEST, "unknown key %r" % unknown[0][:64], rid)
    return Request(rid, op, args)


def watch_args(args: Dict[str, Any]) -> Tuple[float, Optional[int], bool]:
    """Validate a watch request's interval (seconds), optional event count, and whether events
    after the first carry only what changed (core/delta.py); `watch_rows` reads its `rows`."""
    unknown = sorted(set(args) - {"interval", "count", "delta", "rows", "align", "extras"})
    if unknown:
        raise ValueError("unknown argument %r" % unknown[0][:64])
    interval = args.get("interval", 1.0)
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval):
        raise ValueError("'interval' must be a number of seconds")
    if not MIN_WATCH_INTERVAL <= interval <= MAX_WATCH_INTERVAL:
        raise ValueError(
            "'interval' must lie between %g and %g seconds" % (MIN_WATCH_INTERVAL, MAX_WATCH_INTERVAL)
        )
    count = args.get("count")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise ValueError("'count' must be a positive integer")
    delta = args.get("delta", False)
    if not isinstance(delta, bool):
        raise ValueError("'delta' must be true or false")
    watch_rows(args)
    watch_align(args)
    extras_arg(args)
    return float(interval), count, delta


def extras_arg(args: Dict[str, Any]) -> Tuple[str, ...]:
    """A watch's or sample's `extras`: the optional parts of a sample the client understands
    (`EXTRAS`); names it does not know are refused, so a typo is not silently ignored."""
    extras = args.get("extras", [])
    if not isinstance(extras, list) or not all(isinstance(e, str) for e in extras):
        raise ValueError("'extras' must be a list of names (%s)" % ", ".join(EXTRAS))
    unknown = [e for e in extras if e not in EXTRAS]
    if unknown:
        raise ValueError("unknown extra %r (known: %s)" % (unknown[0][:64], ", ".join(EXTRAS)))
    return tuple(e for e in EXTRAS if e in extras)


def sample_args(args: Dict[str, Any]) -> Tuple[str, ...]:
    """A `sample` request's arguments: only `extras`."""
    unknown = sorted(set(args) - {"extras"})
    if unknown:
        raise ValueError("unknown argument %r" % unknown[0][:64])
    return extras_arg(args)


def watch_align(args: Dict[str, Any]) -> bool:
    """A watch request's `align`: after the first sample, sample at the multiples of the interval
    on the node's clock (UTC seconds), so that every node of a fleet samples at the same
    instants. Agents that offer the "align" capability take it."""
    align = args.get("align", False)
    if not isinstance(align, bool):
        raise ValueError("'align' must be true or false")
    return align


MAX_ROW_FIELDS = 64


def watch_rows(args: Dict[str, Any]) -> Optional[Tuple[str, ...]]:
    """A watch request's `rows`: the fields of a GPU's sample, in the order its deltas should
    carry them as rows (core/delta.py `sample_rows`); None for the plain delta form. Agents that
    offer the "rows" capability take it; it needs `delta`."""
    rows = args.get("rows")
    if rows is None:
        return None
    if (
        not isinstance(rows, list)
        or not 0 < len(rows) <= MAX_ROW_FIELDS
        or not all(isinstance(name, str) and 0 < len(name) <= 64 for name in rows)
        or len(set(rows)) != len(rows)
    ):
        raise ValueError("'rows' must be a list of 1 to %d distinct field names" % MAX_ROW_FIELDS)
    if args.get("delta") is not True:
        raise ValueError("'rows' needs 'delta': true")
    return tuple(rows)


# ---- per-GPU transactions: MIG layouts and partition modes --------------------------------------
# A change that re-lays a whole GPU (node/transaction.py): the GPU, what it should have, what the
# plan saw (`expect`: the node refuses the change otherwise) and the processes the plan said it
# stops (`known_pids`: the node stops no other, even forced). The plan's payload for a GPU is this
# very change (plan/model.py GpuPlan.mig / .partition); core/codec.py carries it, and `check`.

_COMPUTE_MODE_RE = re.compile(r"^[A-Z]PX\Z")
_MEMORY_MODE_RE = re.compile(r"^NPS[0-9]\Z")


def _check_gpu_change(gpu: int, expect: Optional[str], known_pids: Optional[Tuple[int, ...]]) -> None:
    if not 0 <= gpu < 256:
        raise ValueError("must be a GPU index", "gpu")
    if expect is not None and len(expect) > 64:
        raise ValueError("must be what the plan saw (at most 64 characters)", "expect")
    if known_pids is not None and (len(known_pids) > 4096 or not all(0 < p < 2**31 for p in known_pids)):
        raise ValueError("must be a list of process ids", "known_pids")


@dataclass(frozen=True)
class MigChange:
    """One GPU of a mig_apply request: the MIG layout wanted (explicit placements with compute
    instances), the GPU's fingerprint when the plan was made (core/mig/layout.py fingerprint)."""

    gpu: int
    layout: MigLayout
    expect: Optional[str] = None
    known_pids: Optional[Tuple[int, ...]] = None

    _json_unknown = "unknown key"

    def check(self) -> None:
        _check_gpu_change(self.gpu, self.expect, self.known_pids)


@dataclass(frozen=True)
class PartitionChange:
    """One GPU of a partition_apply request: the modes wanted (None: keep that one); `expect` the
    modes when the plan was made ("SPX/NPS1")."""

    gpu: int
    compute: Optional[str] = None
    memory: Optional[str] = None
    expect: Optional[str] = None
    known_pids: Optional[Tuple[int, ...]] = None

    _json_unknown = "unknown key"

    def check(self) -> None:
        _check_gpu_change(self.gpu, self.expect, self.known_pids)
        if self.compute is not None and not _COMPUTE_MODE_RE.match(self.compute):
            raise ValueError("must be a compute partition mode (SPX, CPX, ...)", "compute")
        if self.memory is not None and not _MEMORY_MODE_RE.match(self.memory):
            raise ValueError("must be a memory partition mode (NPS1, NPS4, ...)", "memory")
        if self.compute is None and self.memory is None:
            raise ValueError("names neither a compute nor a memory mode")


def _check_changes(changes: Tuple[Any, ...], what: str) -> None:
    if not 0 < len(changes) <= MAX_CHANGES:
        raise ValueError("must be a list of 1 to %d %s changes" % (MAX_CHANGES, what), "changes")
    seen = set()
    for n, change in enumerate(changes):
        if change.gpu in seen:
            raise ValueError("GPU %d is changed twice: each GPU once" % change.gpu, "changes", n, "gpu")
        seen.add(change.gpu)


@dataclass(frozen=True)
class MigApplyRequest:
    """The args of a mig_apply request: per-GPU MIG changes, each a transaction on the node
    (node/mig_apply.py), whether forced (processes in the way are ended), who asks."""

    changes: Tuple[MigChange, ...]
    force: bool = False
    holder: str = ""

    _json_unknown = "unknown argument"

    def check(self) -> None:
        _check_changes(self.changes, "GPU")
        _check_holder(self.holder)


@dataclass(frozen=True)
class PartitionApplyRequest:
    """The args of a partition_apply request: per-GPU partition mode changes, each a transaction
    on the node (node/partition_apply.py), whether forced, who asks."""

    changes: Tuple[PartitionChange, ...]
    force: bool = False
    holder: str = ""

    _json_unknown = "unknown argument"

    def check(self) -> None:
        _check_changes(self.changes, "GPU")
        _check_holder(self.holder)


_DEVICE_RE = re.compile(r"^(GPU|MIG)-[A-Za-z0-9/_.-]{1,120}\Z")
_TENANT_RE = re.compile(r"^[A-Za-z0-9._-]{1,63}\Z")
_USER_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}\$?\Z")
_GPU_REF_RE = re.compile(r"^[A-Za-z0-9_./:-]{1,128}\Z")
_MAX_BYTES = 1 << 60


# ---- MPS: a daemon per GPU or MIG device -------------------------------------------------------
# The plan's MPS payload for a GPU is `MpsSettings`: what every daemon of the GPU should run with;
# the devices are known at apply time (after a MIG change made them), and each daemon's
# `MpsChange` of the mps_apply request is `MpsSettings.change` for it. core/codec.py carries all
# three with `check` beside each.

MIB = 1 << 20


def _check_percentage(value: Optional[int], *where: Any) -> None:
    if value is not None and not 1 <= value <= 100:
        raise ValueError("must be a whole percentage from 1 to 100, or null", *where)


def _check_pinned(value: Optional[int], *where: Any) -> None:
    if value is not None and not MIB <= value <= _MAX_BYTES:
        raise ValueError("must be a number of bytes (at least %d), or null" % MIB, *where)


def _check_directory(value: str, *where: Any) -> None:
    if (
        not value.startswith("/")
        or len(value) > 255
        or not value.isprintable()
        or value.rstrip("/") == ""
        or any(part in (".", "..") for part in value.split("/"))
    ):
        raise ValueError("must be an absolute path without '.' or '..' (at most 255 characters)", *where)


@dataclass(frozen=True)
class MpsTenant:
    """A team's MPS values, for the MPS servers of its unix users."""

    name: str
    users: Tuple[str, ...] = ()  # unix user names whose MPS servers get these values (once each)
    active_thread_percentage: Optional[int] = None  # None: the device's default
    pinned_memory_limit: Optional[int] = None  # bytes; None: the device's default

    _json_unknown = "unknown key"

    def __post_init__(self) -> None:
        object.__setattr__(self, "users", tuple(dict.fromkeys(self.users)))

    def check(self) -> None:
        if not _TENANT_RE.match(self.name):
            raise ValueError("must be a tenant name (letters, digits, '.', '_', '-')", "name")
        if len(self.users) > MAX_USERS:
            raise ValueError("must be a list of at most %d user names" % MAX_USERS, "users")
        for user in self.users:
            if not _USER_RE.match(user):
                raise ValueError("%r is not a unix user name" % user[:40], "users")
        _check_percentage(self.active_thread_percentage, "active_thread_percentage")
        _check_pinned(self.pinned_memory_limit, "pinned_memory_limit")


def _check_tenants(tenants: Tuple[MpsTenant, ...]) -> None:
    if len(tenants) > MAX_TENANTS:
        raise ValueError("must be a list of at most %d tenants" % MAX_TENANTS, "tenants")
    names = set()
    users: Dict[str, str] = {}
    for n, tenant in enumerate(tenants):
        if tenant.name in names:
            raise ValueError(
                "tenant %s is listed twice: each tenant once" % tenant.name, "tenants", n, "name"
            )
        names.add(tenant.name)
        for user in tenant.users:
            if users.get(user, tenant.name) != tenant.name:
                raise ValueError(
                    "%s is also a user of tenant %s" % (user, users[user]), "tenants", n, "users"
                )
            users[user] = tenant.name


@dataclass(frozen=True)
class MpsChange:
    """MPS wanted on one device: a GPU (GPU-uuid) or a MIG device (MIG-uuid) of GPU `gpu`; its
    daemon's own pipe and log directories (a trailing / is dropped). `log_directory` may be None
    when MPS is to be stopped."""

    gpu: int
    device: str
    enabled: bool
    pipe_directory: str
    log_directory: Optional[str] = None
    active_thread_percentage: Optional[int] = None  # None: MPS's default (100)
    pinned_memory_limit: Optional[int] = None  # bytes; None: no limit
    tenants: Tuple[MpsTenant, ...] = ()

    _json_unknown = "unknown key"

    def __post_init__(self) -> None:
        object.__setattr__(self, "pipe_directory", self.pipe_directory.rstrip("/") or self.pipe_directory)
        if self.log_directory is not None:
            object.__setattr__(self, "log_directory", self.log_directory.rstrip("/") or self.log_directory)

    def check(self) -> None:
        if not 0 <= self.gpu < 256:
            raise ValueError("must be a GPU index", "gpu")
        if not _DEVICE_RE.match(self.device):
            raise ValueError("must be a GPU-... or MIG-... UUID", "device")
        _check_directory(self.pipe_directory, "pipe_directory")
        if self.log_directory is not None:
            _check_directory(self.log_directory, "log_directory")
        elif self.enabled:
            raise ValueError("is needed when MPS is enabled", "log_directory")
        _check_percentage(self.active_thread_percentage, "active_thread_percentage")
        _check_pinned(self.pinned_memory_limit, "pinned_memory_limit")
        _check_tenants(self.tenants)


@dataclass(frozen=True)
class MpsApplyRequest:
    """The args of an mps_apply request: the MPS wanted per device (node/mps_apply.py, each a
    change of its own), whether forced (clients in the way are ended), who asks."""

    changes: Tuple[MpsChange, ...]
    force: bool = False
    holder: str = ""

    _json_unknown = "unknown argument"

    def check(self) -> None:
        if not 0 < len(self.changes) <= MAX_CHANGES:
            raise ValueError("must be a list of 1 to %d device changes" % MAX_CHANGES, "changes")
        devices: Dict[str, int] = {}
        pipes: Dict[str, int] = {}
        for n, change in enumerate(self.changes):
            if change.device in devices:
                raise ValueError(
                    "%s is changed twice: each device once" % change.device, "changes", n, "device"
                )
            if change.pipe_directory in pipes:
                raise ValueError(
                    "%s is given to two devices" % change.pipe_directory, "changes", n, "pipe_directory"
                )
            devices[change.device] = pipes[change.pipe_directory] = n
        _check_holder(self.holder)


@dataclass(frozen=True)
class MpsSettings:
    """The MPS wanted on every daemon of one GPU: one for the GPU, or one per MIG device
    (`per_instance`), each in its own pipe and log directory under these (`<dir>/<device>`). The
    plan's MPS payload for the GPU (plan/model.py); the devices are read at apply time, after any
    MIG change made them, and each daemon gets `change(gpu, device)`."""

    enabled: bool
    per_instance: bool
    pipe_directory: str
    log_directory: str
    active_thread_percentage: Optional[int] = None  # None: MPS's default (100)
    pinned_memory_limit: Optional[int] = None  # bytes; None: no limit
    tenants: Tuple[MpsTenant, ...] = ()

    _json_unknown = "unknown key"

    def check(self) -> None:
        _check_directory(self.pipe_directory, "pipe_directory")
        _check_directory(self.log_directory, "log_directory")
        _check_percentage(self.active_thread_percentage, "active_thread_percentage")
        _check_pinned(self.pinned_memory_limit, "pinned_memory_limit")
        _check_tenants(self.tenants)

    def change(self, gpu: int, device: str) -> MpsChange:
        """The mps_apply change of the daemon of `device` (GPU-... or MIG-...) of GPU `gpu`."""
        return MpsChange(
            gpu=gpu,
            device=device,
            enabled=self.enabled,
            pipe_directory="%s/%s" % (self.pipe_directory, device),
            log_directory="%s/%s" % (self.log_directory, device),
            active_thread_percentage=self.active_thread_percentage,
            pinned_memory_limit=self.pinned_memory_limit,
            tenants=self.tenants,
        )


def _unknown(where: str, data: Dict[str, Any], known: Tuple[str, ...]) -> None:
    unknown = sorted(str(k) for k in set(data) - set(known))
    if unknown:
        what = "key" if where else "argument"
        raise ValueError("%sunknown %s %r" % (where, what, unknown[0][:64]))


def _check_holder(holder: str) -> None:
    if len(holder) > 200:
        raise ValueError("must be a short string", "holder")


@dataclass(frozen=True)
class LimiterApplyRequest:
    """The args of a limiter_apply request: the node's whole tenant table (`TenantSpec` lines,
    core/tenant_table.py, GPUs by UUID or index), the generation the plan saw (None: do not
    check) and who asks. core/codec.py carries it and runs `check` (and each line's) on both
    sides."""

    tenants: Tuple[TenantSpec, ...]
    expect_generation: Optional[int] = None
    holder: str = ""

    _json_unknown = "unknown argument"

    def check(self) -> None:
        if len(self.tenants) > MAX_TENANTS:
            raise ValueError("must be a list of at most %d tenant lines" % MAX_TENANTS, "tenants")
        seen = set()
        for n, line in enumerate(self.tenants):
            if line.memory is not None and not 1 <= line.memory <= _MAX_BYTES:
                raise ValueError("must be a number of bytes (at least 1), or null", "tenants", n, "memory")
            if len(line.gpus) > MAX_LIMITER_GPUS:
                raise ValueError(
                    "must be a list of at most %d GPU indices or UUIDs" % MAX_LIMITER_GPUS,
                    "tenants",
                    n,
                    "gpus",
                )
            for g in line.gpus:
                if not _GPU_REF_RE.match(g):
                    raise ValueError("%r is not a GPU index or UUID" % g[:40], "tenants", n, "gpus")
            if (line.name, line.gpus) in seen:
                raise ValueError("tenant %s appears twice for the same GPUs" % line.name, "tenants", n)
            seen.add((line.name, line.gpus))
        if self.expect_generation is not None and not 0 <= self.expect_generation < 2**63:
            raise ValueError("must be a table generation (an integer >= 0), or null", "expect_generation")
        _check_holder(self.holder)


@dataclass(frozen=True)
class LimiterConfig:
    """The limiter part of a `config` reply: where the table is, its generation (None when it
    cannot be read, with `error`) and its lines."""

    directory: str = ""
    generation: Optional[int] = 0
    tenants: Tuple[TenantSpec, ...] = ()
    error: str = field(default="", metadata={"omit_default": True})


# ---- replies of the write path ----------------------------------------------------------------
# Built by the node (node/agent.py, mig_apply.py, mps_apply.py), put on the wire by
# core/codec.py (`mig_apply_reply_json`, ...) and rebuilt by the operator with `from_json`, which
# checks every field and names the bad one (`MigApplyReply.results[1].gpu: expected an integer`).


@dataclass(frozen=True)
class MigResult:
    """One GPU of a mig_apply reply: done (`changed`, the pids `stopped` first), or refused with
    `code` (node/mig_apply.py ApplyError codes, or "journal") and `message`."""

    gpu: int
    ok: bool
    changed: bool = False
    stopped: Tuple[int, ...] = ()
    code: str = ""
    message: str = ""


@dataclass(frozen=True)
class MigApplyReply:
    results: Tuple[MigResult, ...]
    # What finishing the journals of an interrupted apply did (or refused) on other GPUs.
    recovered: Tuple[str, ...] = ()


@dataclass(frozen=True)
class PartitionResult:
    """One GPU of a partition_apply reply: done (`changed`, the modes now, the pids `stopped`
    first), or refused with `code` (node/partition_apply.py's codes, or "journal") and `message`."""

    gpu: int
    ok: bool
    changed: bool = False
    compute_mode: str = ""
    memory_mode: str = ""
    stopped: Tuple[int, ...] = ()
    code: str = ""
    message: str = ""


@dataclass(frozen=True)
class PartitionApplyReply:
    results: Tuple[PartitionResult, ...]
    # What finishing the journals of an interrupted partition change did on other GPUs.
    recovered: Tuple[str, ...] = ()


@dataclass(frozen=True)
class MpsClient:
    """An MPS client that a change would disrupt (in an `in_use` refusal)."""

    pid: int
    user: str
    server: int  # the pid of the MPS server it is a client of


@dataclass(frozen=True)
class MpsResult:
    """One device of an mps_apply reply: what was done (`actions`, `notes`, the client pids
    `stopped`), or refused with `code` and `message` (docs/mps.md, Errors)."""

    device: str
    gpu: int
    ok: bool = True
    changed: bool = False
    actions: Tuple[str, ...] = ()
    notes: Tuple[str, ...] = ()
    stopped: Tuple[int, ...] = ()
    code: str = ""
    message: str = ""
    clients: Tuple[MpsClient, ...] = ()  # on the wire only when there are some


@dataclass(frozen=True)
class MpsApplyReply:
    results: Tuple[MpsResult, ...]


@dataclass(frozen=True)
class LimiterApplyReply:
    """The tenant table after a limiter_apply: its generation, whether it was rewritten, where."""

    generation: int
    changed: bool
    directory: str


# ---- history (core/history.py, node/history.py) ---------------------------------------------

HISTORY_DEFAULT_SPAN = {"hour": 7 * 86400.0, "minute": 7200.0}  # seconds before `until`
_MAX_TIME = 1e11  # seconds since 1970: year 5138


HISTORY_ZLIB = "history-zlib"  # the hello capability of agents that deflate history replies


def history_args(args: Dict[str, Any]) -> Tuple[str, Optional[float], Optional[float]]:
    """Validate a history request: resolution ("hour" or "minute", default hour), since and
    until (seconds since 1970; None: the agent's defaults, until = now and since = until - 7
    days for hours, 2 hours for minutes), and compress (absent, null or "zlib": the agent reads
    it from the args once they are valid)."""
    _unknown("", args, ("resolution", "since", "until", "compress"))
    if args.get("compress") not in (None, "zlib"):
        raise ValueError("'compress' must be 'zlib' or null")
    resolution = args.get("resolution", "hour")
    if not isinstance(resolution, str) or resolution not in HISTORY_DEFAULT_SPAN:
        raise ValueError("'resolution' must be 'hour' or 'minute'")
    out: List[Optional[float]] = []
    for name in ("since", "until"):
        value = args.get(name)
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or not 0 <= value <= _MAX_TIME
        ):
            raise ValueError("'%s' must be a time in seconds since 1970, or null" % name)
        out.append(None if value is None else float(value))
    since, until = out
    if since is not None and until is not None and since > until:
        raise ValueError("'since' must not be after 'until'")
    return str(resolution), since, until


def deflate_history(result_json: str) -> Dict[str, str]:
    """A history result's JSON as a `compress: "zlib"` reply carries it. Level 1: a week of a
    node's hours shrinks about 18 times either way, and the node spends the least on it."""
    return {"zlib": base64.b64encode(zlib.compress(result_json.encode("utf-8"), 1)).decode("ascii")}


def inflate_history(result: Any, limit: int = MAX_REPLY_BYTES) -> bytes:
    """The JSON of a deflated history result (`{"zlib": BASE64}`), at most `limit` bytes once
    inflated; ValueError("what is wrong") for anything else, so a bad or hostile reply is one
    line, and never more memory than an uncompressed reply may take."""
    if not isinstance(result, dict) or set(result) != {"zlib"} or not isinstance(result["zlib"], str):
        raise ValueError('expected {"zlib": BASE64} for a compressed history')
    try:
        packed = base64.b64decode(result["zlib"].encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError):
        raise ValueError("zlib: not base64") from None
    inflater = zlib.decompressobj()
    try:
        text = inflater.decompress(packed, limit)
        if inflater.unconsumed_tail:
            raise ValueError("zlib: more than %d bytes once inflated" % limit)
        text += inflater.flush()
        if len(text) > limit:
            raise ValueError("zlib: more than %d bytes once inflated" % limit)
    except zlib.error as exc:
        raise ValueError("zlib: %s" % exc) from None
    if not inflater.eof or inflater.unused_data:
        raise ValueError("zlib: the stream is cut short or followed by other data")
    return text


def hello_versions(args: Dict[str, Any]) -> int:
    """Pick the highest protocol version both sides speak."""
    unknown = sorted(set(args) - {"versions", "client"})
    if unknown:
        raise ValueError("unknown argument %r" % unknown[0][:64])
    offered = args.get("versions", [PROTOCOL_VERSION])
    if not isinstance(offered, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in offered
    ):
        raise ValueError("'versions' must be a list of integers")
    common = sorted(set(offered) & set(SUPPORTED_VERSIONS))
    if not common:
        raise ProtocolError(
            UNSUPPORTED_VERSION,
            "no common protocol version (client offers %s, agent speaks %s)"
            % (offered[:8], list(SUPPORTED_VERSIONS)),
        )
    return int(common[-1])


def encode(message: Dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), allow_nan=False).encode("utf-8") + b"\n"


def request(request_id: RequestId, op: str, args: Optional[Dict[str, Any]] = None) -> bytes:
    return encode({"v": PROTOCOL_VERSION, "id": request_id, "op": op, "args": args or {}})


def reply(request_id: Optional[RequestId], result: Any) -> bytes:
    return encode({"v": PROTOCOL_VERSION, "id": request_id, "ok": True, "result": result})


def error(request_id: Optional[RequestId], code: str, message: str) -> bytes:
    return encode(
        {"v": PROTOCOL_VERSION, "id": request_id, "ok": False, "error": {"code": code, "message": message}}
    )


def event(request_id: RequestId, name: str, seq: int, result: Any) -> bytes:
    return encode({"v": PROTOCOL_VERSION, "id": request_id, "event": name, "seq": seq, "result": result})


def delta_event(request_id: RequestId, name: str, seq: int, delta: Any) -> bytes:
    """An event that carries only what changed since the previous event of the same stream."""
    return encode({"v": PROTOCOL_VERSION, "id": request_id, "event": name, "seq": seq, "delta": delta})


def rows_event(request_id: RequestId, name: str, seq: int, rows: Any) -> bytes:
    """A delta event in the rows form (core/delta.py `sample_rows`)."""
    return encode({"v": PROTOCOL_VERSION, "id": request_id, "event": name, "seq": seq, "rows": rows})


@dataclass(frozen=True)
class Message:
    """A message from the agent, as the client sees it."""

    id: Optional[RequestId]
    ok: bool
    result: Any = None
    event: Optional[str] = None
    seq: int = 0
    error_code: str = ""
    error_message: str = ""
    delta: Any = None  # set instead of `result` on a delta event
    is_delta: bool = False
    rows: bool = False  # a delta event in the rows form (`delta` holds the rows)


_MESSAGE_DEFAULTS = {
    "id": None,
    "ok": True,
    "result": None,
    "event": None,
    "seq": 0,
    "error_code": "",
    "error_message": "",
    "delta": None,
    "is_delta": False,
    "rows": False,
}


def _event(rid: RequestId, name: str, seq: int, key: str, body: Any) -> Message:
    """An event's Message, built as its __init__ would (frozen, no __post_init__) at a fraction
    of the cost: one per sample per node."""
    message = object.__new__(Message)
    state = message.__dict__
    state.update(_MESSAGE_DEFAULTS)
    state["id"] = rid
    state["event"] = name
    state["seq"] = seq
    if key == "result":
        state["result"] = body
    else:
        state["delta"] = body
        state["is_delta"] = True
        state["rows"] = key == "rows"
    return message


def parse_message(line: bytes, loads: Callable[[bytes], Any] = json.loads) -> Message:
    """Decode and validate one line from an agent; raises ProtocolError(INVALID_REQUEST...).

    `loads` parses the JSON text (bytes); the operator side may pass a faster parser than the
    standard library's, as long as it raises ValueError on what is not JSON."""
    if len(line) > MAX_REPLY_BYTES:
        raise ProtocolError(TOO_LARGE, "agent message of %d bytes exceeds %d" % (len(line), MAX_REPLY_BYTES))
    try:
        data = loads(line)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(
            PARSE_ERROR, "agent sent a line that is not JSON: %s" % (str(exc)[:200],)
        ) from None
    if type(data) is not dict or data.get("v") not in SUPPORTED_VERSIONS or type(data.get("v")) is not int:
        raise ProtocolError(INVALID_REQUEST, "agent sent a message that is not a protocol v1 object")
    rid = data.get("id")
    if rid is not None and not _valid_id(rid):
        raise ProtocolError(INVALID_REQUEST, "agent sent a message with a malformed id")
    if "event" in data:
        name, seq = data.get("event"), data.get("seq")
        if type(name) is not str or type(seq) is not int or rid is None:
            raise ProtocolError(INVALID_REQUEST, "agent sent a malformed event")
        if "rows" in data:
            return _event(rid, name, seq, "rows", data["rows"])
        if "delta" in data:
            return _event(rid, name, seq, "delta", data["delta"])
        return _event(rid, name, seq, "result", data.get("result"))
    ok = data.get("ok")
    if ok is True:
        return Message(rid, True, data.get("result"))
    if ok is False:
        err = data.get("error")
        if (
            not isinstance(err, dict)
            or not isinstance(err.get("code"), str)
            or not isinstance(err.get("message"), str)
        ):
            raise ProtocolError(INVALID_REQUEST, "agent sent a malformed error")
        return Message(rid, False, error_code=err["code"], error_message=err["message"])
    raise ProtocolError(INVALID_REQUEST, "agent sent a message without 'ok' or 'event'")
