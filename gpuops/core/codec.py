"""Strict conversion between model dataclasses and JSON-ready dicts.

Both sides of the agent protocol use this, so a malformed message is rejected with the path of
the offending field (e.g. ``gpus[2].sample.power_watts: expected a number``) instead of
surfacing later as a TypeError deep in the TUI.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Dict, Type, TypeVar

from gpuops.core.model import NotAvailable

T = TypeVar("T")

_MAX_DEPTH = 32


class DecodeError(ValueError):
    """A value does not fit the model; the message starts with the path of the field."""


def to_json(value: Any) -> Any:
    """Turn a model value (dataclasses, tuples, NotAvailable) into plain JSON data."""
    if isinstance(value, NotAvailable):
        return {"na": value.reason}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return {"na": "NOT_FINITE"}
    return value


_HINTS: Dict[type, Dict[str, Any]] = {}


def _hints(cls: type) -> Dict[str, Any]:
    hints = _HINTS.get(cls)
    if hints is None:
        module = __import__(cls.__module__, fromlist=["_"])
        hints = typing.get_type_hints(cls, vars(module))
        _HINTS[cls] = hints
    return hints


def from_json(cls: Type[T], data: Any, path: str = "") -> T:
    """Build `cls` from JSON data, checking every field's type; raises DecodeError."""
    return typing.cast(T, _decode(cls, data, path or cls.__name__, 0))


def _fail(path: str, message: str) -> DecodeError:
    return DecodeError("%s: %s" % (path, message))


def _decode(tp: Any, data: Any, path: str, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        raise _fail(path, "nested too deeply")
    origin = typing.get_origin(tp) if hasattr(typing, "get_origin") else getattr(tp, "__origin__", None)
    args = typing.get_args(tp) if hasattr(typing, "get_args") else getattr(tp, "__args__", ())
    if tp is Any:
        return data
    if origin is typing.Union:
        return _decode_union(args, data, path, depth)
    if origin in (tuple, typing.Tuple):
        if not isinstance(data, list):
            raise _fail(path, "expected a list")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], v, "%s[%d]" % (path, i), depth + 1) for i, v in enumerate(data))
        if len(args) != len(data):
            raise _fail(path, "expected %d items" % len(args))
        return tuple(
            _decode(a, v, "%s[%d]" % (path, i), depth + 1) for i, (a, v) in enumerate(zip(args, data))
        )
    if origin in (dict, typing.Dict):
        if not isinstance(data, dict):
            raise _fail(path, "expected an object")
        return {
            _decode(args[0], k, path, depth + 1): _decode(args[1], v, "%s.%s" % (path, k), depth + 1)
            for k, v in data.items()
        }
    if tp is NotAvailable:
        if not (isinstance(data, dict) and set(data) == {"na"} and isinstance(data["na"], str)):
            raise _fail(path, 'expected {"na": REASON}')
        return NotAvailable(data["na"])
    if dataclasses.is_dataclass(tp):
        return _decode_dataclass(tp, data, path, depth)
    if tp is bool:
        if not isinstance(data, bool):
            raise _fail(path, "expected true or false")
        return data
    if tp is int:
        if isinstance(data, bool) or not isinstance(data, int):
            raise _fail(path, "expected an integer")
        return data
    if tp is float:
        if isinstance(data, bool) or not isinstance(data, (int, float)):
            raise _fail(path, "expected a number")
        value = float(data)
        if not math.isfinite(value):
            raise _fail(path, "expected a finite number")
        return value
    if tp is str:
        if not isinstance(data, str):
            raise _fail(path, "expected a string")
        return data
    if tp is type(None):
        if data is not None:
            raise _fail(path, "expected null")
        return None
    raise _fail(path, "unsupported type %r" % (tp,))


def _decode_union(args: Any, data: Any, path: str, depth: int) -> Any:
    none_type = type(None)
    if data is None and none_type in args:
        return None
    members = [a for a in args if a is not none_type]
    if isinstance(data, dict):
        # An object is either "not available" or the one dataclass of the union: decode it
        # directly so that an error deep inside keeps its full path.
        if NotAvailable in members and "na" in data:
            return _decode(NotAvailable, data, path, depth + 1)
        for member in members:
            if dataclasses.is_dataclass(member):
                return _decode(member, data, path, depth + 1)
    errors = []
    for member in members:
        try:
            return _decode(member, data, path, depth + 1)
        except DecodeError as exc:
            errors.append(str(exc).split(": ", 1)[-1])
    if none_type in args:
        errors.append("expected null")
    raise _fail(path, " or ".join(dict.fromkeys(errors)))


def _decode_dataclass(cls: Any, data: Any, path: str, depth: int) -> Any:
    if not isinstance(data, dict):
        raise _fail(path, "expected an object")
    hints = _hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise _fail(path, "unknown field %r" % unknown[0])
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            kwargs[name] = _decode(hints[name], data[name], "%s.%s" % (path, name), depth + 1)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise _fail("%s.%s" % (path, name), "missing")
    return cls(**kwargs)
