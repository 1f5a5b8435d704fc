"""The simulator's MIG state machine against NVML's semantics (reference/mig-mps.md, sections 2-3)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from gpuops.core.mig.catalog import MODELS
from gpuops.core.mig.placement import Placement, check_layout, driver_start
from gpuops.core.model import NotAvailable
from gpuops.node.backends.base import BackendError
from gpuops.node.backends.sim import SimBackend
from tests.hypothesis_budget import examples

T0 = 1_717_545_600.0  # Wednesday 2024-06-05 00:00 UTC


def node(
    model: str = "A100-SXM4-40GB",
    mig: Any = False,
    workloads: Optional[List[Dict[str, Any]]] = None,
    driver: str = "550.54.15",
    count: int = 1,
) -> SimBackend:
    spec: Dict[str, Any] = {
        "hostname": "mig-test",
        "seed": 3,
        "epoch": T0,
        "driver_version": driver,
        "gpus": [{"model": model, "count": count, "mig": mig}],
        "workloads": workloads or [],
    }
    return SimBackend(spec=spec, clock=lambda: T0)


def code(exc: pytest.ExceptionInfo[BackendError]) -> str:
    return exc.value.code


def layout(b: SimBackend, gpu: int = 0) -> List[tuple]:
    mig = b.inventory().gpus[gpu].mig
    assert mig is not None
    return sorted((gi.profile_id, gi.start) for gi in mig.gpu_instances)


# ---- MIG mode ------------------------------------------------------------------------------


def test_mig_mode_not_supported_without_mig() -> None:
    b = node("L40S")
    with pytest.raises(BackendError) as exc:
        b.set_mig_mode(0, True)
    assert code(exc) == "NOT_SUPPORTED"
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(0, 19)
    assert code(exc) == "NOT_SUPPORTED"
    assert b.inventory().gpus[0].mig is None
    assert not b.inventory().gpus[0].info.mig_capable


def test_ampere_mode_is_pending_until_reset() -> None:
    b = node("A100-SXM4-40GB")
    change = b.set_mig_mode(0, True)
    assert (change.current, change.pending, change.reset_required) == (False, True, True)
    mig = b.inventory().gpus[0].mig
    assert mig is not None and (mig.current, mig.pending) == (False, True)
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(0, 19)
    assert code(exc) == "NOT_SUPPORTED"  # current mode still off
    # Utilization is still there: the GPU is not in MIG mode yet.
    assert not isinstance(b.sample().gpus[0].sample.utilization_gpu_percent, NotAvailable)  # type: ignore[union-attr]
    b.reset_gpu(0)
    mig = b.inventory().gpus[0].mig
    assert mig is not None and (mig.current, mig.pending) == (True, True)
    assert b.create_gpu_instance(0, 0).id == 0


def test_ampere_pending_can_be_cancelled_before_reset() -> None:
    b = node("A30")
    b.set_mig_mode(0, True)
    change = b.set_mig_mode(0, False)
    assert (change.current, change.pending) == (False, False)
    b.reset_gpu(0)
    assert b.inventory().gpus[0].mig.current is False  # type: ignore[union-attr]


def test_hopper_mode_changes_at_once() -> None:
    b = node("H100-80GB")
    change = b.set_mig_mode(0, True)
    assert (change.current, change.pending, change.reset_required) == (True, True, False)
    gi = b.create_gpu_instance(0, 9)
    assert gi.profile_name == "3g.40gb"
    b.destroy_gpu_instance(0, gi.id)
    change = b.set_mig_mode(0, False)
    assert (change.current, change.pending) == (False, False)


@pytest.mark.parametrize("model", ["A100-SXM4-40GB", "H100-80GB"])
def test_mode_change_refused_with_processes(model: str) -> None:
    b = node(model, workloads=[{"kind": "steady", "gpu": 0}])
    with pytest.raises(BackendError) as exc:
        b.set_mig_mode(0, True)
    assert code(exc) == "IN_USE"
    with pytest.raises(BackendError) as exc:
        b.reset_gpu(0)
    assert code(exc) == "IN_USE"
    mig = b.inventory().gpus[0].mig
    assert mig is not None and (mig.current, mig.pending) == (False, False)


@pytest.mark.parametrize("model", ["A100-SXM4-40GB", "H100-80GB"])
def test_disabling_with_instances_is_refused(model: str) -> None:
    b = node(model, mig={"enabled": True, "layout": ["3g.20gb" if "A100" in model else "3g.40gb"]})
    with pytest.raises(BackendError) as exc:
        b.set_mig_mode(0, False)
    assert code(exc) == "IN_USE"
    gi = b.inventory().gpus[0].mig.gpu_instances[0]  # type: ignore[union-attr]
    b.destroy_compute_instance(0, gi.id, gi.compute_instances[0].id)
    b.destroy_gpu_instance(0, gi.id)
    change = b.set_mig_mode(0, False)
    assert change.pending is False


def test_instances_never_survive_a_reset() -> None:
    b = node(mig={"enabled": True, "layout": ["3g.20gb", "2g.10gb"]})
    assert len(layout(b)) == 2
    b.reset_gpu(0)  # no processes: allowed, and MIG devices are gone
    mig = b.inventory().gpus[0].mig
    assert mig is not None and mig.current and mig.gpu_instances == ()


def test_instances_never_survive_a_hopper_mode_change() -> None:
    b = node("H100-80GB", mig={"enabled": True})
    b.create_gpu_instance(0, 19)
    b.set_mig_mode(0, True)  # same mode: nothing changes
    assert len(layout(b)) == 1


# ---- GPU instances -------------------------------------------------------------------------


def test_create_needs_mig_on_and_valid_arguments() -> None:
    b = node(mig=True)
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(0, 42)
    assert code(exc) == "INVALID_ARGUMENT"
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(0, 9, start=2)  # 3g starts at 0 or 4 only
    assert code(exc) == "INVALID_ARGUMENT"
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(7, 9)
    assert code(exc) == "INVALID_ARGUMENT"


def test_insufficient_resources_on_overlap_and_max_count() -> None:
    b = node(mig=True)
    b.create_gpu_instance(0, 9, start=4)
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(0, 14, start=4)  # 2g at 4 overlaps the 3g at 4-7
    assert code(exc) == "INSUFFICIENT_RESOURCES"
    b.create_gpu_instance(0, 20)  # one 1g.5gb+me
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(0, 20)  # at most one +me
    assert code(exc) == "INSUFFICIENT_RESOURCES"
    assert "at most 1" in exc.value.message
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(0, 0)  # 7g: the GPU is no longer empty
    assert code(exc) == "INSUFFICIENT_RESOURCES"


def test_engines_are_a_resource_too() -> None:
    # A30 has one OFA: 1g.6gb+me and 2g.12gb+me cannot both exist (catalog + placement rules).
    b = node("A30", mig=True)
    b.create_gpu_instance(0, 21)
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(0, 6)
    assert code(exc) == "INSUFFICIENT_RESOURCES"


def test_default_driver_order_reproduces_the_transcript() -> None:
    # reference: `-cgi 19,19,14,9` fails "Insufficient Resources" while `9,19,14,19` works.
    b = node(mig=True)
    for pid in (19, 19, 14):
        b.create_gpu_instance(0, pid)
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(0, 9)
    assert code(exc) == "INSUFFICIENT_RESOURCES"
    assert "profile 9" in exc.value.message

    b = node(mig=True)
    made = [b.create_gpu_instance(0, pid) for pid in (9, 19, 14, 19)]
    assert [(gi.profile_name, gi.start) for gi in made] == [
        ("3g.20gb", 4),
        ("1g.5gb", 0),
        ("2g.10gb", 2),
        ("1g.5gb", 1),
    ]


def test_1g_instances_land_in_the_observed_slot_order() -> None:
    b = node(mig=True)
    starts = [b.create_gpu_instance(0, 19).start for _ in range(7)]
    assert starts == [6, 4, 5, 0, 1, 2, 3]
    with pytest.raises(BackendError) as exc:
        b.create_gpu_instance(0, 19)
    assert code(exc) == "INSUFFICIENT_RESOURCES"


def test_gpu_instance_ids_follow_the_transcripts() -> None:
    b = node(mig=True)
    assert b.create_gpu_instance(0, 0).id == 0  # 7g gets 0
    b.destroy_gpu_instance(0, 0)
    ids = {b.create_gpu_instance(0, 19, start=n).id: n for n in range(7)}
    assert ids == {7 + n: n for n in range(7)}  # 1g in slot n gets 7+n
    for gi_id in list(ids):
        b.destroy_gpu_instance(0, gi_id)
    assert [b.create_gpu_instance(0, 14, start=s).id for s in (0, 2, 4)] == [3, 4, 5]  # 2g at 0/2/4
    b2 = node(mig=True)
    assert [b2.create_gpu_instance(0, 9, start=s).id for s in (0, 4)] == [1, 2]


def test_destroy_unknown_instance_is_not_found() -> None:
    b = node(mig=True)
    with pytest.raises(BackendError) as exc:
        b.destroy_gpu_instance(0, 3)
    assert code(exc) == "NOT_FOUND"
    gi = b.create_gpu_instance(0, 9)
    with pytest.raises(BackendError) as exc:
        b.destroy_compute_instance(0, gi.id, 0)
    assert code(exc) == "NOT_FOUND"


def test_profiles_newer_than_the_driver_are_invalid() -> None:
    b = node(mig=True, driver="460.91.03")  # +me needs R470, 1g.10gb needs R525
    for pid in (20, 15):
        with pytest.raises(BackendError) as exc:
            b.create_gpu_instance(0, pid)
        assert code(exc) == "INVALID_ARGUMENT"
    assert b.create_gpu_instance(0, 19).start == 6


# ---- compute instances ---------------------------------------------------------------------


def test_compute_instances_limits_and_names() -> None:
    b = node(mig=True)
    gi = b.create_gpu_instance(0, 9)  # 3g.20gb: 1c x3, 2c x1, 3c
    cis = [b.create_compute_instance(0, gi.id, 0) for _ in range(3)]
    assert [(c.id, c.start, c.size, c.name) for c in cis] == [
        (0, 0, 1, "1c.3g.20gb"),
        (1, 1, 1, "1c.3g.20gb"),
        (2, 2, 1, "1c.3g.20gb"),
    ]
    with pytest.raises(BackendError) as exc:
        b.create_compute_instance(0, gi.id, 0)
    assert code(exc) == "INSUFFICIENT_RESOURCES"
    with pytest.raises(BackendError) as exc:
        b.create_compute_instance(0, gi.id, 2)  # 3c: compute slices used up
    assert code(exc) == "INSUFFICIENT_RESOURCES"
    uuids = {c.uuid for c in cis}
    assert len(uuids) == 3 and all(u.startswith("MIG-") and len(u) == 40 for u in uuids)
    b.destroy_compute_instance(0, gi.id, 1)
    again = b.create_compute_instance(0, gi.id, 0)
    assert (again.id, again.start) == (1, 1)
    assert again.uuid not in uuids  # a re-created MIG device has a new UUID


def test_compute_instance_profile_must_exist_in_the_gpu_instance() -> None:
    b = node(mig=True)
    gi = b.create_gpu_instance(0, 5)  # 4g: 1c, 2c, 4c; no 3c
    with pytest.raises(BackendError) as exc:
        b.create_compute_instance(0, gi.id, 2)
    assert code(exc) == "INVALID_ARGUMENT"
    with pytest.raises(BackendError) as exc:
        b.create_compute_instance(0, gi.id, 1, start=1)  # 2c starts at 0 or 2
    assert code(exc) == "INVALID_ARGUMENT"
    full = b.create_compute_instance(0, gi.id, 3)
    assert (full.name, full.size, full.multiprocessor_count) == ("4g.20gb", 4, 56)
    with pytest.raises(BackendError) as exc:
        b.create_compute_instance(0, gi.id, 0)
    assert code(exc) == "INSUFFICIENT_RESOURCES"


def test_compute_instance_on_missing_gpu_instance() -> None:
    b = node(mig=True)
    with pytest.raises(BackendError) as exc:
        b.create_compute_instance(0, 1, 0)
    assert code(exc) == "NOT_FOUND"


def test_mig_uuids_are_deterministic() -> None:
    a = node(mig={"enabled": True, "layout": ["3g.20gb", "1g.5gb"]})
    b = node(mig={"enabled": True, "layout": ["3g.20gb", "1g.5gb"]})
    assert a.inventory() == b.inventory()
    uuids = [ci.uuid for gi in a.inventory().gpus[0].mig.gpu_instances for ci in gi.compute_instances]  # type: ignore[union-attr]
    assert len(set(uuids)) == 2


# ---- destroy refusals and processes on instances -------------------------------------------

MIG_WORK = [
    {"name": "api", "kind": "steady", "gpu": 0, "instance": 0, "memory": "8GiB", "params": {"util": 60}},
    {"name": "later", "kind": "steady", "gpu": 0, "instance": 1, "start": "+1h"},
]


def test_destroy_refused_while_processes_run() -> None:
    b = node(mig={"enabled": True, "layout": ["3g.20gb", "2g.10gb"]}, workloads=MIG_WORK)
    gis = {gi.profile_name: gi for gi in b.inventory().gpus[0].mig.gpu_instances}  # type: ignore[union-attr]
    busy = gis["3g.20gb"]
    with pytest.raises(BackendError) as exc:
        b.destroy_compute_instance(0, busy.id, busy.compute_instances[0].id)
    assert code(exc) == "IN_USE"
    with pytest.raises(BackendError) as exc:
        b.destroy_gpu_instance(0, busy.id)
    assert code(exc) == "IN_USE"
    with pytest.raises(BackendError) as exc:
        b.set_mig_mode(0, False)
    assert code(exc) == "IN_USE"
    with pytest.raises(BackendError) as exc:
        b.reset_gpu(0)
    assert code(exc) == "IN_USE"
    # The idle instance: destroying it is refused while its CI exists, allowed after.
    idle = gis["2g.10gb"]
    with pytest.raises(BackendError) as exc:
        b.destroy_gpu_instance(0, idle.id)
    assert code(exc) == "IN_USE"
    b.destroy_compute_instance(0, idle.id, idle.compute_instances[0].id)
    b.destroy_gpu_instance(0, idle.id)
    # The workload bound to it is then blocked when its start comes.
    states = {w.name: w.state for w in b.workloads(at=T0 + 7200)}
    assert states == {"api": "running", "later": "blocked"}
    b.stop_workload("api")
    b.destroy_compute_instance(0, busy.id, busy.compute_instances[0].id)
    b.destroy_gpu_instance(0, busy.id)


def test_mig_sample_semantics() -> None:
    b = node(mig={"enabled": True, "layout": ["3g.20gb", "2g.10gb"]}, workloads=MIG_WORK)
    gpu = b.sample().gpus[0]
    assert gpu.sample is not None
    assert gpu.sample.utilization_gpu_percent == NotAvailable("NOT_SUPPORTED")
    assert gpu.sample.utilization_memory_percent == NotAvailable("NOT_SUPPORTED")
    assert isinstance(gpu.sample.power_watts, float)
    (proc,) = gpu.processes
    gis = {gi.profile_name: gi for gi in gpu.mig.gpu_instances}  # type: ignore[union-attr]
    assert (proc.gpu_instance_id, proc.compute_instance_id) == (gis["3g.20gb"].id, 0)
    assert proc.used_memory_bytes == 8 * 1024**3
    per_gi = {s.gpu_instance_id: s for s in gpu.mig_samples}
    assert per_gi[gis["3g.20gb"].id].memory_used_bytes == 8 * 1024**3
    assert per_gi[gis["3g.20gb"].id].memory_total_bytes == 19968 * 1024**2
    assert per_gi[gis["2g.10gb"].id].memory_used_bytes == 0
    assert gpu.sample.memory_used_bytes == 8 * 1024**3


def test_whole_gpu_workload_is_blocked_on_a_mig_gpu() -> None:
    b = node("H100-80GB", workloads=[{"name": "job", "kind": "steady", "gpu": 0, "start": "+1h"}])
    b.set_mig_mode(0, True)
    assert b.workloads(at=T0 + 7200)[0].state == "blocked"
    b.set_mig_mode(0, False)
    assert b.workloads(at=T0 + 7200)[0].state == "running"


# ---- any sequence of calls keeps a valid layout --------------------------------------------


class MigCalls(RuleBasedStateMachine):
    """Random MIG calls; the layout must stay valid and the driver's default placement must be
    the placement solver's `driver_start`."""

    @initialize(model=st.sampled_from(["A100-SXM4-40GB", "A100-80GB", "H100-80GB", "H200-141GB", "A30-24GB"]))
    def start(self, model: str) -> None:
        self.model = MODELS[model]
        self.backend = node(model, mig=True)
        self.profile_ids = [p.id for p in self.model.profiles]

    def _placements(self) -> List[Placement]:
        mig = self.backend.inventory().gpus[0].mig
        assert mig is not None
        return [Placement(gi.profile_name, gi.profile_id, gi.start, gi.size) for gi in mig.gpu_instances]

    @rule(data=st.data())
    def create_gi(self, data: st.DataObject) -> None:
        pid = data.draw(st.sampled_from([*self.profile_ids, 99]))
        start = data.draw(st.one_of(st.none(), st.integers(0, 8)))
        before = self._placements()
        profile = self.model.find_profile(pid)
        try:
            gi = self.backend.create_gpu_instance(0, pid, start)
        except BackendError as exc:
            if profile is None or (start is not None and start not in profile.placements):
                assert exc.code == "INVALID_ARGUMENT"
            else:
                assert exc.code == "INSUFFICIENT_RESOURCES"
                if start is None:
                    assert driver_start(self.model, before, pid) is None
                else:
                    new = Placement(profile.name, pid, start, profile.memory_slices)
                    assert not check_layout(self.model, [*before, new]).ok
            assert self._placements() == before
            return
        assert profile is not None
        if start is None:
            assert gi.start == driver_start(self.model, before, pid)
        else:
            assert gi.start == start

    @rule(data=st.data())
    def create_ci(self, data: st.DataObject) -> None:
        mig = self.backend.inventory().gpus[0].mig
        assert mig is not None
        if not mig.gpu_instances:
            return
        gi = data.draw(st.sampled_from(mig.gpu_instances))
        cp = data.draw(st.integers(0, 4))
        start = data.draw(st.one_of(st.none(), st.integers(0, 6)))
        try:
            self.backend.create_compute_instance(0, gi.id, cp, start)
        except BackendError as exc:
            assert exc.code in ("INVALID_ARGUMENT", "INSUFFICIENT_RESOURCES")

    @rule(data=st.data())
    def destroy_ci(self, data: st.DataObject) -> None:
        mig = self.backend.inventory().gpus[0].mig
        assert mig is not None
        cis = [(gi.id, ci.id) for gi in mig.gpu_instances for ci in gi.compute_instances]
        if cis:
            gi_id, ci_id = data.draw(st.sampled_from(cis))
            self.backend.destroy_compute_instance(0, gi_id, ci_id)

    @rule(data=st.data())
    def destroy_gi(self, data: st.DataObject) -> None:
        mig = self.backend.inventory().gpus[0].mig
        assert mig is not None
        if not mig.gpu_instances:
            return
        gi = data.draw(st.sampled_from(mig.gpu_instances))
        try:
            self.backend.destroy_gpu_instance(0, gi.id)
        except BackendError as exc:
            assert exc.code == "IN_USE" and gi.compute_instances

    @rule()
    def state_round_trip(self) -> None:
        state = self.backend.export_state()
        other = node(self.model.key, mig=True)
        other.import_state(state)
        assert other.inventory() == self.backend.inventory()

    @invariant()
    def layout_is_valid(self) -> None:
        if not hasattr(self, "backend"):
            return
        placements = self._placements()
        result = check_layout(self.model, placements)
        assert result.ok, result.reason
        mig = self.backend.inventory().gpus[0].mig
        assert mig is not None
        assert len({gi.id for gi in mig.gpu_instances}) == len(mig.gpu_instances)
        for gi in mig.gpu_instances:
            profile = self.model.profile(gi.profile_id)
            used: List[int] = []
            counts: Dict[int, int] = {}
            for ci in gi.compute_instances:
                cp = profile.compute_profile(ci.profile_id)
                assert ci.start in cp.placements
                used.extend(range(ci.start, ci.start + ci.size))
                counts[ci.profile_id] = counts.get(ci.profile_id, 0) + 1
                assert counts[ci.profile_id] <= cp.max_count
            assert len(used) == len(set(used)) and all(0 <= s < profile.compute_slices for s in used)
            uuids = [ci.uuid for ci in gi.compute_instances]
            assert len(set(uuids)) == len(uuids)


TestMigCalls = MigCalls.TestCase
TestMigCalls.settings = settings(
    max_examples=examples(60),
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_mig_instance_utilization_as_gpm_gives_it() -> None:
    """Hopper's NVML gives each GPU instance's SM utilization (GPM); Ampere's says NOT_SUPPORTED."""
    hopper = node("H100-80GB", mig={"enabled": True, "layout": ["3g.40gb", "2g.20gb"]}, workloads=MIG_WORK)
    gpu = hopper.sample().gpus[0]
    gis = {gi.profile_name: gi.id for gi in gpu.mig.gpu_instances}  # type: ignore[union-attr]
    util = {s.gpu_instance_id: s.sm_utilization_percent for s in gpu.mig_samples}
    busy = util[gis["3g.40gb"]]
    assert isinstance(busy, float) and 40.0 <= busy <= 80.0  # the steady 60% job, with its noise
    assert util[gis["2g.20gb"]] == 0.0  # nothing runs there yet
    ampere = node(mig={"enabled": True, "layout": ["3g.20gb", "2g.10gb"]}, workloads=MIG_WORK)
    samples = ampere.sample().gpus[0].mig_samples
    assert {s.sm_utilization_percent for s in samples} == {NotAvailable("NOT_SUPPORTED")}
