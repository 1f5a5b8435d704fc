"""Strict conversion between model dataclasses and JSON-ready dicts.

Both sides of the agent protocol use this, so a malformed message is rejected with the path of
the offending field (e.g. ``Node.gpus[2].sample.power_watts: expected a number``) instead of
surfacing later as a TypeError deep in the TUI.

The operator side decodes every sample of every node, so decoders are compiled once per type
into closures that dispatch on the exact Python type of the value; the path of a bad field is
only assembled when there is an error (zero-cost `try` blocks on the good path).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Callable, Dict, List, Tuple, Type, TypeVar, Union

from gpuops.core.model import NotAvailable

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

_FIELD_NAMES: Dict[type, Tuple[str, ...]] = {}


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
        names = tuple(f.name for f in dataclasses.fields(value))
        _FIELD_NAMES[kind] = names
    if names is not None:
        return {name: to_json(getattr(value, name)) for name in names}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, float):
        return to_json(float(value))
    return value


# ---- decoding --------------------------------------------------------------------------------


def from_json(cls: Type[T], data: Any, path: str = "") -> T:
    """Build `cls` from JSON data, checking every field's type; raises DecodeError."""
    try:
        return typing.cast(T, _decoder(cls)(data))
    except _Bad as exc:
        raise _located(cls, path, exc) from None


def _located(cls: Any, path: str, exc: _Bad) -> DecodeError:
    """The error a user sees: the path of the bad field (`Node.gpus[2].sample.power_watts`)."""
    where = path or getattr(cls, "__name__", str(cls))
    for part in reversed(exc.parts):
        where += "[%d]" % part if isinstance(part, int) else "." + part
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


def _compile(tp: Any) -> Decoder:
    origin = _origin(tp)
    if tp is Any:
        return lambda data: data
    if origin is Union:
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


def _decode_not_available(data: Any) -> Any:
    if type(data) is dict and len(data) == 1 and type(data.get("na")) is str:
        return NotAvailable(data["na"])
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


def _compile_dataclass(cls: Any) -> Decoder:
    module = __import__(cls.__module__, fromlist=["_"])
    hints = typing.get_type_hints(cls, vars(module))
    fields: List[Tuple[str, Decoder, bool]] = []
    known = set()
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        fields.append((f.name, _decoder(hints[f.name]), required))
        known.add(f.name)

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


# ---- deltas (core/delta.py) ------------------------------------------------------------------

Applier = Callable[[Any, Any], Any]


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


def _applier(tp: Any) -> Applier:
    found = _APPLIERS.get(tp)
    if found is None:
        found = _compile_applier(tp)
        _APPLIERS[tp] = found
    return found


def _compile_applier(tp: Any) -> Applier:
    """Like the decoders, compiled once per declared type: which object classes a `~` delta may
    change here (with an applier per field), and the applier of list items for `@`."""
    decode = _decoder(tp)
    members = _args(tp) if _origin(tp) is Union else (tp,)
    objects: Dict[type, Dict[str, Applier]] = {}
    item: Any = None
    for member in members:
        if isinstance(member, type) and dataclasses.is_dataclass(member):
            module = __import__(member.__module__, fromlist=["_"])
            hints = typing.get_type_hints(member, vars(module))
            objects[member] = {f.name: _applier(hints[f.name]) for f in dataclasses.fields(member)}
        args = _args(member)
        if _origin(member) in (tuple, typing.Tuple) and len(args) == 2 and args[1] is Ellipsis:
            item = _applier(args[0])
    item_applier: Any = item

    def apply(previous: Any, delta: Any) -> Any:
        if type(delta) is not dict:
            return decode(delta)
        if len(delta) != 1:
            raise _Bad("a delta object has exactly one of the keys $, ~, @")
        ((kind, body),) = delta.items()
        if kind == "~":
            cls = type(previous)
            fields = objects.get(cls)
            if fields is None or type(body) is not dict:
                raise _Bad("a ~ delta needs an object here")
            changes = {}
            name = ""
            try:
                for name, sub in body.items():
                    field = fields.get(name)
                    if field is None:
                        raise _Bad("unknown field %r" % (name,))
                    changes[name] = field(getattr(previous, name), sub)
            except _Bad as exc:
                exc.parts.append(name)
                raise
            # Model dataclasses are frozen and have no __post_init__: a copy of the instance
            # dictionary with the changed fields is the object their __init__ would build.
            new = object.__new__(cls)
            new.__dict__.update(previous.__dict__)
            new.__dict__.update(changes)
            return new
        if kind == "$":
            return decode(body)
        if kind == "@":
            if item_applier is None or type(previous) is not tuple or type(body) is not dict:
                raise _Bad("an @ delta needs a list here")
            items = list(previous)
            index = -1
            try:
                for key, sub in body.items():
                    if type(key) is not str or not key.isdigit() or len(key) > 9 or int(key) >= len(items):
                        raise _Bad("no item %r in a list of %d" % (key, len(items)))
                    index = int(key)
                    items[index] = item_applier(items[index], sub)
            except _Bad as exc:
                if index >= 0:
                    exc.parts.append(index)
                raise
            return tuple(items)
        raise _Bad("unknown delta kind %r" % (kind,))

    return apply
