"""The agent protocol: versioned JSON lines, the only seam between operator side and node side.

One JSON object per line, UTF-8. Requests carry an id chosen by the client; every reply echoes
it. A `watch` request is answered by a stream of events with the same id, ended by a final reply
when it is cancelled or has sent `count` events.

    -> {"v": 1, "id": 1, "op": "hello", "args": {"versions": [1]}}
    <- {"v": 1, "id": 1, "ok": true, "result": {"protocol": 1, "backend": "sim", ...}}
    -> {"v": 1, "id": 2, "op": "watch", "args": {"interval": 1.0, "delta": true}}
    <- {"v": 1, "id": 2, "event": "sample", "seq": 0, "result": {...NodeSample...}}
    <- {"v": 1, "id": 2, "event": "sample", "seq": 1, "delta": {"~": {...what changed...}}}
    -> {"v": 1, "id": 3, "op": "cancel", "args": {"id": 2}}
    <- {"v": 1, "id": 2, "ok": true, "result": {"events": 5, "cancelled": true}}
    <- {"v": 1, "id": 3, "ok": true, "result": {"cancelled": 2}}

Errors: {"v": 1, "id": <id or null>, "ok": false, "error": {"code": CODE, "message": TEXT}}.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple, Union

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)

# A request line is small; anything bigger is garbage or an attack on the agent's memory.
MAX_REQUEST_BYTES = 64 * 1024
# Replies carry whole nodes (hundreds of processes on an 8-GPU box fit easily).
MAX_REPLY_BYTES = 16 * 1024 * 1024

OPS = ("hello", "inventory", "sample", "watch", "cancel", "mig_apply")
MAX_CHANGES = 64  # GPUs changed by one mig_apply request

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
    after the first carry only what changed (core/delta.py)."""
    unknown = sorted(set(args) - {"interval", "count", "delta"})
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
    return float(interval), count, delta


@dataclass(frozen=True)
class MigChange:
    gpu: int
    layout: Any  # a MigLayout (core/mig/layout.py)
    expect: Optional[str]  # the GPU's fingerprint when the plan was made


def mig_apply_args(args: Dict[str, Any]) -> Tuple[Tuple[MigChange, ...], bool, str]:
    """Validate a mig_apply request: the changes per GPU, whether forced, who asks."""
    from gpuops.core.mig.layout import MigLayout

    unknown = sorted(set(args) - {"changes", "force", "holder"})
    if unknown:
        raise ValueError("unknown argument %r" % unknown[0][:64])
    changes = args.get("changes")
    if not isinstance(changes, list) or not 0 < len(changes) <= MAX_CHANGES:
        raise ValueError("'changes' must be a list of 1 to %d GPU changes" % MAX_CHANGES)
    out = []
    seen = set()
    for n, change in enumerate(changes):
        if not isinstance(change, dict) or set(change) - {"gpu", "layout", "expect"}:
            raise ValueError("changes[%d] must be an object with gpu, layout and expect" % n)
        gpu, expect = change.get("gpu"), change.get("expect")
        if isinstance(gpu, bool) or not isinstance(gpu, int) or not 0 <= gpu < 256 or gpu in seen:
            raise ValueError("changes[%d].gpu must be a GPU index, once" % n)
        if expect is not None and not (isinstance(expect, str) and len(expect) <= 64):
            raise ValueError("changes[%d].expect must be a fingerprint string" % n)
        try:
            layout = MigLayout.from_json(change.get("layout"))
        except ValueError as exc:
            raise ValueError("changes[%d].layout: %s" % (n, exc)) from None
        seen.add(gpu)
        out.append(MigChange(gpu, layout, expect))
    force, holder = args.get("force", False), args.get("holder", "")
    if not isinstance(force, bool):
        raise ValueError("'force' must be true or false")
    if not isinstance(holder, str) or len(holder) > 200:
        raise ValueError("'holder' must be a short string")
    return tuple(out), force, holder


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


def parse_message(line: bytes) -> Message:
    """Decode and validate one line from an agent; raises ProtocolError(INVALID_REQUEST...)."""
    if len(line) > MAX_REPLY_BYTES:
        raise ProtocolError(TOO_LARGE, "agent message of %d bytes exceeds %d" % (len(line), MAX_REPLY_BYTES))
    try:
        data = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ProtocolError(
            PARSE_ERROR, "agent sent a line that is not JSON: %s" % (str(exc)[:200],)
        ) from None
    if not isinstance(data, dict) or data.get("v") not in SUPPORTED_VERSIONS:
        raise ProtocolError(INVALID_REQUEST, "agent sent a message that is not a protocol v1 object")
    rid = data.get("id")
    if rid is not None and not _valid_id(rid):
        raise ProtocolError(INVALID_REQUEST, "agent sent a message with a malformed id")
    if "event" in data:
        name, seq = data.get("event"), data.get("seq")
        if not isinstance(name, str) or not isinstance(seq, int) or isinstance(seq, bool) or rid is None:
            raise ProtocolError(INVALID_REQUEST, "agent sent a malformed event")
        if "delta" in data:
            return Message(rid, True, event=name, seq=seq, delta=data["delta"], is_delta=True)
        return Message(rid, True, data.get("result"), event=name, seq=seq)
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
