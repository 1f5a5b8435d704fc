"""Changing one GPU's partition modes (AMD Instinct compute and memory partitions) as a
transaction, on the node, under the node lock the agent holds (node/agent.py).

`apply_partition` takes a GPU from its live modes to the wanted ones, a transaction of
node/transaction.py as `mig_apply.apply_layout` is for a MIG layout:

1. refuses if the GPU's modes changed since the plan (`expect`), or while processes run on it
   (a partition change needs the whole GPU idle: the driver answers BUSY otherwise) with their
   pids and users, unless forced — forced, it ends them first, and never one the plan did not list;
2. records the old and new modes in the journal (node/state.py, `partition-<uuid>.json`);
3. asks the backend for the change (`Backend.set_partition`: memory mode, then compute mode);
4. reads the modes back; on any failure it puts the old modes back, so the GPU ends in its old
   modes or its new ones; then clears the journal. When even that fails the journal stays, and
   the next apply resolves it (`recover`) before changing anything.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from gpuops.core.model import Gpu, PartitionState
from gpuops.core.protocol import PartitionChange, PartitionResult
from gpuops.node.backends.base import Backend, BackendError
from gpuops.node.state import PARTITION, NodeState
from gpuops.node.transaction import ApplyError, Kind, Recovery, Words, clear_the_way, gpu_of, journaled

_UNSEEN = "GPU %d: processes started since the plan would be stopped: %s; make a new plan"
_IN_USE = "GPU %d is in use by %s: a partition change needs it idle; --force ends them"


def modes_text(state: Optional[PartitionState]) -> str:
    """ "SPX/NPS1": what a plan's `expect` holds and messages show."""
    if state is None:
        return "no partition modes"
    return "%s/%s" % (state.compute_mode or "?", state.memory_mode or "?")


def _modes(gpu: Gpu) -> Tuple[str, str]:
    p = gpu.partition
    return (p.compute_mode, p.memory_mode) if p is not None else ("", "")


def apply_partition(
    backend: Backend,
    state: NodeState,
    index: int,
    compute: Optional[str],
    memory: Optional[str],
    expect: Optional[str] = None,
    force: bool = False,
    known_pids: Optional[Sequence[int]] = None,
) -> PartitionResult:
    """Give GPU `index` these modes (None: keep); returns what was done. Raises ApplyError."""
    gpu = gpu_of(backend, index)
    live = gpu.partition
    if live is None:
        raise ApplyError("not_supported", "GPU %d (%s) has no partition modes" % (index, gpu.info.name))
    if expect is not None and modes_text(live) != expect:
        raise ApplyError(
            "stale",
            "GPU %d's partition modes are %s, not %s as when the plan was made"
            % (index, modes_text(live), expect),
        )
    want = (compute or live.compute_mode, memory or live.memory_mode)
    if want == _modes(gpu):
        return PartitionResult(gpu=index, ok=True, changed=False, compute_mode=want[0], memory_mode=want[1])
    for kind, mode, accepted in (
        ("compute", compute, live.compute_modes),
        ("memory", memory, live.memory_modes),
    ):
        if mode is not None and accepted and mode not in accepted:
            raise ApplyError(
                "invalid", "GPU %d takes %s modes %s, not %s" % (index, kind, "/".join(accepted), mode)
            )
    if gpu.processes_error:
        raise ApplyError(
            "in_use",
            "GPU %d: its processes cannot be read (%s), so it is not known to be idle"
            % (index, gpu.processes_error),
        )
    stopped = clear_the_way(backend, index, list(gpu.processes), known_pids, force, _UNSEEN, _IN_USE)
    old = {"compute": live.compute_mode, "memory": live.memory_mode}
    new = {"compute": want[0], "memory": want[1]}

    def change() -> None:
        backend.set_partition(index, compute, memory)
        now = _modes(gpu_of(backend, index))
        if now != want:
            raise ApplyError(
                "verify", "GPU %d reads %s/%s after the change, not %s/%s" % (index, *now, *want)
            )

    def undo() -> None:
        # The backend may have put the old modes back already.
        if _modes(gpu_of(backend, index)) != (old["compute"], old["memory"]):
            backend.set_partition(index, old["compute"], old["memory"])
        back = _modes(gpu_of(backend, index))
        if back != (old["compute"], old["memory"]):
            raise ApplyError("verify", "it reads %s/%s" % back)

    modes = "its old modes %s/%s" % (old["compute"], old["memory"])
    words = Words(restoring=modes, it="them", restored=modes + " are restored")
    journaled(state, gpu, PARTITION, old, new, change, undo, words)
    return PartitionResult(
        gpu=index, ok=True, changed=True, compute_mode=want[0], memory_mode=want[1], stopped=tuple(stopped)
    )


def apply_change(backend: Backend, state: NodeState, change: PartitionChange, force: bool) -> PartitionResult:
    """One change of a partition_apply request (node/transaction.py `run`)."""
    return apply_partition(
        backend, state, change.gpu, change.compute, change.memory, change.expect, force, change.known_pids
    )


def refused(gpu: int, code: str, message: str) -> PartitionResult:
    return PartitionResult(gpu=gpu, ok=False, code=code, message=message)


def recover(backend: Backend, state: NodeState) -> Recovery:
    """Resolve the partition journals an interrupted apply left: modes that are the new ones end
    the journal; the old ones too (the change had not begun); anything else is set back to the
    old modes. A journal that names no GPU here, or modes the GPU does not take, is left alone."""
    done = Recovery()
    entries = state.journals(PARTITION)
    if not entries:
        return done
    gpus = {g.info.uuid: g for g in backend.sample().gpus}
    for path, record, problem in entries:
        gpu = gpus.get(str(record.get("uuid"))) if record is not None else None
        try:
            if problem:
                raise ValueError(problem)
            assert record is not None
            if gpu is None or gpu.partition is None:
                raise ValueError("it names GPU %s, which has no partition modes here" % record["uuid"])
            old = (record["old"].get("compute"), record["old"].get("memory"))
            new = (record["new"].get("compute"), record["new"].get("memory"))
            p = gpu.partition
            for compute, memory in (old, new):
                if compute not in p.compute_modes or memory not in p.memory_modes:
                    raise ValueError("modes %s/%s are not modes of %s" % (compute, memory, gpu.info.name))
            index = gpu.info.index
            if _modes(gpu) == new:
                done.notes.append("GPU %d: the interrupted partition change had completed" % index)
            elif _modes(gpu) == old:
                done.notes.append("GPU %d: the interrupted partition change had not begun" % index)
            else:
                backend.set_partition(index, old[0], old[1])
                if _modes(gpu_of(backend, index)) != old:
                    raise ValueError("the old modes did not come back")
                done.notes.append("GPU %d: an interrupted partition change was undone" % index)
            state.end(gpu.info.uuid, PARTITION)
        except (ValueError, KeyError, AttributeError, BackendError, ApplyError) as exc:
            why = getattr(exc, "message", None) or str(exc)
            line = "interrupted-apply journal %s: %s; left alone: check the GPU, then remove the journal" % (
                path,
                why,
            )
            if gpu is not None:
                done.refused[gpu.info.index] = "GPU %d: %s" % (gpu.info.index, line)
            done.notes.append(line)
    return done


PARTITION_CHANGES = Kind(recover=recover, apply=apply_change, refused=refused)
