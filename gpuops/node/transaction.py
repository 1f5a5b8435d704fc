"""One GPU's change as a transaction, on the node: what a MIG layout change (node/mig_apply.py)
and a partition mode change (node/partition_apply.py) share. Both re-lay a whole GPU.

`run` serves one mig_apply or partition_apply request under the node lock the agent holds: first
what an interrupted apply of that kind left (the kind's `recover`), then each GPU's change, each a
transaction of its own (one GPU refused does not stop the others). Inside a change,
`clear_the_way` refuses one that would disrupt a process the plan did not list (even forced), or
any process while not forced, and ends them when forced; `journaled` makes the change under a
journal entry (node/state.py) and undoes it on failure, so the GPU ends as it was or as asked,
never between; when even undoing fails the entry stays for the next apply's `recover`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from gpuops.core.model import Gpu, GpuProcess
from gpuops.node.backends.base import Backend, BackendError
from gpuops.node.state import NodeState


class ApplyError(Exception):
    """The change was not made (and the GPU is as it was, unless `code` is "stuck")."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Recovery:
    """What a kind's `recover` did: notes for the apply's output, GPUs it left alone (index -> the
    one-line reason; the apply changes none of them), and GPUs it put back as they were (index ->
    the fingerprint before, after: the apply's plan may have been made from the state it undid)."""

    def __init__(self) -> None:
        self.notes: List[str] = []
        self.refused: Dict[int, str] = {}
        self.restored: Dict[int, Tuple[str, str]] = {}


@dataclass(frozen=True)
class Kind:
    """A kind of GPU transaction: how to finish what an interrupted apply left, make one change
    (a core/protocol.py MigChange or PartitionChange, forced or not) and say a refusal."""

    recover: Callable[[Backend, NodeState], Recovery]
    apply: Callable[[Backend, NodeState, Any, bool], Any]
    refused: Callable[[int, str, str], Any]  # (gpu, code, message) -> the kind's result


def run(
    backend: Backend, state: NodeState, changes: Sequence[Any], force: bool, kind: Kind
) -> Tuple[List[Any], List[str]]:
    """Each change as its own transaction, after recovery: (the results, in the order asked; what
    recovery did or refused on GPUs this request does not change)."""
    recovery = kind.recover(backend, state)
    asked = {change.gpu for change in changes}
    # A refusal of a GPU this apply changes is said in its result; of another, as a note.
    recovered = [n for n in recovery.notes if n not in recovery.refused.values()] + [
        line for index, line in sorted(recovery.refused.items()) if index not in asked
    ]
    results: List[Any] = []
    for change in changes:
        refused = recovery.refused.get(change.gpu)
        if refused is not None:
            results.append(kind.refused(change.gpu, "journal", refused))
            continue
        restored = recovery.restored.get(change.gpu)
        if restored is not None and change.expect == restored[0]:
            # The plan was made from the half-done state this recovery just undid: that undoing
            # is the only change since, so the plan still holds from the state before.
            change = replace(change, expect=restored[1])
        try:
            results.append(kind.apply(backend, state, change, force))
        except ApplyError as exc:
            results.append(kind.refused(change.gpu, exc.code, exc.message))
    return results, recovered


def gpu_of(backend: Backend, index: int) -> Gpu:
    for gpu in backend.sample().gpus:
        if gpu.info.index == index:
            return gpu
    raise ApplyError("no_such_gpu", "GPU %d is not on this node" % index)


def who(processes: Sequence[GpuProcess]) -> str:
    return ", ".join("pid %d (%s)" % (p.pid, p.user or "?") for p in processes)


def clear_the_way(
    backend: Backend,
    index: int,
    blocking: Sequence[GpuProcess],
    known_pids: Optional[Sequence[int]],
    force: bool,
    unseen: str,
    in_use: str,
) -> List[int]:
    """End the processes in the change's way, or refuse: ApplyError("stale", `unseen`) when one
    is not among the plan's `known_pids` (None: no plan said), ApplyError("in_use", `in_use`)
    when not forced. The messages take the GPU's index and the processes. Returns the pids
    ended."""
    if known_pids is not None:
        # The plan was reviewed with its list of processes to stop: one started since would be
        # stopped without anyone having seen it, even with --force.
        started = [p for p in blocking if p.pid not in set(known_pids)]
        if started:
            raise ApplyError("stale", unseen % (index, who(started)))
    if blocking and not force:
        raise ApplyError("in_use", in_use % (index, who(blocking)))
    stopped = [p.pid for p in blocking]
    if stopped:
        left = backend.stop_processes(index, stopped)
        if left:
            raise ApplyError(
                "in_use", "GPU %d: processes %s did not end" % (index, ", ".join(map(str, left)))
            )
    return stopped


@dataclass(frozen=True)
class Words:
    """How a kind's rollback messages name what it restores: 'the old layout' / 'it' / 'its old
    layout is restored'."""

    restoring: str
    it: str
    restored: str


def journaled(
    state: NodeState,
    gpu: Gpu,
    journal: str,
    old: Dict[str, Any],
    new: Dict[str, Any],
    change: Callable[[], None],
    undo: Callable[[], None],
    words: Words,
) -> None:
    """`change()` under a journal entry of kind `journal` naming `old` and `new`; it raises
    BackendError or ApplyError when the GPU is not as asked after it. Then `undo()` puts the old
    state back: ApplyError("rolled_back"), the entry gone; when undoing fails too,
    ApplyError("stuck"), the entry kept for the next apply's recovery."""
    uuid, index = gpu.info.uuid, gpu.info.index
    state.begin(uuid, index, old, new, journal)
    try:
        change()
    except (BackendError, ApplyError) as exc:
        reason = exc.message
        try:
            undo()
        except (BackendError, ApplyError) as failed:
            raise ApplyError(
                "stuck",
                "GPU %d: %s; restoring %s failed too (%s); the journal keeps %s for recovery"
                % (index, reason, words.restoring, failed, words.it),
            ) from None
        state.end(uuid, journal)
        raise ApplyError("rolled_back", "GPU %d: %s; %s" % (index, reason, words.restored)) from None
    state.end(uuid, journal)
