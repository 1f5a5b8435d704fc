"""Editing an operator's fleet.yaml in place: one part replaced, everything else (comments, order,
quotes, other entries) as written. The Pool screen rewrites a pool and its carve entries this way,
`gpuops export -f` the `carve:` section.

An edit that cannot be made in place raises `EditError`; the caller then writes the file anew
(`dump_fleet`) or says why. The new parts are laid out as `spec/dump.py` writes them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from gpuops.spec.dump import carve_section, compact, dump_yaml, yaml_writer


class EditError(ValueError):
    """The text cannot be edited in place; the message says why, in one line."""


def set_pool(text: str, pool: str, data: Mapping[str, Any]) -> str:
    """`text` with `pools.<pool>` replaced by `data["pools"][pool]` and the carve entries marked
    `pool: <pool>` by those of `data["carve"]`; every other carve entry stays as written, in the
    place `data["carve"]` gives it among the new ones. `data` is the whole new fleet.yaml (as the
    rebalance planner writes it); its other carve entries must be the file's, in the file's order."""
    doc = _load(text)
    try:
        new_pool = data["pools"][pool]
    except (KeyError, TypeError):
        raise EditError(f"the new fleet.yaml has no pool {pool}") from None
    pools = doc.get("pools")
    if not isinstance(pools, CommentedMap):
        pools = CommentedMap()
        doc["pools"] = pools
    pools[pool] = compact(new_pool)
    written = doc.get("carve")
    if written is not None and not isinstance(written, list):
        raise EditError("carve is not a list")
    kept = [e for e in written or [] if not (isinstance(e, dict) and e.get("pool") == pool)]
    wanted = list(data.get("carve", []))
    if sum(1 for e in wanted if e.get("pool") != pool) != len(kept):
        raise EditError("the carve entries of other pools do not line up with the file's")
    others = iter(kept)
    carve = CommentedSeq(compact(e) if e.get("pool") == pool else next(others) for e in wanted)
    if carve or written is not None:
        doc["carve"] = carve
    return dump_yaml(doc)


def set_carve(text: str, entries: Sequence[dict[str, Any]]) -> str:
    """`text` with its `carve:` section replaced by `entries` (laid out as `gpuops export` writes
    them; added at the end if the file has none)."""
    doc = _load(text)
    doc["carve"] = carve_section(entries)
    return dump_yaml(doc)


def _load(text: str) -> CommentedMap:
    try:
        doc = yaml_writer().load(text)
    except YAMLError as exc:
        first = str(exc).strip().splitlines()
        raise EditError(f"not YAML: {first[0] if first else type(exc).__name__}") from None
    if not isinstance(doc, CommentedMap):
        raise EditError("the fleet file is not a mapping")
    return doc


__all__ = ["EditError", "set_carve", "set_pool"]
