"""The attributor registry: which attributors this gpuops has (the built-in ones and the plugins
installed under the entry point group ``gpuops.attributors``) and where each one's code is.

fleet.yaml's ``attribution:`` names them (spec/model.py checks the names here); loading and
asking them is tenancy's (gpuops/tenancy/attribution.py, docs/tenancy.md). Nothing here imports
an attributor. A layer of its own below spec/ (import-linter's `layers` contract): both spec/
and tenancy/ read it, and it imports nothing of gpuops (the spec package would bring pydantic to
the views that attribute processes without a fleet.yaml).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from importlib import metadata

ENTRY_POINT_GROUP = "gpuops.attributors"
DEFAULT_ORDER: tuple[str, ...] = ("limiter", "user", "group", "owner")

# Built-in attributors, also registered as entry points in pyproject.toml; this table is the
# fallback where package metadata is missing (a copied tree, a stale editable install).
BUILTIN: dict[str, str] = {
    "limiter": "gpuops.tenancy.builtin:LimiterAttributor",
    "user": "gpuops.tenancy.builtin:UserAttributor",
    "group": "gpuops.tenancy.builtin:GroupAttributor",
    "owner": "gpuops.tenancy.builtin:OwnerAttributor",
}


@dataclass(frozen=True)
class Found:
    targets: dict[str, str]  # name -> "module:attribute"
    problems: tuple[str, ...]  # what was wrong with the installed metadata


@lru_cache(maxsize=1)
def discover() -> Found:
    """The attributors installed: each name's 'module:attribute', and what was wrong with the
    package metadata. Read once per process (`refresh` forgets it)."""
    targets: dict[str, str] = {}
    origin: dict[str, str] = {}
    problems: list[str] = []
    try:
        found: Iterable[metadata.EntryPoint] = metadata.entry_points(group=ENTRY_POINT_GROUP)
    except Exception as exc:  # broken metadata of some package must not stop the view
        found = ()
        problems.append(f"attributor plugins could not be listed: {type(exc).__name__}: {exc}")
    for ep in found:
        dist = getattr(getattr(ep, "dist", None), "name", None) or "an unknown package"
        if ep.name in BUILTIN and dist != "gpuops" and ep.value != BUILTIN[ep.name]:
            problems.append(
                f"{dist} registers an attributor named {ep.name!r} ({ep.value}), the name of a "
                "built-in one; it is ignored"
            )
            continue
        if ep.name in targets and targets[ep.name] != ep.value:
            problems.append(
                f"attributor {ep.name!r} is registered twice, by {origin[ep.name]} "
                f"({targets[ep.name]}) and by {dist} ({ep.value}); using the first"
            )
            continue
        targets[ep.name] = ep.value
        origin[ep.name] = dist
    for name, target in BUILTIN.items():
        targets.setdefault(name, target)  # no metadata (a copied tree): the built-in table
    return Found(targets, tuple(problems))


def refresh() -> None:
    """Forget what was discovered (after installing a plugin in a running process)."""
    discover.cache_clear()


def available_attributors() -> list[str]:
    """Names of the attributors that can be used: the built-in ones and installed plugins."""
    return sorted(discover().targets)
