"""Changing one GPU's MIG layout as a transaction, on the node.

`apply_layout` takes a GPU from its live layout to a target one, as a transaction of
node/transaction.py (which partition modes share, node/partition_apply.py):

1. refuses if the GPU changed since the plan (fingerprint), or if processes run on instances that
   would be destroyed (with their pids and users) unless forced — forced, it ends them first;
2. records old and new layout in the journal (node/state.py);
3. destroys the instances that are not wanted (compute instances first), changes MIG mode if
   needed (Ampere: and resets the GPU), creates the wanted instances with explicit placements,
   then their compute instances; instances wanted as they are stay, with their processes;
4. verifies the result; on any failure it destroys what it made and recreates the old layout,
   so the GPU ends in its old layout or its new one, never between; then clears the journal.

`recover` runs at the start of the next apply (never in a read-only session: they report the
journal, node/state.py `interrupted_applies`): a journal left by a killed agent is checked against
the catalog and the live GPU, then resolved the same way, or the GPU is left alone and the reason
given (docs/mig.md#interrupted-applies).
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple

from gpuops.core.mig.catalog import MigModel, find_model
from gpuops.core.mig.layout import (
    InstanceSpec,
    MigLayout,
    compute_of,
    disrupted_processes,
    fingerprint,
    kept_instances,
    layout_of,
)
from gpuops.core.mig.placement import Placement, check_layout
from gpuops.core.model import Gpu
from gpuops.core.protocol import MigChange, MigResult
from gpuops.node.backends.base import Backend, BackendError
from gpuops.node.state import MIG, NodeState
from gpuops.node.transaction import (
    ApplyError,
    Kind,
    Recovery,
    Words,
    clear_the_way,
    gpu_of,
    journaled,
)

_UNSEEN = "GPU %d: processes started since the plan would be disrupted: %s; make a new plan"
_IN_USE = "GPU %d has processes the change would disrupt: %s; --force ends them"
_WORDS = Words(restoring="the old layout", it="it", restored="its old layout is restored")


def apply_layout(
    backend: Backend,
    state: NodeState,
    index: int,
    target: MigLayout,
    expect: Optional[str] = None,
    force: bool = False,
    known_pids: Optional[Sequence[int]] = None,
) -> MigResult:
    """Make GPU `index` have `target`; returns what was done. Raises ApplyError."""
    target = target.normalized()
    gpu = gpu_of(backend, index)
    old = layout_of(gpu)
    if old is None:
        raise ApplyError("not_supported", "GPU %d (%s) does not support MIG" % (index, gpu.info.name))
    if expect is not None and fingerprint(gpu) != expect:
        raise ApplyError("stale", "GPU %d changed since the plan was made (its MIG layout or mode)" % index)
    if old == target and gpu.mig is not None and gpu.mig.pending == gpu.mig.current:
        return MigResult(gpu=index, ok=True, changed=False)
    blocking = disrupted_processes(gpu, old, target)
    stopped = clear_the_way(backend, index, blocking, known_pids, force, _UNSEEN, _IN_USE)

    def change() -> None:
        _transition(backend, index, target)
        now = layout_of(gpu_of(backend, index))
        if now != target:
            raise ApplyError(
                "verify", "GPU %d has %s after the change, not the planned layout" % (index, _show(now))
            )

    journaled(
        state,
        gpu,
        MIG,
        old.to_json(),
        target.to_json(),
        change,
        lambda: _transition(backend, index, old),
        _WORDS,
    )
    return MigResult(gpu=index, ok=True, changed=True, stopped=tuple(stopped))


def apply_change(backend: Backend, state: NodeState, change: MigChange, force: bool) -> MigResult:
    """One change of a mig_apply request (node/transaction.py `run`)."""
    return apply_layout(backend, state, change.gpu, change.layout, change.expect, force, change.known_pids)


def refused(gpu: int, code: str, message: str) -> MigResult:
    return MigResult(gpu=gpu, ok=False, code=code, message=message)


def _transition(backend: Backend, index: int, target: MigLayout) -> None:
    """From whatever the GPU has now to `target`, keeping instances that are wanted as they are."""
    gpu = gpu_of(backend, index)
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


def recover(backend: Backend, state: NodeState) -> Recovery:
    """Resolve the journals an interrupted apply left, under the node lock, from an apply only.

    A journal is trusted only when it is well-formed, both its layouts are possible on its GPU
    (profiles of that model in the catalog, valid placements and compute instances), its GPU is
    here with the same UUID and index, and the live layout is its old one, its new one or a state
    between them (every instance one of either layout's, with at most its compute instances).
    Then: new -> the journal is cleared; else the GPU is put back in its old layout. Otherwise the
    GPU is left alone, the journal kept, and the reason said (one line, with the journal's path)."""
    done = Recovery()
    entries = state.journals()
    if not entries:
        return done
    try:
        gpus = list(backend.sample().gpus)
    except BackendError as exc:
        for path, record, _problem in entries:
            index = record.get("index") if record is not None else None
            line = "interrupted-apply journal %s: the GPUs cannot be read (%s); left alone" % (path, exc)
            if isinstance(index, int) and not isinstance(index, bool):
                done.refused[index] = line
            done.notes.append(line)
        return done
    for path, record, problem in entries:
        gpu = _journal_gpu(state, gpus, path, record)
        try:
            if problem:
                raise ValueError(problem)
            assert record is not None
            old, new = _checked(record, gpu)
            assert gpu is not None
            index = gpu.info.index
            before = fingerprint(gpu)
            if layout_of(gpu) == new:
                done.notes.append("GPU %d: the interrupted change had completed" % index)
            elif layout_of(gpu) == old and gpu.mig is not None and gpu.mig.pending == gpu.mig.current:
                done.notes.append("GPU %d: the interrupted change had not begun" % index)
            else:
                _transition(backend, index, old)
                after = gpu_of(backend, index)
                if layout_of(after) != old:
                    raise ApplyError(
                        "verify", "the old layout did not come back (%s)" % _show(layout_of(after))
                    )
                done.restored[index] = (before, fingerprint(after))
                done.notes.append("GPU %d: an interrupted change was undone (old layout restored)" % index)
            state.end(gpu.info.uuid)
        except (ValueError, BackendError, ApplyError) as exc:
            why = exc.message if isinstance(exc, ApplyError) else str(exc)
            where = "GPU %d: " % gpu.info.index if gpu is not None else ""
            line = (
                "%sinterrupted-apply journal %s: %s; left alone: check the GPU, then remove the journal"
                % (
                    where,
                    path,
                    why,
                )
            )
            if gpu is not None:
                done.refused[gpu.info.index] = line
            done.notes.append(line)
    return done


def _journal_gpu(
    state: NodeState, gpus: Sequence[Gpu], path: str, record: Optional[Dict[str, Any]]
) -> Optional[Gpu]:
    """The GPU a journal is about: by the UUID it names, else by its file name."""
    uuid = record.get("uuid") if record is not None else None
    for gpu in gpus:
        if gpu.info.uuid == uuid or state.journal_path(gpu.info.uuid) == path:
            return gpu
    return None


def _checked(record: Dict[str, Any], gpu: Optional[Gpu]) -> Tuple[MigLayout, MigLayout]:
    """The journal's old and new layouts when it can be trusted on `gpu`; else ValueError."""
    layouts = []
    for key in ("old", "new"):
        try:
            layouts.append(MigLayout.from_json(record[key]))
        except ValueError as exc:
            raise ValueError("%s layout: %s" % (key, exc)) from None
    old, new = layouts
    if gpu is None:
        raise ValueError("it names GPU %s, which is not on this node" % record["uuid"])
    if gpu.info.index != record["index"]:
        raise ValueError(
            "it names GPU %s as index %d, which is index %d now"
            % (gpu.info.uuid, record["index"], gpu.info.index)
        )
    if gpu.mig is None:
        raise ValueError("GPU %d (%s) does not support MIG" % (gpu.info.index, gpu.info.name))
    model = find_model(gpu.info.mig_model or gpu.info.name)
    if model is None:
        raise ValueError("no MIG profiles are known for %s" % gpu.info.name)
    for key, layout in (("old", old), ("new", new)):
        problem = _impossible(model, layout)
        if problem:
            raise ValueError("%s layout is impossible on %s: %s" % (key, model.key, problem))
    live = layout_of(gpu)
    assert live is not None
    if not _between(live, gpu.mig.pending, old, new):
        raise ValueError(
            "the live layout (%s) is neither its old (%s) nor its new (%s) nor a state between them"
            % (_show(live), _show(old), _show(new))
        )
    return old, new


def _impossible(model: MigModel, layout: MigLayout) -> str:
    """Why `layout` cannot exist on a GPU of `model` ("" when it can)."""
    if not layout.enabled:
        return ""
    placements = []
    for spec in layout.instances:
        profile = model.find_profile(spec.profile_id)
        if profile is None:
            return "no GPU instance profile %d (%s)" % (spec.profile_id, model.profile_list())
        placements.append(Placement(profile.name, profile.id, spec.start, profile.memory_slices))
        counts: Dict[int, int] = {}
        for ci in spec.compute:
            cp = next((c for c in profile.compute_profiles if c.id == ci), None)
            if cp is None:
                return "%s@%d: no compute instance profile %d in it" % (profile.name, spec.start, ci)
            counts[ci] = counts.get(ci, 0) + 1
            if counts[ci] > cp.max_count:
                return "%s@%d: more than %d %s" % (profile.name, spec.start, cp.max_count, cp.name)
        slices = sum(c.slices for c in profile.compute_profiles for ci in spec.compute if c.id == ci)
        if slices > profile.compute_slices:
            return "%s@%d: compute instances of %d slices in %d" % (
                profile.name,
                spec.start,
                slices,
                profile.compute_slices,
            )
    result = check_layout(model, placements)
    return "" if result.ok else result.reason


def _between(live: MigLayout, pending: bool, old: MigLayout, new: MigLayout) -> bool:
    """Whether `live` is a state a change from old to new (or its undoing) passes through: MIG
    mode that of either, each instance one of either layout's with a subset of its compute
    instances (destroyed first, created last)."""
    modes = (old.enabled, new.enabled)
    if live.enabled not in modes or pending not in modes:
        return False
    specs = list(old.instances) + list(new.instances)
    for inst in live.instances:
        if not any(
            s.profile_id == inst.profile_id and s.start == inst.start and _sub(inst.compute, s.compute)
            for s in specs
        ):
            return False
    return True


def _sub(part: Tuple[int, ...], whole: Tuple[int, ...]) -> bool:
    rest = list(whole)
    for ci in part:
        if ci not in rest:
            return False
        rest.remove(ci)
    return True


MIG_CHANGES = Kind(recover=recover, apply=apply_change, refused=refused)
