"""The sim fleet's batch scheduler (gpuops/simfleet/demand.py) on in-process simulated nodes
with a test clock: queued work runs only where the nodes' tenant tables (as `gpuops apply` writes
them) or ownership grant it, finishes after its work at the queue speed, is preempted and keeps
its work, and shows on the GPU as a process of its user."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.node.backends.sim import SimBackend
from gpuops.node.limiter import TenantSpec, write_table
from gpuops.simfleet.demand import (
    BORROWED,
    DONE,
    GUARANTEED,
    QUEUED,
    RUNNING,
    SILO,
    Demand,
    Grant,
    grant_on,
    read_demand,
)
from tests.hypothesis_budget import examples

EPOCH = 1_000_000.0
SPEED = 3600.0  # an hour of work per second


class Clock:
    def __init__(self) -> None:
        self.t = EPOCH

    def __call__(self) -> float:
        return self.t


def node(
    name: str, owner: str, count: int, workloads: list[dict[str, Any]], clock: Clock, model: str = "A100-80GB"
) -> SimBackend:
    spec = {
        "version": 1,
        "hostname": name,
        "seed": 7,
        "epoch": EPOCH,
        "users": {"heidi": 1003, "ivan": 1004, "alice": 1001, "judy": 1005},
        "tenants": {"speech": ["heidi", "ivan"], "vision": ["alice"], "robotics": ["judy"], "analytics": []},
        "gpus": [{"model": model, "count": count, "owner": owner}],
        "workloads": workloads,
    }
    return SimBackend(spec=spec, clock=clock)


def busy(gpus: list[int], user: str = "heidi") -> dict[str, Any]:
    return {
        "name": f"busy-{user}-{gpus[0]}",
        "kind": "steady",
        "user": user,
        "gpus": gpus,
        "memory": "90%",
        "start": "-1h",
        "params": {"util": 98},
    }


def queued(name: str, hours: int, memory: str = "20GiB", user: str = "heidi") -> dict[str, Any]:
    return {
        "name": name,
        "kind": "training",
        "user": user,
        "memory": memory,
        "start": "pending",
        "duration": f"{hours}h",
    }


def table(state: Path, name: str, *lines: TenantSpec) -> None:
    write_table(state / name / "limiter", list(lines))


@pytest.fixture
def clock() -> Clock:
    return Clock()


def step(demand: Demand, clock: Clock, seconds: float) -> None:
    clock.t += seconds
    demand.tick()


def by_id(demand: Demand) -> dict[str, Any]:
    return {j.spec.name: j for j in demand.jobs}


def test_a_saturated_silo_keeps_its_queue_until_capacity_is_granted(clock: Clock, tmp_path: Path) -> None:
    speech = node("speech", "speech", 2, [busy([0, 1]), queued("sweep", 2), queued("eval", 1)], clock)
    spare = node("spare", "robotics", 2, [], clock)
    demand = Demand([("speech", speech), ("spare", spare)], tmp_path, tmp_path / "demand.json", speed=SPEED)
    assert [j.team for j in demand.jobs] == ["speech", "speech"]
    demand.tick()
    step(demand, clock, 60)
    assert {j.state for j in demand.jobs} == {QUEUED}  # its own cards are busy, nothing else is its
    assert spare.sample().gpus[0].processes == ()

    # `gpuops apply` of a pool: speech guaranteed on spare:1, borrowing allowed on both.
    uuid = spare.device(1).uuid
    table(
        tmp_path,
        "spare",
        TenantSpec("*", policy="best-effort", klass="offline"),
        TenantSpec("speech", compute=100, policy="burst-share", gpus=(uuid,)),
    )
    step(demand, clock, 1)
    jobs = by_id(demand)
    assert (jobs["sweep"].state, jobs["sweep"].node, jobs["sweep"].gpu, jobs["sweep"].grant) == (
        RUNNING,
        "spare",
        1,
        GUARANTEED,
    )
    assert (jobs["eval"].state, jobs["eval"].gpu, jobs["eval"].grant) == (RUNNING, 0, BORROWED)
    assert [w.name for w in speech.workloads() if w.state == "pending"] == []  # off the old queue

    step(demand, clock, 0.5)  # a quarter hour of each job's own time: warmed up
    sample = spare.sample()
    users = {g.info.index: [p.user for p in g.processes] for g in sample.gpus}
    assert users == {0: ["heidi"], 1: ["heidi"]}
    # under the limiter on a node with a tenant table: tagged with the team that was granted
    assert {(p.tenant, p.tenant_source) for g in sample.gpus for p in g.processes} == {("speech", "limiter")}
    assert all(g.sample.utilization_gpu_percent > 85 for g in sample.gpus)

    step(demand, clock, 0.6)  # eval (1 h) done at 1 s; sweep (2 h) still running
    assert jobs["eval"].state == DONE and jobs["eval"].node == "spare"  # keeps where it ran
    assert jobs["sweep"].state == RUNNING
    assert [p.user for p in spare.sample().gpus[0].processes] == []  # its process is gone
    step(demand, clock, 1.0)
    assert jobs["sweep"].state == DONE
    doc = read_demand(tmp_path)
    assert doc is not None
    assert doc["teams"]["speech"]["done"] == 2
    assert doc["teams"]["speech"]["work_done_hours"] == pytest.approx(3.0)
    assert all(g.sample.utilization_gpu_percent < 5 for g in spare.sample().gpus)


def test_an_idle_card_of_its_own_silo_takes_the_teams_work(clock: Clock, tmp_path: Path) -> None:
    speech = node("speech", "speech", 2, [busy([0]), queued("sweep", 1)], clock)
    demand = Demand([("speech", speech)], tmp_path, speed=SPEED)
    demand.tick()
    job = demand.jobs[0]
    assert (job.state, job.gpu, job.grant) == (RUNNING, 1, SILO)


def test_memory_decides_which_card_fits(clock: Clock, tmp_path: Path) -> None:
    speech = node("speech", "speech", 1, [busy([0]), queued("distill", 1, memory="60GiB")], clock)
    small = node("small", "analytics", 1, [], clock, model="L40S")  # 48 GB: too small
    big = node("big", "robotics", 1, [], clock)
    demand = Demand([("speech", speech), ("small", small), ("big", big)], tmp_path, speed=SPEED)
    table(tmp_path, "small", TenantSpec("speech", compute=100, policy="burst-share"))
    table(tmp_path, "big", TenantSpec("*", policy="best-effort", klass="offline"))
    demand.tick()
    job = demand.jobs[0]
    assert (job.node, job.grant) == ("big", BORROWED)  # guaranteed elsewhere, but it does not fit


def test_online_work_preempts_a_borrower_which_keeps_its_work(clock: Clock, tmp_path: Path) -> None:
    speech = node("speech", "speech", 1, [busy([0]), queued("long", 4)], clock)
    vision = node("vision", "vision", 1, [busy([0], user="alice"), queued("train", 1, user="alice")], clock)
    pool = node("pool", "robotics", 1, [], clock)
    demand = Demand([("speech", speech), ("vision", vision), ("pool", pool)], tmp_path, speed=SPEED)
    # Only speech may borrow at first; vision gets its guarantee later.
    table(tmp_path, "pool", TenantSpec("*", policy="best-effort", klass="offline"))
    demand.tick()
    jobs = by_id(demand)
    assert (jobs["long"].state, jobs["long"].grant) == (RUNNING, BORROWED)
    assert jobs["train"].state == QUEUED
    step(demand, clock, 1.0)  # one hour of its four done
    table(
        tmp_path,
        "pool",
        TenantSpec("*", policy="best-effort", klass="offline"),
        TenantSpec("vision", compute=100, policy="burst-share"),
    )
    step(demand, clock, 0.0)
    assert (jobs["train"].state, jobs["train"].grant) == (RUNNING, GUARANTEED)
    assert jobs["long"].state == QUEUED and jobs["long"].preempted == 1
    assert jobs["long"].done_work == pytest.approx(3600.0)  # the hour it did is kept
    step(demand, clock, 1.0)  # vision's hour done: the borrower comes back for its last 3 h
    assert jobs["train"].state == DONE
    step(demand, clock, 0.0)
    assert jobs["long"].state == RUNNING and jobs["long"].runs == 2
    assert jobs["long"].ends == pytest.approx(clock.t + 3.0)


def test_fixed_share_work_progresses_at_its_share(clock: Clock, tmp_path: Path) -> None:
    speech = node("speech", "speech", 1, [busy([0]), queued("sweep", 1)], clock)
    pool = node("pool", "robotics", 1, [], clock)
    table(tmp_path, "pool", TenantSpec("speech", compute=25, policy="fixed-share"))
    demand = Demand([("speech", speech), ("pool", pool)], tmp_path, speed=SPEED)
    demand.tick()
    job = demand.jobs[0]
    assert job.grant == GUARANTEED and job.rate == pytest.approx(0.25)
    assert job.ends == pytest.approx(clock.t + 4.0)  # an hour of work at a quarter of the card


def test_a_job_killed_by_apply_force_waits_again_with_its_work(clock: Clock, tmp_path: Path) -> None:
    speech = node("speech", "speech", 1, [busy([0]), queued("sweep", 4)], clock)
    pool = node("pool", "robotics", 1, [], clock)
    table(tmp_path, "pool", TenantSpec("speech", compute=100, policy="burst-share"))
    demand = Demand([("speech", speech), ("pool", pool)], tmp_path, speed=SPEED)
    demand.tick()
    step(demand, clock, 2.0)
    pids = [p.pid for p in pool.sample().gpus[0].processes]
    pool.stop_processes(0, pids)  # what `apply --force` does to a GPU's processes
    # MIG mode on: whole-GPU work cannot run there any more.
    pool.set_mig_mode(0, True)
    pool.reset_gpu(0)  # an A100 takes the new mode at a reset
    step(demand, clock, 0.5)
    job = demand.jobs[0]
    assert job.state == QUEUED and job.done_work == pytest.approx(2 * 3600.0)


def test_a_garbage_table_keeps_the_last_good_one(clock: Clock, tmp_path: Path) -> None:
    speech = node("speech", "speech", 1, [busy([0]), queued("a", 1), queued("b", 1)], clock)
    pool = node("pool", "robotics", 2, [], clock)
    table(tmp_path, "pool", TenantSpec("speech", compute=100, policy="burst-share", gpus=("0",)))
    demand = Demand([("speech", speech), ("pool", pool)], tmp_path, speed=SPEED)
    demand.tick()
    (tmp_path / "pool" / "limiter" / "tenants").write_text(
        "gpuops-limiter-table 1\ntenant speech compute=900\n"
    )
    step(demand, clock, 0.1)
    jobs = by_id(demand)
    assert (jobs["a"].state, jobs["a"].gpu) == (RUNNING, 0)
    assert jobs["b"].state == QUEUED  # GPU 1 was never granted


def test_grants_follow_the_table_then_ownership() -> None:
    star = TenantSpec("*", policy="best-effort", klass="offline")
    mine = TenantSpec("speech", compute=40, policy="fixed-share", gpus=("1", "GPU-x"))
    assert grant_on([], 0, "GPU-a", "speech", "speech") == Grant(SILO)
    assert grant_on([], 0, "GPU-a", "vision", "speech") is None
    assert grant_on([star], 0, "GPU-a", "vision", "speech") == Grant(BORROWED)
    assert grant_on([star, mine], 1, "GPU-b", "vision", "speech") == Grant(GUARANTEED, 0.4)
    assert grant_on([star, mine], 2, "GPU-x", None, "speech") == Grant(GUARANTEED, 0.4)
    assert grant_on([mine], 0, "GPU-a", "vision", "speech") is None
    assert not Grant(BORROWED).online and Grant(SILO).online


def test_demand_json_is_what_sim_queue_prints(clock: Clock, tmp_path: Path) -> None:
    from gpuops.cli.sim import queue_lines

    speech = node("speech", "speech", 2, [busy([0]), queued("sweep", 2)], clock)
    demand = Demand([("speech", speech)], tmp_path, tmp_path / "demand.json", speed=SPEED)
    demand.tick()
    step(demand, clock, 1.0)
    demand.write(clock.t)
    doc = json.loads((tmp_path / "demand.json").read_text())
    lines = queue_lines(doc, clock.t)
    assert "3600x" in lines[0]
    row = next(line for line in lines if line.startswith("speech/sweep"))
    assert row.split()[1:6] == ["speech", "running", "speech:1", "silo", "2.0h"]
    assert lines[-1] == "speech: 0 done, 1 running, 0 waiting; 1.0 of 2.0 job-hours done"


def test_bad_speed_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Demand([], tmp_path, speed=0)


@settings(max_examples=examples(150), deadline=None)
@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
        max_leaves=12,
    ),
    st.sampled_from(["jobs", "teams", "speed", "updated"]),
)
def test_a_damaged_demand_file_gives_one_line(
    tmp_path_factory: pytest.TempPathFactory, junk: Any, key: str
) -> None:
    """`gpuops sim queue` on a demand.json someone edited: its queue, or one line and exit 1."""
    from typer.testing import CliRunner

    from gpuops.cli.main import app

    directory = tmp_path_factory.mktemp("q")
    good: dict[str, Any] = {"version": 1, "speed": 60, "updated": 0, "teams": {}, "jobs": []}
    good[key] = junk
    (directory / "demand.json").write_text(json.dumps(good))
    result = CliRunner().invoke(app, ["sim", "queue", "--dir", str(directory)])
    assert result.exit_code in (0, 1), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    if result.exit_code == 1:
        assert len(result.output.strip().splitlines()) == 1, result.output
