"""MIG changes as transactions on the node, against the simulated backend (NVML's semantics)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpuops.core.mig.catalog import find_model
from gpuops.core.mig.layout import InstanceSpec, MigLayout, fingerprint, layout_of
from gpuops.node.backends.base import BackendError
from gpuops.node.backends.sim import SimBackend
from gpuops.node.mig_apply import ApplyError, apply_layout, recover
from gpuops.node.state import NodeState

A100 = find_model("A100-SXM4-40GB")
H100 = find_model("H100-80GB")
assert A100 is not None and H100 is not None


def _id(model: Any, name: str) -> int:
    return int(model.profile(name).id)


def _full_ci(model: Any, name: str) -> tuple[int, ...]:
    (default,) = [cp.id for cp in model.profile(name).compute_profiles if cp.default]
    return (default,)


def _spec() -> dict[str, Any]:
    return {
        "hostname": "n1",
        "users": {"alice": 1001, "bob": 1002},
        "tenants": {"vision": ["alice"], "nlp": ["bob"]},
        "gpus": [
            {"model": "A100-SXM4-40GB", "mig": {"enabled": True, "layout": []}},
            {"model": "A100-SXM4-40GB", "mig": {"enabled": True, "layout": ["3g.20gb:4", "2g.10gb:0"]}},
            {"model": "A100-SXM4-40GB"},
            {"model": "H100-80GB"},
        ],
        "workloads": [{"name": "busy", "kind": "training", "user": "alice", "gpu": 1, "instance": 0}],
    }


@pytest.fixture
def backend() -> SimBackend:
    return SimBackend(_spec(), clock=lambda: 1_700_000_000.0)


@pytest.fixture
def state(tmp_path: Path) -> NodeState:
    return NodeState(str(tmp_path / "state"))


def _layout(*items: tuple[str, int], model: Any = A100, enabled: bool = True) -> MigLayout:
    return MigLayout(enabled, tuple(InstanceSpec(_id(model, n), s, _full_ci(model, n)) for n, s in items))


def _live(backend: SimBackend, index: int) -> MigLayout | None:
    return layout_of(backend.sample().gpus[index])


def test_apply_then_nothing_to_do(backend: SimBackend, state: NodeState) -> None:
    target = _layout(("3g.20gb", 4), ("1g.5gb", 0), ("1g.5gb", 1), ("2g.10gb", 2))
    assert apply_layout(backend, state, 0, target).changed is True
    assert _live(backend, 0) == target.normalized()
    assert apply_layout(backend, state, 0, target).changed is False
    assert state.pending() == []


def test_processes_in_the_way_are_refused_with_pid_and_user(backend: SimBackend, state: NodeState) -> None:
    before = _live(backend, 1)
    with pytest.raises(ApplyError) as info:
        apply_layout(backend, state, 1, _layout(("7g.40gb", 0)))
    assert info.value.code == "in_use"
    assert "(alice)" in info.value.message and "pid " in info.value.message
    assert _live(backend, 1) == before


def test_force_ends_them_and_proceeds(backend: SimBackend, state: NodeState) -> None:
    result = apply_layout(backend, state, 1, _layout(("7g.40gb", 0)), force=True)
    assert result.changed is True and result.stopped
    assert _live(backend, 1) == _layout(("7g.40gb", 0))


def test_instances_kept_keep_their_processes(backend: SimBackend, state: NodeState) -> None:
    # The busy 3g.20gb at 4 stays; only the idle 2g.10gb at 0 is replaced by two 1g.5gb.
    target = _layout(("3g.20gb", 4), ("1g.5gb", 0), ("1g.5gb", 1))
    assert apply_layout(backend, state, 1, target).changed is True
    gpu = backend.sample().gpus[1]
    assert layout_of(gpu) == target.normalized()
    assert gpu.processes  # the workload on the kept instance still runs


def test_mode_changes_ampere_resets_hopper_does_not(backend: SimBackend, state: NodeState) -> None:
    apply_layout(backend, state, 2, _layout(("4g.20gb", 0)))
    assert _live(backend, 2) == _layout(("4g.20gb", 0))
    apply_layout(backend, state, 3, _layout(("3g.40gb", 4), model=H100))
    assert _live(backend, 3) == _layout(("3g.40gb", 4), model=H100)
    apply_layout(backend, state, 2, MigLayout(False))
    assert _live(backend, 2) == MigLayout(False)


def test_a_stale_plan_is_refused(backend: SimBackend, state: NodeState) -> None:
    planned_from = fingerprint(backend.sample().gpus[0])
    apply_layout(backend, state, 0, _layout(("7g.40gb", 0)))
    with pytest.raises(ApplyError) as info:
        apply_layout(backend, state, 0, _layout(("3g.20gb", 0)), expect=planned_from)
    assert info.value.code == "stale"


def test_processes_the_plan_did_not_list_are_never_stopped(backend: SimBackend, state: NodeState) -> None:
    gpu = backend.sample().gpus[1]
    (busy,) = gpu.processes  # alice's job on 3g.20gb@4
    target = _layout(("7g.40gb", 0))
    # The plan was reviewed when nothing ran there: the job that started since is not stopped,
    # not even with force.
    with pytest.raises(ApplyError) as info:
        apply_layout(backend, state, 1, target, fingerprint(gpu), force=True, known_pids=[])
    assert info.value.code == "stale"
    assert f"pid {busy.pid} (alice)" in info.value.message and "make a new plan" in info.value.message
    assert _live(backend, 1) == layout_of(gpu)
    # Listed (and one more that has ended since): forced, it proceeds.
    done = apply_layout(backend, state, 1, target, fingerprint(gpu), force=True, known_pids=[busy.pid, 99999])
    assert done.stopped == (busy.pid,) and _live(backend, 1) == target


class FailingCreates(SimBackend):
    """NVML failing on the n-th GPU instance creation (the hardware boundary's fault)."""

    fail_at = 3
    exception: type[BaseException] = BackendError

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.creates = 0
        self.armed = True

    def create_gpu_instance(self, gpu: int, profile_id: int, start: int | None = None) -> Any:
        self.creates += 1
        if self.armed and self.creates == self.fail_at:
            if self.exception is BackendError:
                raise BackendError("UNKNOWN", f"injected failure on create {self.creates}")
            raise self.exception()
        return super().create_gpu_instance(gpu, profile_id, start)


def test_a_failure_mid_change_restores_the_old_layout(state: NodeState) -> None:
    backend = FailingCreates(_spec(), clock=lambda: 1_700_000_000.0)
    apply_layout(backend, state, 0, _layout(("3g.20gb", 4), ("2g.10gb", 0)))
    backend.creates = 0
    old = _live(backend, 0)
    with pytest.raises(ApplyError) as info:
        apply_layout(backend, state, 0, _layout(("1g.5gb", 0), ("1g.5gb", 1), ("1g.5gb", 2), ("1g.5gb", 3)))
    assert info.value.code == "rolled_back" and "injected failure" in info.value.message
    assert _live(backend, 0) == old
    assert state.pending() == []


class Killed(BaseException):
    """Stands for the agent being killed: nothing in apply_layout catches it."""


def test_an_agent_killed_mid_change_is_recovered_at_next_start(state: NodeState) -> None:
    backend = FailingCreates(_spec(), clock=lambda: 1_700_000_000.0)
    backend.exception = Killed
    old = _live(backend, 1)
    with pytest.raises(Killed):
        apply_layout(backend, state, 1, _layout(("3g.20gb", 4), ("1g.5gb", 0), ("1g.5gb", 1), ("1g.5gb", 2)))
    assert _live(backend, 1) not in (old, None)  # really left between layouts
    assert len(state.pending()) == 1
    backend.armed = False
    recovery = recover(backend, state)
    assert recovery.notes == ["GPU 1: an interrupted change was undone (old layout restored)"]
    assert recovery.refused == {} and set(recovery.restored) == {1}
    assert _live(backend, 1) == old
    assert state.pending() == []


def test_the_node_lock_is_exclusive_and_dies_with_its_holder(state: NodeState) -> None:
    held = state.lock("apply by alice")
    from gpuops.node.state import LockBusy

    with pytest.raises(LockBusy, match="apply by alice"):
        state.lock("apply by bob")
    NodeState.unlock(held)
    state.unlock(state.lock("apply by bob"))
