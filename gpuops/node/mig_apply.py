"""Changing one GPU's MIG layout as a transaction, on the node.

`apply_layout` takes a GPU from its live layout to a target one:

1. refuses if the GPU changed since the plan (fingerprint), or if processes run on instances that
   would be destroyed (with their pids and users) unless forced — forced, it ends them first;
2. records old and new layout in the journal (node/state.py);
3. destroys the instances that are not wanted (compute instances first), changes MIG mode if
   needed (Ampere: and resets the GPU), creates the wanted instances with explicit placements,
   then their compute instances; instances wanted as they are stay, with their processes;
4. verifies the result; on any failure it destroys what it made and recreates the old layout,
   so the GPU ends in its old layout or its new one, never between; then clears the journal.

`recover` runs when an agent starts: a journal left by a killed agent is resolved the same way.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence

from gpuops.core.mig.layout import (
    InstanceSpec,
    MigLayout,
    compute_of,
    disrupted_processes,
    fingerprint,
    kept_instances,
    layout_of,
)
from gpuops.core.model import Gpu
from gpuops.node.backends.base import Backend, BackendError
from gpuops.node.state import NodeState


class ApplyError(Exception):
    """The change was not made (and the GPU is as it was); `code` says why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _gpu(backend: Backend, index: int) -> Gpu:
    for gpu in backend.sample().gpus:
        if gpu.info.index == index:
            return gpu
    raise ApplyError("no_such_gpu", "GPU %d is not on this node" % index)


def apply_layout(
    backend: Backend,
    state: NodeState,
    index: int,
    target: MigLayout,
    expect: Optional[str] = None,
    force: bool = False,
    known_pids: Optional[Sequence[int]] = None,
) -> Dict[str, Any]:
    """Make GPU `index` have `target`; returns what was done. Raises ApplyError."""
    target = target.normalized()
    gpu = _gpu(backend, index)
    old = layout_of(gpu)
    if old is None:
        raise ApplyError("not_supported", "GPU %d (%s) does not support MIG" % (index, gpu.info.name))
    if expect is not None and fingerprint(gpu) != expect:
        raise ApplyError("stale", "GPU %d changed since the plan was made (its MIG layout or mode)" % index)
    if old == target and gpu.mig is not None and gpu.mig.pending == gpu.mig.current:
        return {"gpu": index, "changed": False, "stopped": []}
    blocking = disrupted_processes(gpu, old, target)
    if known_pids is not None:
        # The plan was reviewed with its list of processes to stop: one started since would be
        # stopped without anyone having seen it, even with --force.
        unseen = [p for p in blocking if p.pid not in set(known_pids)]
        if unseen:
            who = ", ".join("pid %d (%s)" % (p.pid, p.user or "?") for p in unseen)
            raise ApplyError(
                "stale",
                "GPU %d: processes started since the plan would be disrupted: %s; make a new plan"
                % (index, who),
            )
    if blocking and not force:
        who = ", ".join("pid %d (%s)" % (p.pid, p.user or "?") for p in blocking)
        raise ApplyError(
            "in_use", "GPU %d has processes the change would disrupt: %s; --force ends them" % (index, who)
        )
    stopped = [p.pid for p in blocking]
    if stopped:
        left = backend.stop_processes(index, stopped)
        if left:
            raise ApplyError(
                "in_use", "GPU %d: processes %s did not end" % (index, ", ".join(map(str, left)))
            )
    state.begin(gpu.info.uuid, index, old.to_json(), target.to_json())
    try:
        _transition(backend, index, target)
        now = layout_of(_gpu(backend, index))
        if now != target:
            raise ApplyError(
                "verify", "GPU %d has %s after the change, not the planned layout" % (index, _show(now))
            )
    except (BackendError, ApplyError) as exc:
        reason = exc.message
        try:
            _transition(backend, index, old)
        except (BackendError, ApplyError) as undo:
            # The journal stays: the next agent start (or apply) tries again.
            raise ApplyError(
                "stuck",
                "GPU %d: %s; restoring the old layout failed too (%s); the journal keeps it for recovery"
                % (index, reason, undo),
            ) from None
        state.end(gpu.info.uuid)
        raise ApplyError("rolled_back", "GPU %d: %s; its old layout is restored" % (index, reason)) from None
    state.end(gpu.info.uuid)
    return {"gpu": index, "changed": True, "stopped": stopped}


def _transition(backend: Backend, index: int, target: MigLayout) -> None:
    """From whatever the GPU has now to `target`, keeping instances that are wanted as they are."""
    gpu = _gpu(backend, index)
    current = layout_of(gpu)
    assert current is not None and gpu.mig is not None
    keep = kept_instances(current, target)
    for gi in sorted(gpu.mig.gpu_instances, key=lambda g: g.start):
        if InstanceSpec(gi.profile_id, gi.start, compute_of(gi)) in keep:
            continue
        for ci in gi.compute_instances:
            backend.destroy_compute_instance(index, gi.id, ci.id)
        backend.destroy_gpu_instance(index, gi.id)
    if current.enabled != target.enabled or gpu.mig.pending != gpu.mig.current:
        change = backend.set_mig_mode(index, target.enabled)
        if change.reset_required:
            backend.reset_gpu(index)  # Ampere: the new mode takes effect on reset
    if not target.enabled:
        return
    # Placements are explicit (from the solver), so the order of creation does not matter.
    for spec in target.instances:
        if spec in keep:
            continue
        gi = backend.create_gpu_instance(index, spec.profile_id, spec.start)
        for ci_profile in spec.compute:
            backend.create_compute_instance(index, gi.id, ci_profile)


def _show(layout: Optional[MigLayout]) -> str:
    if layout is None:
        return "no MIG"
    if not layout.enabled:
        return "MIG off"
    return ", ".join("%d@%d" % (i.profile_id, i.start) for i in layout.instances) or "MIG on, no instances"


def recover(backend: Backend, state: NodeState) -> List[str]:
    """Resolve journals left by a killed agent; returns one line per GPU for the agent's log."""
    notes = []
    for record in state.pending():
        index, uuid = record["index"], record["uuid"]
        try:
            old = MigLayout.from_json(record.get("old"))
            new = MigLayout.from_json(record.get("new"))
            gpu = _gpu(backend, index)
            if gpu.info.uuid != uuid:
                notes.append(
                    "journal for %s names GPU %d, which is now %s: left alone" % (uuid, index, gpu.info.uuid)
                )
                continue
            if layout_of(gpu) == new:
                notes.append("GPU %d: the interrupted change had completed" % index)
            else:
                _transition(backend, index, old)
                notes.append("GPU %d: an interrupted change was undone (old layout restored)" % index)
            state.end(uuid)
        except (ValueError, BackendError, ApplyError) as exc:
            notes.append("GPU %d: recovery failed (%s); the journal is kept" % (index, exc))
    return notes


def recover_at_start(backend: Backend, state_dir: str) -> List[str]:
    """When an agent starts: finish what a killed agent left half-done, unless an apply holds the
    node lock now (it recovers first itself). Returns the notes for the agent's log."""
    from gpuops.node.state import LockBusy

    state = NodeState(state_dir)
    if not state.pending():
        return []
    try:
        lock = state.lock("agent start-up recovery")
    except (LockBusy, OSError):
        return []
    try:
        return recover(backend, state)
    finally:
        NodeState.unlock(lock)
