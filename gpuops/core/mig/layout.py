"""A GPU's MIG layout as something to compare, store and aim for.

A layout is MIG mode plus GPU instances by (profile id, start) and, in each, its compute
instances by CI profile id in placement order. It is built from the live model (`layout_of`)
or from a plan, and it is what the node's journal records before a change. `fingerprint`
summarises what a plan was made from (identity and layout), so an apply can refuse a GPU that
changed since.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from gpuops.core.model import Gpu, GpuInstance, GpuProcess


@dataclass(frozen=True)
class InstanceSpec:
    profile_id: int  # GPU instance profile info.id (19, 14, 9, ...)
    start: int  # first memory slice
    compute: Tuple[int, ...] = ()  # CI profile ids in placement order (1c=0 ... 7c=4)


@dataclass(frozen=True)
class MigLayout:
    enabled: bool
    instances: Tuple[InstanceSpec, ...] = ()

    def normalized(self) -> "MigLayout":
        """Instances sorted by start; none when MIG is off."""
        if not self.enabled:
            return MigLayout(False)
        return MigLayout(True, tuple(sorted(self.instances, key=lambda i: (i.start, i.profile_id))))

    def to_json(self) -> Dict[str, Any]:
        return {
            "enabled": self.enabled,
            "instances": [[i.profile_id, i.start, list(i.compute)] for i in self.normalized().instances],
        }

    @staticmethod
    def from_json(data: Any) -> "MigLayout":
        """Read a layout from JSON data; raises ValueError naming what is wrong."""
        if not isinstance(data, dict) or not isinstance(data.get("enabled"), bool):
            raise ValueError("a layout is an object with 'enabled' (true or false)")
        items = data.get("instances", [])
        if not isinstance(items, list):
            raise ValueError("'instances' must be a list")
        instances = []
        for n, item in enumerate(items):
            ok = isinstance(item, list) and len(item) == 3 and isinstance(item[2], list)
            values = [item[0], item[1], *list(item[2])] if ok else []
            if not ok or not all(
                isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 64 for v in values
            ):
                raise ValueError("instances[%d]: expected [profile_id, start, [ci_profile_id, ...]]" % n)
            instances.append(InstanceSpec(item[0], item[1], tuple(item[2])))
        return MigLayout(data["enabled"], tuple(instances)).normalized()


def layout_of(gpu: Gpu) -> Optional[MigLayout]:
    """The live layout of a GPU; None when the GPU has no MIG (or its mode cannot be read)."""
    if gpu.mig is None:
        return None
    if not gpu.mig.current:
        return MigLayout(False)
    instances = []
    for gi in gpu.mig.gpu_instances:
        instances.append(InstanceSpec(gi.profile_id, gi.start, compute_of(gi)))
    return MigLayout(True, tuple(instances)).normalized()


def fingerprint(gpu: Gpu) -> str:
    """What a plan for this GPU was made from: identity, MIG mode and layout. Processes are
    checked on their own (the processes a plan lists as disrupted, `known_pids`): one that ended
    since is no reason to refuse, one that started since and would be disrupted is."""
    layout = layout_of(gpu)
    document = {
        "uuid": gpu.info.uuid,
        "pending": gpu.mig.pending if gpu.mig is not None else None,
        "layout": layout.to_json() if layout is not None else None,
    }
    text = json.dumps(document, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def compute_of(gi: GpuInstance) -> Tuple[int, ...]:
    """The CI profile ids of a live GPU instance, in placement order (as InstanceSpec.compute)."""
    return tuple(ci.profile_id for ci in sorted(gi.compute_instances, key=lambda c: c.start))


def kept_instances(old: MigLayout, new: MigLayout) -> List[InstanceSpec]:
    """The instances a change from `old` to `new` leaves in place (with their processes)."""
    if not (old.enabled and new.enabled):
        return []
    return [i for i in old.instances if i in new.instances]


def disrupted_processes(gpu: Gpu, old: MigLayout, new: MigLayout) -> List[GpuProcess]:
    """Processes that the change would disrupt: all of them on a mode change, else those on GPU
    instances that go away."""
    if old.enabled != new.enabled:
        return list(gpu.processes)
    if gpu.mig is None:
        return []
    kept = kept_instances(old, new)
    kept_ids = {
        gi.id for gi in gpu.mig.gpu_instances if InstanceSpec(gi.profile_id, gi.start, compute_of(gi)) in kept
    }
    return [p for p in gpu.processes if p.gpu_instance_id not in kept_ids]
