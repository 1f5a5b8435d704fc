"""Changing one GPU's partition modes (AMD Instinct compute and memory partitions) as a
transaction, on the node, under the node lock the agent holds (node/agent.py).

`apply_partition` takes a GPU from its live modes to the wanted ones, as `mig_apply.apply_layout`
does for a MIG layout:

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

from typing import Dict, List, Optional, Sequence, Tuple

from gpuops.core.model import Gpu, PartitionState
from gpuops.core.protocol import PartitionResult
from gpuops.node.backends.base import Backend, BackendError
from gpuops.node.state import PARTITION, NodeState


class ApplyError(Exception):
    """The change was not made (and the GPU is as it was, unless `code` is "stuck")."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def modes_text(state: Optional[PartitionState]) -> str:
    """ "SPX/NPS1": what a plan's `expect` holds and messages show."""
    if state is None:
        return "no partition modes"
    return "%s/%s" % (state.compute_mode or "?", state.memory_mode or "?")


def _gpu(backend: Backend, index: int) -> Gpu:
    for gpu in backend.sample().gpus:
        if gpu.info.index == index:
            return gpu
    raise ApplyError("no_such_gpu", "GPU %d is not on this node" % index)


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
    gpu = _gpu(backend, index)
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
    blocking = list(gpu.processes)
    if known_pids is not None:
        # The plan was reviewed with its list of processes to stop: one started since would be
        # stopped without anyone having seen it, even with --force.
        unseen = [p for p in blocking if p.pid not in set(known_pids)]
        if unseen:
            raise ApplyError(
                "stale",
                "GPU %d: processes started since the plan would be stopped: %s; make a new plan"
                % (index, _who(unseen)),
            )
    if blocking and not force:
        raise ApplyError(
            "in_use",
            "GPU %d is in use by %s: a partition change needs it idle; --force ends them"
            % (index, _who(blocking)),
        )
    stopped = [p.pid for p in blocking]
    if stopped:
        left = backend.stop_processes(index, stopped)
        if left:
            raise ApplyError(
                "in_use", "GPU %d: processes %s did not end" % (index, ", ".join(map(str, left)))
            )
    old = {"compute": live.compute_mode, "memory": live.memory_mode}
    new = {"compute": want[0], "memory": want[1]}
    state.begin(gpu.info.uuid, index, old, new, PARTITION)
    try:
        backend.set_partition(index, compute, memory)
        now = _modes(_gpu(backend, index))
        if now != want:
            raise ApplyError(
                "verify", "GPU %d reads %s/%s after the change, not %s/%s" % (index, *now, *want)
            )
    except (BackendError, ApplyError) as exc:
        reason = exc.message
        _restore(backend, state, gpu.info.uuid, index, old, reason)
        raise ApplyError(
            "rolled_back",
            "GPU %d: %s; its old modes %s/%s are restored" % (index, reason, old["compute"], old["memory"]),
        ) from None
    state.end(gpu.info.uuid, PARTITION)
    return PartitionResult(
        gpu=index, ok=True, changed=True, compute_mode=want[0], memory_mode=want[1], stopped=tuple(stopped)
    )


def _restore(
    backend: Backend, state: NodeState, uuid: str, index: int, old: Dict[str, str], reason: str
) -> None:
    """Put the old modes back (the backend may have already); the journal goes once they are."""
    try:
        if _modes(_gpu(backend, index)) != (old["compute"], old["memory"]):
            backend.set_partition(index, old["compute"], old["memory"])
        back = _modes(_gpu(backend, index))
        if back != (old["compute"], old["memory"]):
            raise ApplyError("verify", "it reads %s/%s" % back)
    except (BackendError, ApplyError) as undo:
        # The journal stays: the next apply checks it and tries again.
        raise ApplyError(
            "stuck",
            "GPU %d: %s; restoring its old modes %s/%s failed too (%s); the journal keeps them for recovery"
            % (index, reason, old["compute"], old["memory"], getattr(undo, "message", undo)),
        ) from None
    state.end(uuid, PARTITION)


def _who(processes: Sequence[object]) -> str:
    return ", ".join("pid %d (%s)" % (p.pid, p.user or "?") for p in processes)  # type: ignore[attr-defined]


class Recovery:
    """What `recover` did: notes for the apply's output and the GPUs it left alone (index -> the
    one-line reason; the apply changes none of them)."""

    def __init__(self) -> None:
        self.notes: List[str] = []
        self.refused: Dict[int, str] = {}


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
                if _modes(_gpu(backend, index)) != old:
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
