"""A gpuops attributor for Kubernetes: a GPU process counts for the team of its pod's namespace.

How the namespace is found, without any Kubernetes library in gpuops or on the nodes:

1. the node agent reports each GPU process's cgroup path (read from ``/proc/<pid>/cgroup``);
   a pod's containers live under a cgroup named after the pod's UID, with either cgroup driver:
   ``/kubepods/burstable/pod<uid>/<container>`` (cgroupfs) or
   ``/kubepods.slice/.../kubepods-burstable-pod<uid_with_underscores>.slice/...`` (systemd);
2. the pod UID is looked up in a *pods file* on the operator's machine: the JSON that
   ``kubectl get pods --all-namespaces -o json`` prints (a PodList), or a plain mapping
   ``{"<pod uid>": "<namespace>"}`` (or ``{"<pod uid>": {"namespace": ..., "name": ...}}``),
   written by anything that may list pods (a cron job running kubectl, a small controller);
   the file is re-read when it changes;
3. the namespace is mapped to a team by fleet.yaml (``attribution.settings.kubernetes.namespaces``),
   else a namespace named like a team is that team's.

A process that is not in a pod, a pod the file does not know (yet), or a namespace without a team
is left to the next attributor of the chain. See this package's README.md.
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from gpuops.core.model import GpuProcess
from gpuops.tenancy import Attribution, AttributionContext

__all__ = ["KubernetesAttributor", "PodIndex", "parse_pods", "pod_uid"]

ENV_PODS = "GPUOPS_K8S_PODS"
SOURCE = "kubernetes"
CHECK_EVERY = 1.0  # seconds between looks at the pods files' modification times

_POD_UID = re.compile(
    r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(?![0-9a-f])"
)


def pod_uid(cgroup: str) -> str | None:
    """The UID of the pod a cgroup path belongs to (dashed, lower case), or None."""
    match = _POD_UID.search(cgroup.lower())
    return match.group(1).replace("_", "-") if match else None


def parse_pods(data: Any, where: str = "pods file") -> dict[str, tuple[str, str]]:
    """pod UID -> (namespace, pod name) from a PodList (``kubectl get pods -A -o json``) or a
    mapping of UID to namespace (or to {"namespace": ..., "name": ...}). Raises ValueError."""
    out: dict[str, tuple[str, str]] = {}
    if isinstance(data, dict) and isinstance(data.get("items"), list):
        for i, item in enumerate(data["items"]):
            meta = item.get("metadata") if isinstance(item, dict) else None
            if not isinstance(meta, dict):
                raise ValueError(f"{where}: items[{i}] has no metadata")
            uid, namespace, name = meta.get("uid"), meta.get("namespace"), meta.get("name", "")
            if not (isinstance(uid, str) and isinstance(namespace, str) and isinstance(name, str)):
                raise ValueError(f"{where}: items[{i}].metadata needs uid and namespace (strings)")
            out[uid.lower()] = (namespace, name)
        return out
    if isinstance(data, dict) and "items" not in data:
        for uid, value in data.items():
            if isinstance(value, str):
                out[str(uid).lower()] = (value, "")
            elif isinstance(value, dict) and isinstance(value.get("namespace"), str):
                out[str(uid).lower()] = (value["namespace"], str(value.get("name", "")))
            else:
                raise ValueError(f"{where}: {uid}: expected a namespace or {{namespace, name}}")
        return out
    raise ValueError(f"{where}: expected a PodList (kubectl get pods -A -o json) or {{pod uid: namespace}}")


class PodIndex:
    """Pod UIDs of one or more pods files, re-read when a file changes (looked at, at most, once
    per `check_every` seconds). `lookup` raises OSError or ValueError while a file is missing or
    unreadable, so the attribution chain reports it (once) and goes on without this attributor."""

    def __init__(
        self,
        paths: Sequence[str],
        check_every: float = CHECK_EVERY,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.paths = tuple(os.path.expanduser(p) for p in paths)
        self.check_every = check_every
        self.clock = clock
        self._lock = threading.Lock()
        self._checked = -float("inf")
        self._stamps: tuple[tuple[int, int], ...] = ()
        self._pods: dict[str, tuple[str, str]] = {}
        self._error: Exception | None = None

    def lookup(self, uid: str) -> tuple[str, str] | None:
        with self._lock:
            now = self.clock()
            if now - self._checked >= self.check_every:
                self._checked = now
                self._refresh()
            if self._error is not None:
                raise self._error
            return self._pods.get(uid)

    def _refresh(self) -> None:
        try:
            stamps = tuple((st.st_mtime_ns, st.st_size) for st in (os.stat(p) for p in self.paths))
            if stamps == self._stamps and self._error is None:
                return
            pods: dict[str, tuple[str, str]] = {}
            for path in self.paths:
                with open(path, encoding="utf-8") as f:
                    try:
                        data = json.load(f)
                    except json.JSONDecodeError as exc:
                        raise ValueError(f"{path}: not JSON ({exc})") from None
                pods.update(parse_pods(data, path))
        except (OSError, ValueError) as exc:
            self._error = exc
            self._stamps = ()
            return
        self._pods, self._stamps, self._error = pods, stamps, None


class KubernetesAttributor:
    """``kubernetes``: the team of the namespace of the pod a process runs in.

    Settings (fleet.yaml ``attribution.settings.kubernetes``):

    - ``pods``: the pods file, or a list of them (one per cluster); default: $GPUOPS_K8S_PODS;
    - ``namespaces``: ``{namespace: team}``;
    - ``namespace_is_team``: a namespace named like a fleet.yaml team is that team's (default true).
    """

    name = SOURCE

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        options = dict(settings or {})
        pods = options.pop("pods", None) or os.environ.get(ENV_PODS)
        namespaces = options.pop("namespaces", {}) or {}
        same = options.pop("namespace_is_team", True)
        if options:
            known = "pods, namespaces, namespace_is_team"
            raise ValueError(f"unknown settings {sorted(options)} (known: {known})")
        if not pods:
            raise ValueError(
                f"say where the pods file is: attribution.settings.kubernetes.pods, or ${ENV_PODS}"
            )
        paths = [pods] if isinstance(pods, str) else pods
        if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
            raise ValueError("pods: expected a path or a list of paths")
        if not isinstance(namespaces, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in namespaces.items()
        ):
            raise ValueError("namespaces: expected a mapping of namespace to team")
        if not isinstance(same, bool):
            raise ValueError("namespace_is_team: expected true or false")
        self.index = PodIndex(paths)
        self.namespaces: dict[str, str] = dict(namespaces)
        self.namespace_is_team = same

    def attribute(self, process: GpuProcess, context: AttributionContext) -> Attribution | None:
        cgroup = getattr(process, "cgroup", "")
        if not cgroup or type(cgroup) is not str:
            return None
        uid = pod_uid(cgroup)
        if uid is None:
            return None
        found = self.index.lookup(uid)
        if found is None:
            return None
        namespace, pod = found
        team = self.namespaces.get(namespace)
        if team is None and self.namespace_is_team and namespace in context.teams:
            team = namespace
        if team is None:
            return None
        return Attribution(team, SOURCE, f"pod {namespace}/{pod}" if pod else f"namespace {namespace}")

    def __repr__(self) -> str:
        return f"KubernetesAttributor(pods={list(self.index.paths)!r})"
