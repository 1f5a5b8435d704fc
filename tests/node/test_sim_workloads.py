"""Workload models look like real fleets, and figures are a pure function of (seed, time)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from gpuops.core.codec import to_json
from gpuops.core.model import Gpu, GpuSample
from gpuops.node.backends.sim import SimBackend
from gpuops.node.sim import workloads as wl

WEDNESDAY = 1_717_545_600.0  # 2024-06-05 00:00 UTC
SATURDAY = 1_717_200_000.0  # 2024-06-01 00:00 UTC
HOUR = 3600.0
GIB = 1024**3


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def backend(
    workloads: List[Dict[str, Any]],
    model: str = "A100-SXM4-80GB",
    count: int = 1,
    seed: Optional[int] = None,
    **top: Any,
) -> tuple[SimBackend, Clock]:
    clock = Clock(WEDNESDAY)
    spec: Dict[str, Any] = {
        "hostname": "wl-test",
        "seed": 11,
        "epoch": WEDNESDAY - 30 * 86400,
        "gpus": [{"model": model, "count": count}],
        "workloads": workloads,
    }
    spec.update(top)
    return SimBackend(spec=spec, clock=clock, seed=seed), clock


def gpu_at(b: SimBackend, clock: Clock, t: float, index: int = 0) -> Gpu:
    clock.t = t
    return b.sample().gpus[index]


def sample_at(b: SimBackend, clock: Clock, t: float, index: int = 0) -> GpuSample:
    s = gpu_at(b, clock, t, index).sample
    assert s is not None
    return s


def util(b: SimBackend, clock: Clock, t: float, index: int = 0) -> float:
    value = sample_at(b, clock, t, index).utilization_gpu_percent
    assert isinstance(value, float)
    return value


# ---- determinism ---------------------------------------------------------------------------


def test_same_seed_same_times_same_samples() -> None:
    a = SimBackend(clock=Clock(WEDNESDAY + 14 * HOUR))
    b = SimBackend(clock=Clock(WEDNESDAY + 14 * HOUR))
    assert a.seed == b.seed
    times = [WEDNESDAY + 14 * HOUR + k * 17.3 for k in range(30)]
    ca, cb = Clock(0), Clock(0)
    a._clock, b._clock = ca, cb  # same times, one asked forwards and one backwards
    forwards = []
    for t in times:
        ca.t = t
        forwards.append(to_json(a.sample()))
    backwards = []
    for t in reversed(times):
        cb.t = t
        backwards.append(to_json(b.sample()))
    assert forwards == list(reversed(backwards))
    assert a.inventory() == b.inventory()


def test_a_different_seed_gives_different_figures() -> None:
    work = [{"kind": "inference", "gpu": 0}]
    a, ca = backend(work, seed=1)
    b, cb = backend(work, seed=2)
    t = WEDNESDAY + 11 * HOUR
    assert util(a, ca, t) != util(b, cb, t)
    assert a.inventory().gpus[0].info.uuid != b.inventory().gpus[0].info.uuid


def test_noise_is_a_hash_not_a_global_rng() -> None:
    import random

    random.seed(1)
    x = wl.noise(5, "gpu", 0, 123)
    random.seed(2)
    assert wl.noise(5, "gpu", 0, 123) == x
    assert 0 <= x < 1
    assert wl.noise(5, "gpu", 0, 124) != x


def test_pids_are_stable_and_distinct() -> None:
    b, clock = backend(
        [{"name": "a", "kind": "training", "gpus": [0, 1]}, {"name": "b", "kind": "idle", "gpu": 1}], count=2
    )
    first = gpu_at(b, clock, WEDNESDAY).processes
    later = gpu_at(b, clock, WEDNESDAY + 5 * HOUR).processes
    assert [p.pid for p in first] == [p.pid for p in later]
    pids = [p.pid for g in b.sample().gpus for p in g.processes]
    assert len(pids) == len(set(pids)) == 3


# ---- workload shapes -----------------------------------------------------------------------


def test_online_inference_follows_the_working_day() -> None:
    b, clock = backend([{"kind": "inference", "gpu": 0, "memory": "40GiB"}])
    afternoon = [util(b, clock, WEDNESDAY + 14 * HOUR + k * 60) for k in range(10)]
    night = [util(b, clock, WEDNESDAY + 3 * HOUR + k * 60) for k in range(10)]
    assert min(afternoon) > 60 and max(night) < 15
    assert sum(afternoon) / 10 > 5 * sum(night) / 10
    weekend = [util(b, clock, SATURDAY + 14 * HOUR + k * 60) for k in range(10)]
    assert sum(weekend) < sum(afternoon)
    # Memory roughly steady whatever the load.
    mems = [sample_at(b, clock, t).memory_used_bytes for t in (WEDNESDAY + 3 * HOUR, WEDNESDAY + 14 * HOUR)]
    assert all(isinstance(m, int) for m in mems)
    assert abs(mems[0] - mems[1]) < 0.06 * 40 * GIB  # type: ignore[operator]


def test_inference_peak_follows_the_site_time_zone() -> None:
    b, clock = backend([{"kind": "inference", "gpu": 0}], utc_offset="+08:00")
    # 14:00 in UTC+8 is 06:00 UTC.
    assert util(b, clock, WEDNESDAY + 6 * HOUR) > util(b, clock, WEDNESDAY + 14 * HOUR)


def test_training_saturates_with_high_steady_memory() -> None:
    b, clock = backend([{"kind": "training", "gpu": 0}])
    samples = [sample_at(b, clock, WEDNESDAY + k * 97.0) for k in range(60)]
    utils = [s.utilization_gpu_percent for s in samples]
    assert all(isinstance(u, float) and 90.0 <= u <= 100.0 for u in utils)
    mems = {s.memory_used_bytes for s in samples}
    assert len(mems) == 1
    (mem,) = mems
    assert isinstance(mem, int) and mem > 0.8 * 80 * GIB
    assert all(isinstance(s.power_watts, float) and s.power_watts > 330 for s in samples)


def test_training_checkpoints_dip() -> None:
    b, clock = backend([{"kind": "training", "gpu": 0, "start": 0, "params": {"checkpoint_every": "1h"}}])
    epoch = WEDNESDAY - 30 * 86400
    assert util(b, clock, epoch + 5 * HOUR + 10) < 40  # in a checkpoint
    assert util(b, clock, epoch + 5 * HOUR + 600) >= 90


def test_training_warms_up_after_start() -> None:
    b, clock = backend([{"kind": "training", "gpu": 0, "start": "+30d"}])  # starts at WEDNESDAY
    assert gpu_at(b, clock, WEDNESDAY - 1).processes == ()
    early = sample_at(b, clock, WEDNESDAY + 5)
    late = sample_at(b, clock, WEDNESDAY + 300)
    assert early.memory_used_bytes < late.memory_used_bytes  # type: ignore[operator]


def test_idle_silo_card_and_stale_notebook() -> None:
    b, clock = backend([{"kind": "idle", "gpu": 1, "memory": "9GiB"}], count=3)
    for k in range(20):
        t = WEDNESDAY + k * 1234.5
        silo = gpu_at(b, clock, t, 0)
        stale = gpu_at(b, clock, t, 1)
        assert silo.processes == () and silo.sample is not None
        assert silo.sample.utilization_gpu_percent == 0.0 and silo.sample.memory_used_bytes == 0
        assert stale.sample is not None and stale.sample.utilization_gpu_percent == 0.0
        assert stale.sample.memory_used_bytes == 9 * GIB
        (proc,) = stale.processes
        assert proc.used_memory_bytes == 9 * GIB
        # Idle: power near the idle figure, SM clock down.
        assert isinstance(silo.sample.power_watts, float) and silo.sample.power_watts < 80
        assert silo.sample.sm_clock_mhz == 210


def test_notebooks_are_mostly_idle_with_bursts() -> None:
    b, clock = backend([{"kind": "notebook", "gpu": 0, "memory": "10GiB"}])
    utils = [util(b, clock, WEDNESDAY + k * 60.0) for k in range(24 * 60)]
    idle = sum(1 for u in utils if u == 0.0)
    assert idle > 0.75 * len(utils)
    assert max(utils) > 30
    night = utils[: 7 * 60]
    assert max(night) == 0.0  # nobody runs cells at night
    mems = {sample_at(b, clock, WEDNESDAY + k * 600.0).memory_used_bytes for k in range(20)}
    assert mems == {10 * GIB}  # memory held throughout


def test_steady_and_time_sliced_sharing() -> None:
    b, clock = backend(
        [
            {"name": "a", "kind": "steady", "gpu": 0, "params": {"util": 30}},
            {"name": "b", "kind": "steady", "gpu": 0, "params": {"util": 45}},
        ]
    )
    assert util(b, clock, WEDNESDAY) == 75.0
    c, cclock = backend(
        [
            {"name": "a", "kind": "steady", "gpu": 0, "params": {"util": 80}},
            {"name": "b", "kind": "steady", "gpu": 0, "params": {"util": 80}},
        ]
    )
    assert util(c, cclock, WEDNESDAY) == 100.0


def test_memory_never_exceeds_the_gpu() -> None:
    b, clock = backend(
        [
            {"name": "a", "kind": "idle", "gpu": 0, "memory": "70GiB", "start": "-2d"},
            {"name": "b", "kind": "idle", "gpu": 0, "memory": "70GiB", "start": "-1d"},
        ]
    )
    g = gpu_at(b, clock, WEDNESDAY)
    assert g.sample is not None
    # all of it but what the driver reserves (the documented 480 MiB: the A100 has no figure of
    # its own), which the node reports it observed
    assert g.sample.memory_used_bytes == g.sample.memory_total_bytes - 480 * (1 << 20)  # type: ignore[operator]
    assert g.info.driver_memory is not None and g.info.driver_memory.reserved_bytes == 480 * (1 << 20)
    first, _second = sorted(g.processes, key=lambda p: p.used_memory_bytes, reverse=True)  # type: ignore[arg-type, return-value]
    assert first.used_memory_bytes == 70 * GIB  # the earlier process got its memory


def test_a_process_holds_its_cuda_context_at_least() -> None:
    """A process on a GPU holds the device memory of its CUDA context even before it allocates
    anything, as NVML counts it on a real GPU (518 MiB on an H100, docs/gpu-runs/2026-11-26b)."""
    b, clock = backend([{"name": "a", "kind": "steady", "gpu": 0, "memory": "100MiB"}])
    g = gpu_at(b, clock, WEDNESDAY)
    (p,) = g.processes
    assert p.used_memory_bytes == 518 * (1 << 20)
    assert g.info.driver_memory is not None and g.info.driver_memory.context_bytes == 518 * (1 << 20)


# ---- power, temperature, clocks ------------------------------------------------------------


def test_power_temperature_and_clocks_are_plausible() -> None:
    start = WEDNESDAY + 12 * HOUR
    b, clock = backend([{"kind": "steady", "gpu": 0, "start": "+30d12h", "params": {"util": 100}}])
    before = sample_at(b, clock, start - 1)
    just_after = sample_at(b, clock, start + 5)
    settled = sample_at(b, clock, start + 20 * 60)
    for s in (before, just_after, settled):
        assert isinstance(s.power_watts, float) and 50 <= s.power_watts <= 400
    assert before.power_watts < 80 and settled.power_watts > 350  # type: ignore[operator]
    # Temperature lags the load: barely moved after 5 s, much hotter after 20 minutes.
    assert just_after.temperature_celsius < settled.temperature_celsius - 15  # type: ignore[operator]
    assert 25 <= before.temperature_celsius <= 40  # type: ignore[operator]
    assert 60 <= settled.temperature_celsius <= 85  # type: ignore[operator]
    # SM clock drops at idle and boosts under load.
    assert before.sm_clock_mhz == 210 and settled.sm_clock_mhz >= 1300  # type: ignore[operator]
    assert settled.memory_clock_mhz == 1593


def test_gddr_memory_clock_drops_at_idle() -> None:
    b, clock = backend([{"kind": "steady", "gpu": 1}], model="L40S", count=2)
    assert sample_at(b, clock, WEDNESDAY, 0).memory_clock_mhz == 405
    assert sample_at(b, clock, WEDNESDAY, 1).memory_clock_mhz == 9001


def test_every_model_kind_is_documented_and_bounded() -> None:
    assert set(wl.MODELS) == {"idle", "inference", "training", "notebook", "steady"}
    for model in wl.MODELS.values():
        assert model.description and model.default_command
        params = model.defaults()
        for k in range(200):
            t = WEDNESDAY + k * 431.0
            act = model.activity(wl.Moment(1, ("x",), t, 1000.0 + k, 0.0), params)
            assert 0.0 <= act.utilization_percent <= 100.0
            assert 0.0 <= act.memory_fraction <= 1.0
            assert 0.0 <= act.memory_utilization_percent <= 100.0
