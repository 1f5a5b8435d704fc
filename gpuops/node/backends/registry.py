"""Finding backends by name: installed plugins (entry point group `gpuops.backends`) first,
then the built-in ones, so a zipapp pushed to a node without package metadata still works."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Optional, Tuple

from gpuops.node.backends.base import Backend, BackendUnavailable

ENTRY_POINT_GROUP = "gpuops.backends"

_BUILTIN = {
    "nvml": "gpuops.node.backends.nvml:NvmlBackend",
    "sim": "gpuops.node.backends.sim:SimBackend",
}


def _entry_points() -> Dict[str, str]:
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return {}
    try:
        eps: Any = metadata.entry_points()
        if hasattr(eps, "select"):
            group = eps.select(group=ENTRY_POINT_GROUP)
        else:  # Python 3.8/3.9: a dict of group -> entry points
            group = eps.get(ENTRY_POINT_GROUP, ())
        return {ep.name: ep.value for ep in group}
    except Exception:  # broken metadata on a node must not stop monitoring
        return {}


def available_backends() -> List[str]:
    names = dict(_BUILTIN)
    names.update(_entry_points())
    return sorted(names)


def _load(target: str) -> Callable[..., Backend]:
    module_name, _, attr = target.partition(":")
    module = importlib.import_module(module_name)
    return getattr(module, attr)  # type: ignore[no-any-return]


def create_backend(name: str, **options: Any) -> Backend:
    """Instantiate backend `name`; raises BackendUnavailable with a one-line reason."""
    targets = dict(_BUILTIN)
    targets.update(_entry_points())
    target = targets.get(name)
    if target is None:
        raise BackendUnavailable(
            "unknown backend %r (available: %s)" % (name, ", ".join(available_backends()))
        )
    try:
        factory = _load(target)
    except (ImportError, AttributeError) as exc:
        raise BackendUnavailable("backend %r cannot be loaded: %s" % (name, exc)) from exc
    return factory(**options)


def open_backend(name: str, sim_spec: Optional[str] = None) -> Tuple[Optional[Backend], str]:
    """Create the backend, or return (None, reason) so the agent can still say why it cannot serve."""
    options: Dict[str, Any] = {}
    if sim_spec is not None:
        options["sim_spec"] = sim_spec
    try:
        return create_backend(name, **options), ""
    except BackendUnavailable as exc:
        return None, str(exc)
    except Exception as exc:  # a broken plugin must not kill the agent without a word
        return None, "backend %r failed to start: %s: %s" % (name, type(exc).__name__, exc)
