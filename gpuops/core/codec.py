"""Strict conversion between model dataclasses and JSON-ready dicts.

Both sides of the agent protocol use this, so a malformed message is rejected with the path of
the offending field (e.g. ``Node.gpus[2].sample.power_watts: expected a number``) instead of
surfacing later as a TypeError deep in the TUI.

The operator side decodes every sample of every node, so decoders are compiled once per type
into closures that dispatch on the exact Python type of the value; the path of a bad field is
only assembled when there is an error (zero-cost `try` blocks on the good path).

What a type may say about its JSON (the write path's requests and lines use these):

- a field's metadata `{"json": "class"}`: its key in JSON, when that is not its name
  (`TenantSpec.klass`); `{"omit_default": True}`: left out when it has its default (a key older
  readers never saw), read back as the default when absent;
- a dataclass with `to_json()` and a static `from_json(data)` (`MigLayout`: its compact form) is
  carried in that form; `from_json` raises ValueError for what it refuses;
- a dataclass with `check()` has it called on every object decoded: the semantic checks live
  beside the type, and both sides run them. A `ValueError(message, *where)` it raises is the
  decoding's error, located at the object and `where` inside it (`"changes", 2, "gpu"`);
- `_json_unknown`, a class attribute: how an unknown key is called in its errors ("unknown key",
  "unknown argument"; default "unknown field").
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any, Callable, Dict, List, Tuple, Type, TypeVar, Union

from gpuops.core.model import Gpu, GpuSample, NodeSample, NotAvailable
from gpuops.core.protocol import (
    EXTRA_HEALTH,
    EXTRA_MIG_UTILIZATION,
    LimiterApplyReply,
    MigApplyReply,
    MigResult,
    MpsApplyReply,
    MpsResult,
    PartitionApplyReply,
)

T = TypeVar("T")

PathPart = Union[str, int]
Decoder = Callable[[Any], Any]


class DecodeError(ValueError):
    """A value does not fit the model; the message starts with the path of the field."""


class _Bad(Exception):
    """Raised inside compiled decoders; containers add their part of the path on the way out."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.parts: List[PathPart] = []


# ---- encoding --------------------------------------------------------------------------------


class _Shaped(Tuple[str, ...]):
    """The field names of a dataclass whose JSON renames or leaves out fields (or that has a
    form of its own, `own`): `keys` its JSON keys, `omit` (name, default) of omit_default fields."""

    keys: Tuple[str, ...] = ()
    omit: Tuple[Tuple[str, Any], ...] = ()
    own: bool = False


_FIELD_NAMES: Dict[type, Tuple[str, ...]] = {}
_SHAPES: Dict[type, Tuple[str, ...]] = {}


def _has_own_form(cls: type) -> bool:
    return callable(getattr(cls, "to_json", None)) and callable(getattr(cls, "from_json", None))


def _json_key(f: "dataclasses.Field[Any]") -> str:
    key = f.metadata.get("json", f.name) if f.metadata else f.name
    return str(key)


def _field_names(cls: type) -> Tuple[str, ...]:
    fields = dataclasses.fields(cls)
    names = tuple(f.name for f in fields)
    keys = tuple(_json_key(f) for f in fields)
    omit = tuple((f.name, f.default) for f in fields if f.metadata and f.metadata.get("omit_default"))
    own = _has_own_form(cls)
    if keys == names and not omit and not own:
        return names
    shaped = _Shaped(names)
    shaped.keys, shaped.omit, shaped.own = keys, omit, own
    return shaped


def to_json(value: Any) -> Any:
    """Turn a model value (dataclasses, tuples, NotAvailable) into plain JSON data."""
    kind = type(value)
    if kind is int or kind is str or kind is bool or value is None:
        return value
    if kind is float:
        return value if math.isfinite(value) else {"na": "NOT_FINITE"}
    if kind is NotAvailable:
        return {"na": value.reason}
    names = _FIELD_NAMES.get(kind)
    if names is None and dataclasses.is_dataclass(value) and not isinstance(value, type):
        # Only plain dataclasses (the model's, sent on every sample) are remembered here, so
        # their path stays one lookup; a renamed or own-form one (the write path's) goes on.
        shape = _SHAPES.get(kind)
        if shape is None:
            shape = _field_names(kind)
            if type(shape) is _Shaped:
                _SHAPES[kind] = shape
        if type(shape) is _Shaped:
            return _shaped_json(value, shape)
        names = _FIELD_NAMES[kind] = shape
    if names is not None:
        out = {name: to_json(getattr(value, name)) for name in names}
        # A GPU without mode partitions sends no key for them: NVIDIA agents' messages stay
        # what older operators (strict about unknown fields) read.
        if kind is Gpu and out["partition"] is None:
            del out["partition"]
        return out
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, float):
        return to_json(float(value))
    return value


def _shaped_json(value: Any, shape: _Shaped) -> Any:
    if shape.own:
        return value.to_json()
    left_out = {name for name, default in shape.omit if getattr(value, name) == default}
    return {
        key: to_json(getattr(value, name)) for name, key in zip(shape, shape.keys) if name not in left_out
    }


def sample_to_json(sample: NodeSample, extras: Tuple[str, ...] = ()) -> Dict[str, Any]:
    """A node sample as the agent sends it to a client that understands `extras`
    (core/protocol.py EXTRAS): the optional parts it did not name are left out, so a client
    older than them (whose decoder refuses unknown fields) reads the sample as before."""
    data: Dict[str, Any] = to_json(sample)
    if EXTRA_HEALTH not in extras or sample.health is None:
        data.pop("health", None)
    if EXTRA_MIG_UTILIZATION not in extras:
        for gpu in data["gpus"]:
            for mig in gpu["mig_samples"]:
                mig.pop("sm_utilization_percent", None)
    return data


# ---- write-path replies (core/protocol.py) ---------------------------------------------------
# The JSON is what agents sent before these types existed, key for key: a MIG result carries
# `changed` and `stopped` when done, `code` and `message` when refused; an MPS result every key,
# `clients` only when a refusal names some. `from_json` reads each back (absent keys: defaults).


def mig_result_json(result: MigResult) -> Dict[str, Any]:
    if result.ok:
        return {"gpu": result.gpu, "changed": result.changed, "stopped": list(result.stopped), "ok": True}
    return {"gpu": result.gpu, "ok": False, "code": result.code, "message": result.message}


def mig_apply_reply_json(reply: MigApplyReply) -> Dict[str, Any]:
    return {"results": [mig_result_json(r) for r in reply.results], "recovered": list(reply.recovered)}


def partition_apply_reply_json(reply: PartitionApplyReply) -> Dict[str, Any]:
    """Every key of each result (the type is newer than the agents that send none)."""
    out: Dict[str, Any] = to_json(reply)
    return out


def mps_result_json(result: MpsResult) -> Dict[str, Any]:
    out: Dict[str, Any] = to_json(result)
    if not result.clients:
        del out["clients"]
    return out


def mps_apply_reply_json(reply: MpsApplyReply) -> Dict[str, Any]:
    return {"results": [mps_result_json(r) for r in reply.results]}


def limiter_apply_reply_json(reply: LimiterApplyReply) -> Dict[str, Any]:
    return {"generation": reply.generation, "changed": reply.changed, "directory": reply.directory}


# ---- decoding --------------------------------------------------------------------------------


def from_json(cls: Type[T], data: Any, path: str = "") -> T:
    """Build `cls` from JSON data, checking every field's type; raises DecodeError."""
    try:
        return typing.cast(T, _decoder(cls)(data))
    except _Bad as exc:
        raise _located(cls, path, exc) from None


def decode_args(cls: Type[T], op: str, args: Any) -> T:
    """A request's args as its dataclass of core/protocol.py, every field and check run; raises
    DecodeError("limiter_apply: tenants[2].compute: ..."), which the agent answers with
    invalid_args."""
    return from_json(cls, args, op + ": ")


def _located(cls: Any, path: str, exc: _Bad) -> DecodeError:
    """The error a user sees: the path of the bad field (`Node.gpus[2].sample.power_watts`)."""
    where = path or getattr(cls, "__name__", str(cls))
    for part in reversed(exc.parts):
        if isinstance(part, int):
            where += "[%d]" % part
        else:  # a path that ends with a space ("plan.json: ") takes the first field bare
            where += part if where.endswith(" ") else "." + part
    if where.endswith(": "):  # an error of the object itself
        where = where[:-2]
    return DecodeError("%s: %s" % (where, exc.message))


_DECODERS: Dict[Any, Decoder] = {}


def _decoder(tp: Any) -> Decoder:
    found = _DECODERS.get(tp)
    if found is None:
        found = _compile(tp)
        _DECODERS[tp] = found
    return found


def _origin(tp: Any) -> Any:
    return typing.get_origin(tp) if hasattr(typing, "get_origin") else getattr(tp, "__origin__", None)


def _args(tp: Any) -> Tuple[Any, ...]:
    return typing.get_args(tp) if hasattr(typing, "get_args") else getattr(tp, "__args__", ())


_UNION_TYPE = getattr(types, "UnionType", None)  # `int | None` (Python 3.10+)


def _compile(tp: Any) -> Decoder:
    origin = _origin(tp)
    if tp is Any:
        return lambda data: data
    if origin is Union or (_UNION_TYPE is not None and origin is _UNION_TYPE):
        return _compile_union(_args(tp))
    if origin in (tuple, typing.Tuple):
        return _compile_tuple(_args(tp))
    if origin in (dict, typing.Dict):
        key_decoder, value_decoder = (_decoder(a) for a in _args(tp))
        return _compile_dict(key_decoder, value_decoder)
    if tp is NotAvailable:
        return _decode_not_available
    if dataclasses.is_dataclass(tp):
        return _compile_dataclass(tp)
    simple = _SIMPLE.get(tp)
    if simple is not None:
        return simple
    raise TypeError("the codec cannot decode %r" % (tp,))


def _decode_int(data: Any) -> Any:
    if type(data) is int:
        return data
    raise _Bad("expected an integer")


def _decode_float(data: Any) -> Any:
    kind = type(data)
    if kind is float:
        if math.isfinite(data):
            return data
        raise _Bad("expected a finite number")
    if kind is int:
        return float(data)
    raise _Bad("expected a number")


def _decode_str(data: Any) -> Any:
    if type(data) is str:
        return data
    raise _Bad("expected a string")


def _decode_bool(data: Any) -> Any:
    if type(data) is bool:
        return data
    raise _Bad("expected true or false")


def _decode_none(data: Any) -> Any:
    if data is None:
        return None
    raise _Bad("expected null")


_SIMPLE: Dict[Any, Decoder] = {
    int: _decode_int,
    float: _decode_float,
    str: _decode_str,
    bool: _decode_bool,
    type(None): _decode_none,
}

# What each simple type accepts, by the exact Python type of the JSON value.
_ACCEPTS: Dict[Any, Tuple[type, ...]] = {
    int: (int,),
    float: (float, int),
    str: (str,),
    bool: (bool,),
    type(None): (type(None),),
}

_EXPECTED = {
    int: "an integer",
    float: "a number",
    str: "a string",
    bool: "true or false",
    type(None): "null",
}


_NOT_AVAILABLE: Dict[str, NotAvailable] = {}  # one immutable instance per reason (a few NVML codes)


def _decode_not_available(data: Any) -> Any:
    if type(data) is dict and len(data) == 1:
        reason = data.get("na")
        if type(reason) is str:
            found = _NOT_AVAILABLE.get(reason)
            if found is None:
                found = NotAvailable(reason)
                if len(_NOT_AVAILABLE) < 64:
                    _NOT_AVAILABLE[reason] = found
            return found
    raise _Bad('expected {"na": REASON}')


def _compile_union(members: Tuple[Any, ...]) -> Decoder:
    by_type: Dict[type, Decoder] = {}
    object_members: List[Any] = []
    expected: List[str] = []
    for member in members:
        accepts = _ACCEPTS.get(member)
        if accepts is not None:
            for kind in accepts:
                by_type.setdefault(kind, _decoder(member))
            expected.append(_EXPECTED[member])
        elif _origin(member) in (tuple, typing.Tuple):
            by_type.setdefault(list, _decoder(member))
            expected.append("a list")
        else:
            object_members.append(member)
    if NotAvailable in object_members:
        expected.append('{"na": REASON}')
    others = [m for m in object_members if m is not NotAvailable]
    if others:
        expected.append("an object")
    other_decoder = _decoder(others[0]) if others else None
    has_na = NotAvailable in object_members
    message = "expected " + " or ".join(expected)

    def decode(data: Any) -> Any:
        found = by_type.get(type(data))
        if found is not None:
            return found(data)
        if type(data) is dict:
            # An object is either "not available" or the one other object type of the union:
            # decode it directly so that an error deep inside keeps its full path.
            if has_na and "na" in data:
                return _decode_not_available(data)
            if other_decoder is not None:
                return other_decoder(data)
        raise _Bad(message)

    return decode


def _compile_tuple(args: Tuple[Any, ...]) -> Decoder:
    if len(args) == 2 and args[1] is Ellipsis:
        item = _decoder(args[0])

        def decode_items(data: Any) -> Any:
            if type(data) is not list:
                raise _Bad("expected a list")
            index = 0
            try:
                out = []
                for index, value in enumerate(data):  # noqa: B007 (read in the except)
                    out.append(item(value))
                return tuple(out)
            except _Bad as exc:
                exc.parts.append(index)
                raise

        return decode_items
    fixed = [_decoder(a) for a in args]

    def decode_fixed(data: Any) -> Any:
        if type(data) is not list:
            raise _Bad("expected a list")
        if len(data) != len(fixed):
            raise _Bad("expected %d items" % len(fixed))
        index = 0
        try:
            out = []
            for index, (dec, value) in enumerate(zip(fixed, data)):  # noqa: B007 (read in the except)
                out.append(dec(value))
            return tuple(out)
        except _Bad as exc:
            exc.parts.append(index)
            raise

    return decode_fixed


def _compile_dict(key_decoder: Decoder, value_decoder: Decoder) -> Decoder:
    def decode(data: Any) -> Any:
        if type(data) is not dict:
            raise _Bad("expected an object")
        key = ""
        try:
            out = {}
            for key, value in data.items():
                out[key_decoder(key)] = value_decoder(value)
            return out
        except _Bad as exc:
            exc.parts.append(str(key))
            raise

    return decode


def _checked(error: ValueError) -> _Bad:
    """A check's ValueError(message, *where) as the decoding's error."""
    message = str(error.args[0]) if error.args else str(error)
    bad = _Bad(message)
    bad.parts.extend(reversed(error.args[1:]))
    return bad


def _compile_own(cls: Any) -> Decoder:
    read = cls.from_json

    def decode(data: Any) -> Any:
        try:
            return read(data)
        except ValueError as exc:
            raise _checked(exc) from None

    return decode


def _compile_plain(cls: Any, fields: List[Tuple[str, Decoder, bool]], known: Any) -> Decoder:
    """The decoder of a dataclass whose JSON keys are its field names, without checks: the
    model's, decoded for every sample of every node."""

    def decode(data: Any) -> Any:
        if type(data) is not dict:
            raise _Bad("expected an object")
        if not known.issuperset(data):
            unknown = sorted(k for k in data if k not in known)
            raise _Bad("unknown field %r" % (unknown[0],))
        kwargs = {}
        name = ""
        try:
            for name, dec, required in fields:
                if name in data:
                    kwargs[name] = dec(data[name])
                elif required:
                    raise _Bad("missing")
        except _Bad as exc:
            exc.parts.append(name)
            raise
        return cls(**kwargs)

    return decode


def _compile_dataclass(cls: Any) -> Decoder:
    if _has_own_form(cls):
        return _compile_own(cls)
    module = __import__(cls.__module__, fromlist=["_"])
    hints = typing.get_type_hints(cls, vars(module))
    fields: List[Tuple[str, str, Decoder, bool]] = []
    known = set()
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        key = _json_key(f)
        fields.append((f.name, key, _decoder(hints[f.name]), required))
        known.add(key)
    unknown_word = getattr(cls, "_json_unknown", "unknown field")
    check = getattr(cls, "check", None)
    if check is None and unknown_word == "unknown field" and all(name == key for name, key, _, _ in fields):
        return _compile_plain(cls, [(name, dec, required) for name, _, dec, required in fields], known)

    def decode(data: Any) -> Any:
        if type(data) is not dict:
            raise _Bad("expected an object")
        if not known.issuperset(data):
            unknown = sorted(str(k) for k in data if k not in known)
            raise _Bad("%s %r" % (unknown_word, unknown[0][:64]))
        kwargs = {}
        key = ""
        try:
            for name, key, dec, required in fields:
                if key in data:
                    kwargs[name] = dec(data[key])
                elif required:
                    raise _Bad("missing")
        except _Bad as exc:
            exc.parts.append(key)
            raise
        if check is None:
            return cls(**kwargs)
        try:
            made = cls(**kwargs)
            made.check()
        except ValueError as exc:
            raise _checked(exc) from None
        return made

    return decode


# ---- deltas (core/delta.py) ------------------------------------------------------------------

Applier = Callable[[Any, Any], Any]
Changer = Callable[[Any, Dict[str, Any]], Any]

# Builds a frozen model object from its instance dictionary (`object.__new__(cls)`, then this
# with "__dict__"): what its __init__ would build (none has a __post_init__), in one step.
_set_state = object.__setattr__


def from_delta(cls: Type[T], previous: T, delta: Any, path: str = "") -> T:
    """The object `delta` (core/delta.py) describes, built from `previous`.

    Unchanged parts are the previous objects themselves (they are immutable), and only what the
    delta carries is decoded and checked: the cost follows the size of the change. Raises
    DecodeError with the path of a part that does not fit.
    """
    try:
        return typing.cast(T, _applier(cls)(previous, delta))
    except _Bad as exc:
        raise _located(cls, path, exc) from None


_APPLIERS: Dict[Any, Applier] = {}
_CHANGERS: Dict[type, Changer] = {}


def _applier(tp: Any) -> Applier:
    found = _APPLIERS.get(tp)
    if found is None:
        found = _compile_applier(tp)
        _APPLIERS[tp] = found
    return found


def _changer(cls: type) -> Changer:
    found = _CHANGERS.get(cls)
    if found is None:
        # A placeholder first: a dataclass may contain itself (through its fields' appliers).
        _CHANGERS[cls] = lambda previous, body: _CHANGERS[cls](previous, body)
        found = _CHANGERS[cls] = _compile_changer(cls)
    return found


def _compile_applier(tp: Any) -> Applier:
    """Like the decoders, compiled once per declared type: which object classes a `~` delta may
    change here, and the applier of list items for `@`."""
    decode = _decoder(tp)
    members = _args(tp) if _origin(tp) is Union else (tp,)
    objects: Dict[type, Changer] = {}
    item: Any = None
    item_changers: Dict[type, Changer] = {}
    for member in members:
        if isinstance(member, type) and dataclasses.is_dataclass(member):
            objects[member] = _changer(member)
        args = _args(member)
        if _origin(member) in (tuple, typing.Tuple) and len(args) == 2 and args[1] is Ellipsis:
            item = _applier(args[0])
            item_members = _args(args[0]) if _origin(args[0]) is Union else (args[0],)
            for cls in item_members:
                if isinstance(cls, type) and dataclasses.is_dataclass(cls):
                    item_changers[cls] = _changer(cls)
    item_applier: Any = item

    def apply(previous: Any, delta: Any) -> Any:
        if type(delta) is not dict:
            return decode(delta)
        if len(delta) != 1:
            raise _Bad("a delta object has exactly one of the keys $, ~, @")
        ((kind, body),) = delta.items()
        if kind == "~":
            change = objects.get(type(previous))
            if change is None or type(body) is not dict:
                raise _Bad("a ~ delta needs an object here")
            return change(previous, body)
        if kind == "@":
            if item_applier is None or type(previous) is not tuple or type(body) is not dict:
                raise _Bad("an @ delta needs a list here")
            items = list(previous)
            index = -1
            try:
                for key, sub in body.items():
                    found = _INDEX.get(key)
                    if found is None or found >= len(items):
                        found = _index(key, len(items))
                    index = found
                    old = items[index]
                    # The usual item delta, a few fields of an object: straight to its changer.
                    change = item_changers.get(type(old))
                    changes = sub.get("~") if type(sub) is dict and len(sub) == 1 else None
                    if change is not None and type(changes) is dict:
                        items[index] = change(old, changes)
                    else:
                        items[index] = item_applier(old, sub)
            except _Bad as exc:
                if index >= 0:
                    exc.parts.append(index)
                raise
            return tuple(items)
        if kind == "$":
            return decode(body)
        raise _Bad("unknown delta kind %r" % (kind,))

    return apply


_INDEX = {str(i): i for i in range(1024)}  # list indices as deltas spell them


def _index(key: Any, length: int) -> int:
    if type(key) is not str or not key.isdigit() or len(key) > 9 or int(key) >= length:
        raise _Bad("no item %r in a list of %d" % (key, length))
    return int(key)


def _as_is(tp: Any) -> Tuple[type, ...]:
    """The exact JSON types that `tp`'s decoder returns unchanged (a float still needs its
    finiteness checked)."""
    if _origin(tp) is Union:
        out: Tuple[type, ...] = ()
        for member in _args(tp):
            out += _as_is(member)
        return out
    return (tp,) if tp in (int, float, str, bool, type(None)) else ()


def _field_appliers(cls: Any) -> Dict[str, Applier]:
    module = __import__(cls.__module__, fromlist=["_"])
    hints = typing.get_type_hints(cls, vars(module))
    return {f.name: _applier(hints[f.name]) for f in dataclasses.fields(cls)}


def _compile_changer(cls: Any) -> Changer:
    """How a `~` delta changes an instance of the dataclass `cls`: `change(previous, body)`.

    Most changes are a few readings (`{"used_memory_bytes": 4096}`): a value of its field's
    plain JSON type (an int for an IntMetric, a finite float for a FloatMetric, a string, ...)
    is taken as it is; anything else (a nested delta, NotAvailable, an int for a float) goes
    through the field's applier, which checks it and locates an error.
    """
    module = __import__(cls.__module__, fromlist=["_"])
    hints = typing.get_type_hints(cls, vars(module))
    takes = {f.name: _as_is(hints[f.name]) for f in dataclasses.fields(cls)}
    fields = _field_appliers(cls)

    def change(previous: Any, body: Dict[str, Any]) -> Any:
        # Model dataclasses are frozen and have no __post_init__: a copy of the instance
        # dictionary with the changed fields is the object their __init__ would build.
        state = previous.__dict__.copy()
        name = ""
        try:
            for name, value in body.items():
                take = takes.get(name)
                if take is None:
                    raise _Bad("unknown field %r" % (name,))
                kind = type(value)
                # (x - x is 0.0 for a finite float, nan for inf and nan)
                if kind in take and (kind is not float or value - value == 0.0):
                    state[name] = value
                else:
                    state[name] = fields[name](state[name], value)
        except _Bad as exc:
            exc.parts.append(name)
            raise
        new = object.__new__(cls)
        _set_state(new, "__dict__", state)
        return new

    return change


# ---- sample rows (core/delta.py `sample_rows`) -----------------------------------------------

# The fields of a GPU's sample, in the order of a row (what the client asks the agent for).
SAMPLE_ROW_FIELDS = tuple(f.name for f in dataclasses.fields(GpuSample))


def from_rows(previous: NodeSample, body: Any, path: str = "") -> NodeSample:
    """The sample that a rows delta (core/delta.py `sample_rows`) describes, built from
    `previous`: each GPU's sample from its row, the rest of the GPU from its delta; unchanged
    parts are the previous objects. Every value is checked as `from_json` checks it; raises
    DecodeError with the path of a bad field (`NodeSample.gpus[2].sample.power_watts`)."""
    if not _ROWS:
        _ROWS.append(_compile_rows())
    try:
        return typing.cast(NodeSample, _ROWS[0](previous, body))
    except _Bad as exc:
        raise _located(NodeSample, path, exc) from None


_ROWS: List[Callable[[Any, Any], Any]] = []
_MAX_SHAPES = 256  # kinds of rows remembered: a hostile agent cannot grow this without bound


def _compile_rows() -> Callable[[Any, Any], Any]:
    module = __import__(GpuSample.__module__, fromlist=["_"])
    hints = typing.get_type_hints(GpuSample, vars(module))
    names = SAMPLE_ROW_FIELDS
    width = len(names)
    decoders = tuple(_decoder(hints[n]) for n in names)
    takes = tuple(_as_is(hints[n]) for n in names)
    every = tuple(range(width))
    plans: Dict[Tuple[type, ...], Any] = {}
    gpu_fields = _field_appliers(Gpu)
    gpu_applier = _applier(Gpu)
    decode_float = _decoder(float)

    def plan_for(kinds: Tuple[type, ...]) -> Tuple[Tuple[int, ...], Tuple[int, ...], Tuple[int, ...]]:
        """The positions decoded, those taken as they are that must be finite floats, and the
        nulls (unchanged values)."""
        nulls = tuple(i for i in every if kinds[i] is type(None))
        through = tuple(i for i in every if kinds[i] not in takes[i] and i not in nulls)
        floats = tuple(i for i in every if kinds[i] is float and kinds[i] in takes[i])
        return through, floats, nulls

    def sample_of(row: Any, old: Any) -> Any:
        """The sample of a row that the generated fast path did not take, `old` the GPU's
        sample before: values to decode (NotAvailable, an int for a float), or an error to
        locate."""
        if type(row) is not list or len(row) != width:
            raise _Bad("expected a row of %d values" % width)
        kinds = tuple(map(type, row))
        plan = plans.get(kinds)
        if plan is None:
            plan = plan_for(kinds)
            if len(plans) < _MAX_SHAPES:
                plans[kinds] = plan
        through, floats, nulls = plan
        index = 0
        try:
            if nulls and old is None:
                index = nulls[0]
                raise _Bad("null (unchanged) but the GPU had no sample")
            values = list(row)
            for index in through:
                values[index] = decoders[index](values[index])
            for index in floats:
                if not math.isfinite(values[index]):
                    raise _Bad("expected a finite number")
        except _Bad as exc:
            exc.parts.append(names[index])
            raise
        state = old.__dict__.copy() if nulls else {}
        for name, value in zip(names, values):
            if value is not None:
                state[name] = value
        sample = object.__new__(GpuSample)
        _set_state(sample, "__dict__", state)
        return sample

    build = _compile_gpus(names, hints, sample_of)

    def apply_rows(previous: Any, body: Any) -> Any:
        if type(body) is not list or not 2 <= len(body) <= 3:
            raise _Bad("a rows delta is [timestamp, rows] or [timestamp, rows, GPU deltas]")
        try:
            timestamp = decode_float(body[0])
        except _Bad as exc:
            exc.parts.append("timestamp")
            raise
        gpus = previous.gpus
        count = len(gpus)
        rows = body[1]
        deltas = body[2] if len(body) == 3 else None
        if (
            type(rows) is not list
            or len(rows) != count
            or (deltas is not None and (type(deltas) is not list or len(deltas) != count))
        ):
            bad = _Bad("expected a row and a delta (or null) for each of the %d GPUs" % count)
            bad.parts.append("gpus")
            raise bad
        out: List[Any] = []
        try:
            build(gpus, rows, out)
        except _Bad as exc:  # from a row's sample (`sample_of`)
            exc.parts += ["sample", len(out), "gpus"]  # len(out): the GPU being built
            raise
        if deltas is not None:
            index = 0
            name = None
            try:
                for index in range(count):
                    delta = deltas[index]
                    if delta is None:
                        continue
                    body = delta.get("~") if type(delta) is dict and len(delta) == 1 else None
                    if type(body) is not dict:
                        out[index] = gpu_applier(out[index], delta)
                        continue
                    # The usual GPU delta, some of its fields: into the GPU just built (a new
                    # object when its row came; else one is made here), through their appliers.
                    gpu = out[index]
                    if gpu is gpus[index]:
                        gpu = object.__new__(Gpu)
                        _set_state(gpu, "__dict__", gpus[index].__dict__.copy())
                        out[index] = gpu
                    state = gpu.__dict__
                    for name, sub in body.items():
                        field = gpu_fields.get(name)
                        if field is None:
                            raise _Bad("unknown field %r" % (name,))
                        state[name] = field(state[name], sub)
                    name = None
            except _Bad as exc:
                if name is not None:
                    exc.parts.append(name)
                exc.parts.append(index)
                exc.parts.append("gpus")
                raise
        state = previous.__dict__.copy()
        state["timestamp"] = timestamp
        state["gpus"] = tuple(out)
        new = object.__new__(NodeSample)
        _set_state(new, "__dict__", state)
        return new

    return apply_rows


def _compile_gpus(names: Tuple[str, ...], hints: Dict[str, Any], sample_of: Callable[[Any, Any], Any]) -> Any:
    """`build(gpus, rows, out)`: appends to `out` each GPU with the sample of its row (the GPU
    itself for a null row).

    Generated from GpuSample's fields, as dataclasses generate their __init__: a row whose values
    are all null (unchanged) or of their field's plain JSON type (a float for a FloatMetric, an
    int for an IntMetric) is checked by one type test per value and one finite sum of its
    floats, and changes a copy of the previous sample's instance dictionary. Any other row goes
    to `sample_of`, which decodes (NotAvailable, an int for a float) and locates errors."""
    plain = []
    for name in names:
        kinds = _as_is(hints[name])
        plain.append(kinds[0] if kinds else None)
    values = ["v%d" % i for i in range(len(names))]
    checks = ["old is not None"]
    checks += [
        "(type(%s) is %s or %s is None)" % (v, kind.__name__, v)
        for v, kind in zip(values, plain)
        if kind is not None
    ]
    floats = ["(%s or 0.0)" % v for v, kind in zip(values, plain) if kind is float]
    if floats:
        checks.append("isfinite(%s)" % " + ".join(floats))
    if None in plain:  # a field without a plain JSON type: every row is decoded field by field
        checks = ["False"]
    updates = "".join(
        "\n                if %s is not None:\n                    state[%r] = %s" % (v, name, v)
        for v, name in zip(values, names)
    )
    source = """
def build(gpus, rows, out):
    append = out.append
    for gpu, row in zip(gpus, rows):
        if row is None:
            append(gpu)
            continue
        old = gpu.sample
        if type(row) is list and len(row) == %(width)d:
            %(values)s, = row
            if %(checks)s:
                state = old.__dict__.copy()%(updates)s
                sample = new(GpuSample)
                set_state(sample, "__dict__", state)
            else:
                sample = sample_of(row, old)
        else:
            sample = sample_of(row, old)
        state = gpu.__dict__.copy()
        state["sample"] = sample
        gpu = new(Gpu)
        set_state(gpu, "__dict__", state)
        append(gpu)
""" % {
        "width": len(names),
        "values": ", ".join(values),
        "checks": " and ".join(checks),
        "updates": updates,
    }
    namespace: Dict[str, Any] = {
        "new": object.__new__,
        "set_state": _set_state,
        "GpuSample": GpuSample,
        "Gpu": Gpu,
        "isfinite": math.isfinite,
        "sample_of": sample_of,
    }
    exec(compile(source, "<gpuops.core.codec: sample rows>", "exec"), namespace)
    return namespace["build"]
