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

A node sample's stream has a more compact form, *rows* (`sample_rows`, asked for by a watch's
`rows` argument): every GPU's sample changes every second (its timestamp at least), so each
GPU's sample travels as a row of values in the order the client named, null where a value did
not change, and the rest of each GPU as a delta of the form above:

    [timestamp, [row or null, ...], [GPU delta or null, ...]]

one row and one delta per GPU (null: unchanged; the list of deltas is left out when all are
null). `codec.from_rows` rebuilds the sample from the previous one, checking every value as a
full sample is checked. A change that rows cannot say (the GPUs themselves, the hostname) is
sent as a full sample.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

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


def sample_rows(old: Any, new: Any, names: Sequence[str]) -> Optional[List[Any]]:
    """The rows delta (see above) turning the node sample document `old` into `new`, each GPU's
    sample as a row of the fields `names` in that order; None when it needs a full sample."""
    if type(old) is not dict or type(new) is not dict or old.keys() != new.keys() or "timestamp" not in new:
        return None
    for key, value in new.items():
        if key != "timestamp" and key != "gpus" and old[key] != value:
            return None
    before, after = old.get("gpus"), new.get("gpus")
    if type(before) is not list or type(after) is not list or len(before) != len(after):
        return None
    wanted = set(names)
    rows: List[Any] = []
    deltas: List[Any] = []
    for gpu_before, gpu in zip(before, after):
        if type(gpu_before) is not dict or type(gpu) is not dict:
            return None
        sample = gpu.get("sample")
        row = None
        if type(sample) is dict and sample.keys() == wanted and None not in sample.values():
            previous = gpu_before.get("sample")
            if type(previous) is not dict or previous.keys() != wanted:
                row = [sample[name] for name in names]
            elif sample != previous:
                row = [_changed(previous[name], sample[name]) for name in names]
            # The row carries the sample: the GPU's delta says the rest.
            gpu_before = dict(gpu_before)
            gpu_before["sample"] = sample
        rows.append(row)
        deltas.append(diff(gpu_before, gpu))
    body = [new["timestamp"], rows]
    if any(d is not None for d in deltas):
        body.append(deltas)
    return body


def _changed(old: Any, new: Any) -> Any:
    """A row's value: the new one, or null where it equals the old one (of the same type)."""
    return None if type(old) is type(new) and old == new else new
