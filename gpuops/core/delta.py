"""Deltas between successive JSON documents of a stream, so a `watch` sends what changed.

Most of a node sample repeats from one second to the next (identities, MIG layout, process
command lines); only readings move. A delta says what changed, in three forms:

- a scalar or a list: the new value, as is;
- ``{"$": value}``: the new value, whatever it is (used for objects);
- ``{"~": {key: delta, ...}}``: the same object with these keys changed;
- ``{"@": {"index": delta, ...}}``: the same list (same length) with these items changed.

Keys absent from a delta did not change. `diff(a, b)` returns None when the documents are
equal. The receiver rebuilds the new document with `apply`, or — cheaper — the new model object
from the previous one with `codec.from_delta`, decoding only what changed.
"""

from __future__ import annotations

from typing import Any, Dict, Optional

REPLACE, OBJECT, ITEMS = "$", "~", "@"

_NO_CHANGE = object()


class DeltaError(ValueError):
    """A delta does not fit the document it is applied to."""


def diff(old: Any, new: Any) -> Optional[Any]:
    """The delta turning `old` into `new`, or None when they are equal."""
    result = _diff(old, new)
    return None if result is _NO_CHANGE else result


def _diff(old: Any, new: Any) -> Any:
    if type(old) is type(new):
        if type(new) is dict:
            if old.keys() != new.keys():
                return {REPLACE: new}
            changed: Dict[str, Any] = {}
            for key, value in new.items():
                sub = _diff(old[key], value)
                if sub is not _NO_CHANGE:
                    changed[key] = sub
            return {OBJECT: changed} if changed else _NO_CHANGE
        if type(new) is list:
            if len(old) != len(new):
                return new
            items: Dict[str, Any] = {}
            for index, (a, b) in enumerate(zip(old, new)):
                sub = _diff(a, b)
                if sub is not _NO_CHANGE:
                    items[str(index)] = sub
            return {ITEMS: items} if items else _NO_CHANGE
        if old == new:
            return _NO_CHANGE
    # Objects, and null (which diff() reserves for "no change"), travel wrapped.
    return {REPLACE: new} if type(new) is dict or new is None else new


def apply(old: Any, delta: Any) -> Any:
    """The document that `delta` describes, given the one before it (which is not modified)."""
    if type(delta) is not dict:
        return delta
    if len(delta) != 1:
        raise DeltaError("a delta object has exactly one of the keys $, ~, @")
    ((kind, body),) = delta.items()
    if kind == REPLACE:
        return body
    if kind == OBJECT:
        if type(old) is not dict or type(body) is not dict:
            raise DeltaError("a ~ delta applies to an object")
        out = dict(old)
        for key, sub in body.items():
            if key not in out:
                raise DeltaError("no key %r to change" % (key,))
            out[key] = apply(out[key], sub)
        return out
    if kind == ITEMS:
        if type(old) is not list or type(body) is not dict:
            raise DeltaError("an @ delta applies to a list")
        items = list(old)
        for index, sub in body.items():
            i = _index(index, len(items))
            items[i] = apply(items[i], sub)
        return items
    raise DeltaError("unknown delta kind %r" % (kind,))


def _index(text: Any, length: int) -> int:
    if type(text) is not str or not text.isdigit() or len(text) > 9:
        raise DeltaError("a list index must be a decimal string, not %r" % (text,))
    index = int(text)
    if index >= length:
        raise DeltaError("index %d is past the end of a list of %d" % (index, length))
    return index
