"""SimBackend as the layers above see it: codec round trips, n/a values, queued work, state."""

from __future__ import annotations

import json
from typing import Any, Dict

import pytest

from gpuops.core.codec import from_json, to_json
from gpuops.core.model import Node, NodeSample, NotAvailable
from gpuops.node.backends.base import Backend, BackendError
from gpuops.node.backends.sim import SimBackend
from gpuops.node.sim.spec import builtin_scenarios

T0 = 1_717_545_600.0 + 14 * 3600  # Wednesday 14:00 UTC
GIB = 1024**3


class Clock:
    def __init__(self, t: float = T0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize("scenario", builtin_scenarios())
def test_inventory_and_sample_round_trip_through_the_codec(scenario: str) -> None:
    b = SimBackend(spec=scenario, clock=Clock())
    assert isinstance(b, Backend) and b.name == "sim"
    node = b.inventory()
    assert all(g.sample is None and g.processes == () for g in node.gpus)
    wire = json.loads(json.dumps(to_json(node)))
    assert from_json(Node, wire) == node
    sample = b.sample()
    wire = json.loads(json.dumps(to_json(sample)))
    assert from_json(NodeSample, wire) == sample
    assert sample.timestamp == T0 and all(g.sample and g.sample.timestamp == T0 for g in sample.gpus)


def test_demo_node_shows_a_realistic_fleet() -> None:
    b = SimBackend(clock=Clock())
    gpus = b.sample().gpus
    owners = {g.owner for g in gpus}
    assert owners == {"vision", "nlp", "research", "platform"}
    idle_silos = [g for g in gpus if not g.processes]
    assert len(idle_silos) >= 2
    mig = [g for g in gpus if g.mig and g.mig.current]
    assert (
        len(mig) == 1
        and mig[0].sample
        and mig[0].sample.utilization_gpu_percent == NotAvailable("NOT_SUPPORTED")
    )
    states = {w.name: w.state for w in b.workloads()}
    assert states["detr-finetune"] == "pending" and states["eval-sweep"] == "pending"
    assert states["vit-pretrain"] == "running"
    # The scheduled sweep starts two hours after the node came up, and ends three hours later.
    assert {w.name: w.state for w in b.workloads(at=b.epoch + 3 * 3600)}["eval-sweep"] == "running"
    assert {w.name: w.state for w in b.workloads(at=b.epoch + 6 * 3600)}["eval-sweep"] == "done"


def test_lost_gpu_reports_gpu_is_lost_everywhere() -> None:
    b = SimBackend(spec="mixed-node", clock=Clock())
    lost = b.sample().gpus[4]
    s = lost.sample
    assert s is not None
    na = NotAvailable("GPU_IS_LOST")
    assert [
        s.utilization_gpu_percent,
        s.utilization_memory_percent,
        s.memory_used_bytes,
        s.memory_total_bytes,
        s.power_watts,
        s.temperature_celsius,
        s.sm_clock_mhz,
        s.memory_clock_mhz,
    ] == [na] * 8
    assert lost.info.memory_total_bytes == na and lost.processes == ()
    assert lost.info.uuid.startswith("GPU-")  # identity is still known from before
    with pytest.raises(BackendError) as exc:
        b.reset_gpu(4)
    assert exc.value.code == "GPU_IS_LOST"


def test_gpu_lost_later() -> None:
    clock = Clock()
    spec = {
        "epoch": T0,
        "gpus": [{"model": "A100-40GB", "lost_at": "+1h", "mig": {"enabled": True, "layout": ["7g.40gb"]}}],
        "workloads": [{"name": "job", "kind": "training", "gpu": 0, "instance": 0}],
    }
    b = SimBackend(spec=spec, clock=clock)
    assert b.sample().gpus[0].processes
    clock.t = T0 + 7200
    g = b.sample().gpus[0]
    assert g.sample and g.sample.power_watts == NotAvailable("GPU_IS_LOST") and g.mig is None
    assert b.workloads()[0].state == "blocked"
    with pytest.raises(BackendError) as exc:
        b.destroy_gpu_instance(0, 0)
    assert exc.value.code == "GPU_IS_LOST"
    clock.t = T0  # figures are a function of time: before the loss, all is well
    assert b.sample().gpus[0].processes


def test_unsupported_fields_are_not_available() -> None:
    spec = {
        "gpus": [
            {
                "model": "L40S",
                "unsupported": [
                    "power",
                    "temperature",
                    "sm_clock",
                    "memory",
                    "process_memory",
                    "power_limit",
                ],
            }
        ],
        "workloads": [{"kind": "steady", "gpu": 0}],
    }
    g = SimBackend(spec=spec, clock=Clock()).sample().gpus[0]
    na = NotAvailable("NOT_SUPPORTED")
    assert g.sample is not None
    assert g.sample.power_watts == na and g.sample.temperature_celsius == na and g.sample.sm_clock_mhz == na
    assert g.sample.memory_used_bytes == na and g.sample.memory_total_bytes == na
    assert g.processes[0].used_memory_bytes == na
    assert g.info.power_limit_watts == na
    assert isinstance(g.sample.utilization_gpu_percent, float)
    assert isinstance(g.sample.memory_clock_mhz, int)


def test_queued_work_can_be_placed_later() -> None:
    clock = Clock()
    b = SimBackend(spec="idle-silo", clock=clock)
    queued = [w for w in b.workloads() if w.state == "pending"]
    assert [w.name for w in queued] == ["speech-train-a", "speech-train-b"]
    assert queued[0].tenant == "speech" and queued[0].gpus == ()
    with pytest.raises(BackendError) as exc:
        b.start_workload("speech-train-a")
    assert exc.value.code == "INVALID_ARGUMENT"
    status = b.start_workload("speech-train-a", gpus=[2])
    assert status.state == "running" and status.gpus == (2,) and status.stop == T0 + 12 * 3600
    clock.t = T0 + 120  # past the start-up, where it loads and allocates
    (proc,) = b.sample().gpus[2].processes
    assert proc.user == "nora" and proc.pid == status.pids[0] and proc.used_memory_bytes == 36 * GIB
    clock.t = T0 + 13 * 3600
    assert {w.name: w.state for w in b.workloads()}["speech-train-a"] == "done"
    assert b.sample().gpus[2].processes == ()
    with pytest.raises(BackendError) as exc:
        b.start_workload("nope")
    assert exc.value.code == "NOT_FOUND"
    with pytest.raises(BackendError) as exc:
        b.start_workload("speech-train-b", gpus=[9])
    assert exc.value.code == "INVALID_ARGUMENT"


def test_stop_workload_frees_the_gpu_for_a_mode_change() -> None:
    b = SimBackend(spec="mixed-node", clock=Clock())
    with pytest.raises(BackendError) as exc:
        b.reset_gpu(5)  # the A30's MIG enable is pending, but a stale kernel holds it
    assert exc.value.code == "IN_USE"
    b.stop_workload("kim-old-kernel")
    b.reset_gpu(5)
    mig = b.inventory().gpus[5].mig
    assert mig is not None and mig.current and mig.pending


def test_start_on_a_mig_instance() -> None:
    clock = Clock()
    b = SimBackend(spec="hopper-node", clock=clock)
    gis = {gi.profile_name: gi for gi in b.inventory().gpus[1].mig.gpu_instances}  # type: ignore[union-attr]
    free = gis["2g.20gb"]
    b.start_workload("hugo-ablation", gpus=[1], gpu_instance_id=free.id)
    clock.t = T0 + 120
    procs = [p for p in b.sample().gpus[1].processes if p.user == "hugo"]
    assert [(p.gpu_instance_id, p.compute_instance_id) for p in procs] == [(free.id, 0)]
    assert procs[0].used_memory_bytes == free.memory_total_bytes  # 60GiB asked, the instance has less
    with pytest.raises(BackendError) as exc:
        b.destroy_compute_instance(1, free.id, 0)
    assert exc.value.code == "IN_USE"


def test_state_export_and_import() -> None:
    clock = Clock()
    a = SimBackend(spec="demo-node", clock=clock)
    a.set_mig_mode(7, True)
    a.reset_gpu(7)
    gi = a.create_gpu_instance(7, 9)
    a.create_compute_instance(7, gi.id, 2)
    a.start_workload("detr-finetune", gpus=[7], gpu_instance_id=gi.id)
    state = a.export_state()
    assert json.loads(json.dumps(state)) == state
    b = SimBackend(spec="demo-node", clock=clock)
    assert b.inventory() != a.inventory()
    b.import_state(state)
    assert b.inventory() == a.inventory()
    assert to_json(b.sample()) == to_json(a.sample())
    # A state that does not fit is refused, and nothing changes.
    before = b.export_state()
    broken: Dict[str, Any] = json.loads(json.dumps(state))
    broken["devices"][7]["gpu_instances"].append(
        {"id": 1, "profile_id": 9, "start": 4, "compute_instances": []}
    )
    with pytest.raises(ValueError):
        b.import_state(broken)
    assert b.export_state() == before
    with pytest.raises(ValueError):
        b.import_state({"version": 1, "hostname": "elsewhere"})


def test_close() -> None:
    b = SimBackend(clock=Clock())
    b.close()
    with pytest.raises(BackendError) as exc:
        b.sample()
    assert exc.value.code == "UNINITIALIZED"


def test_users_and_tenants_are_exposed() -> None:
    b = SimBackend(clock=Clock())
    assert b.users()["alice"] == 1001
    assert b.tenants()["vision"] == ("alice", "bob")


# ---- samples are a pure function of (seed, time), whatever the caches saw ---------------------


def _sample_at(b: SimBackend, clock: Clock, t: float) -> Any:
    clock.t = t
    return to_json(b.sample())


@pytest.mark.parametrize("scenario", ["demo-node", "hopper-node", "mixed-node"])
def test_samples_do_not_depend_on_the_order_or_rate_of_sampling(scenario: str) -> None:
    times = [T0 + 0.375 + i for i in range(25 * 60)]  # 25 minutes, past the temperature's history
    clocks = [Clock(), Clock(), Clock()]
    every, sparse, backwards = (SimBackend(spec=scenario, clock=c, seed=11) for c in clocks)
    each_second = {t: _sample_at(every, clocks[0], t) for t in times}
    every_17s = {t: _sample_at(sparse, clocks[1], t) for t in times[::17]}
    reverse_7s = {t: _sample_at(backwards, clocks[2], t) for t in reversed(times[::7])}
    assert every_17s == {t: each_second[t] for t in every_17s}
    assert reverse_7s == {t: each_second[t] for t in reverse_7s}
    # And what a backend that never sampled before says.
    for t in times[::311]:
        clock = Clock()
        assert _sample_at(SimBackend(spec=scenario, clock=clock, seed=11), clock, t) == each_second[t]
    # The temperature still lags the load: it is not the same at every instant of a minute.
    temps = {
        g["sample"]["temperature_celsius"]
        for s in each_second.values()
        for g in s["gpus"]
        if isinstance(g["sample"]["temperature_celsius"], float)
    }
    assert len(temps) > 3


def test_samples_follow_state_changes_whatever_was_sampled_before() -> None:
    def change(b: SimBackend, clock: Clock) -> None:
        clock.t = T0 + 600
        b.set_mig_mode(7, True)
        b.reset_gpu(7)
        gi = b.create_gpu_instance(7, 9)
        b.create_compute_instance(7, gi.id, 2)
        b.start_workload("detr-finetune", gpus=[7], gpu_instance_id=gi.id)
        b.stop_workload("chat-api")
        b.device(3).lost = True

    warm_clock, cold_clock = Clock(), Clock()
    warm = SimBackend(spec="demo-node", clock=warm_clock)
    for i in range(600):
        _sample_at(warm, warm_clock, T0 + i)
    cold = SimBackend(spec="demo-node", clock=cold_clock)
    change(warm, warm_clock)
    change(cold, cold_clock)
    for t in [T0 + 600 + i for i in range(0, 900, 13)]:
        assert _sample_at(warm, warm_clock, t) == _sample_at(cold, cold_clock, t)
    warm_clock.t = T0 + 900
    gpus = warm.sample().gpus
    assert gpus[3].sample and gpus[3].sample.power_watts == NotAvailable("GPU_IS_LOST")
    assert gpus[7].mig and gpus[7].mig.current and [p.user for p in gpus[7].processes] == ["bob"]
    chat = next(w for w in warm.workloads() if w.name == "chat-api")
    assert chat.state == "done" and not {p.pid for g in gpus for p in g.processes} & set(chat.pids)
