"""The simulated past computed without samples (node/sim_past.py, issue 22) against the past
built from every sample through `gpu_shares` and `Rollup.add` (the way it was built before):
the same buckets, byte for byte once encoded, on every node shape of the sim fleets, MIG slices
with and without GPM utilization included; and the workload models' `series` against their
`activity`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from gpuops.core.history import bucket_to_json
from gpuops.node.history.files import dumps
from gpuops.node.history.reader import read_history
from gpuops.node.history.recorder import Recorder
from gpuops.node.history.rollup import Packed
from gpuops.node.sim import workloads as wl
from gpuops.simfleet.history import past_buckets, past_packed
from gpuops.simfleet.scenarios import build_fleet

EPOCH = 1_772_409_600.0  # 2026-03-02 00:00 UTC, a Monday
END = EPOCH + 37.25  # the fleet's first live sample: not on a step
DAY = 86400.0


def _nodes() -> list[tuple[str, dict[str, Any]]]:
    """One node per (scenario, profile, GPU model): every shape the sim fleets make."""
    seen = set()
    out = []
    for scenario, count in (("silos", 8), ("mixed", 6), ("large", 60)):
        for node in build_fleet(scenario, count, seed=3, epoch=EPOCH, utc_offset="+02:00").nodes:
            models = tuple(sorted({str(g.get("model")) for g in node.spec["gpus"] if isinstance(g, dict)}))
            shape = (node.profile, models, len(node.spec["workloads"]))
            if shape not in seen:
                seen.add(shape)
                out.append((f"{scenario}:{node.name}", node.spec))
    # A MIG platform node on A100s (no GPM utilization), which the seeds above do not draw.
    h100 = next(spec for name, spec in out if name.startswith("large:") and "MIG" in spec["description"])
    a100 = {**h100, "hostname": "a100-mig", "gpus": [{**g, "model": "A100-80GB"} for g in h100["gpus"]]}
    out.append(("custom:a100-mig", a100))
    return out


NODES = _nodes()


def _odd_node() -> dict[str, Any]:
    """What the fleets never make: figures NVML does not give, a GPU lost on the way, a notebook
    and a steady job with jitter sharing a card, work that starts and stops in the window."""
    return {
        "version": 1,
        "hostname": "odd",
        "seed": 11,
        "epoch": EPOCH,
        "utc_offset": "-05:00",
        "gpus": [
            {"model": "L40S", "count": 2, "unsupported": ["utilization_gpu", "process_memory"]},
            {"model": "A100-SXM4-40GB", "lost_at": "-20h"},
            {"model": "H100-80GB", "count": 2},
        ],
        "workloads": [
            {"name": "a", "kind": "training", "user": "u1", "gpus": [0, 1], "start": "-30h"},
            {"name": "b", "kind": "inference", "user": "u2", "gpu": 2, "start": "-2d"},
            {"name": "c", "kind": "notebook", "user": "u1", "gpu": 3, "start": "-3d",
             "params": {"working_hours_only": 0, "burst_probability": 0.5}},
            {"name": "d", "kind": "steady", "user": "u3", "gpu": 3, "start": "-26h", "stop": "-2h",
             "params": {"jitter": 20}},
            {"name": "e", "kind": "training", "user": "u3", "gpu": 4, "start": "-50h", "stop": "-1h",
             "params": {"checkpoint_every": "20m", "checkpoint_seconds": "10m"}},
        ],
    }  # fmt: skip


def _args(days: float) -> tuple[float, float, float, float, float]:
    return (END, days, 300.0, 900.0, END - 120 * 60.0)


@pytest.mark.parametrize(("name", "spec"), NODES, ids=[n for n, _s in NODES])
def test_the_computed_past_is_the_sampled_one(name: str, spec: dict[str, Any]) -> None:
    args = _args(2.5)
    sampled = past_buckets(spec, *args, sampled=True)
    assert sampled, name
    assert past_buckets(spec, *args) == sampled
    packed = past_packed(spec, *args)
    assert [(p.start, p.span) for p in packed] == [(b.start, b.span) for b in sampled]
    assert [p.json() for p in packed] == [dumps(bucket_to_json(b)) for b in sampled]


def test_the_fleets_shapes_are_all_there() -> None:
    profiles = {spec["description"].split(": ")[-1] for _name, spec in NODES}
    assert len(NODES) >= 12, profiles
    migs = [spec for _n, spec in NODES if any(isinstance(g, dict) and g.get("mig") for g in spec["gpus"])]
    models = {g["model"] for spec in migs for g in spec["gpus"]}
    assert {"A100-80GB", "H100-80GB"} <= models  # slices without GPM utilization, and with


def test_odd_nodes_are_the_sampled_ones_too() -> None:
    args = _args(3.0)
    sampled = past_buckets(_odd_node(), *args, sampled=True)
    assert past_buckets(_odd_node(), *args) == sampled
    assert [p.json() for p in past_packed(_odd_node(), *args)] == [dumps(bucket_to_json(b)) for b in sampled]


def test_mig_slices_with_gpm_count_held_time_by_their_utilization() -> None:
    # 95fda25: a slice's GPU-time is held time x its SM utilization where GPM gives it (H100),
    # all of it while held where it does not (A100).
    spec = next(s for n, s in NODES if n.startswith("silos:") and "MIG" in s["description"])
    hours = [b for b in past_buckets(spec, *_args(1.0)) if b.span == 3600.0]
    users = [u for b in hours for g in b.gpus if g.mig for u in g.users if u.held > 0]
    assert users
    assert all(u.busy < u.held for u in users)
    a100 = dict(NODES)["custom:a100-mig"]
    held = [u for b in past_buckets(a100, *_args(1.0)) for g in b.gpus for u in g.users if u.held > 0]
    assert held and all(u.busy == u.held for u in held)


def test_a_recorder_merges_packed_buckets_as_it_merges_buckets(tmp_path: Path) -> None:
    spec = NODES[0][1]
    args = _args(3.0)
    texts = []
    for kind, buckets in (("objects", past_buckets(spec, *args)), ("packed", past_packed(spec, *args))):
        directory = tmp_path / kind
        recorder = Recorder(str(directory), interval=10.0, clock=lambda: END + 30.0, durable=False)
        recorder.merge(buckets)
        recorder.close()
        files = sorted(p.name for p in directory.iterdir() if p.name.endswith(".json"))
        assert len(files) >= 4, files
        history = read_history(str(directory), "hour", END - 3 * DAY, END + 60.0, now=END + 30.0)
        texts.append((files, [bucket_to_json(b) for b in history.buckets]))
    assert texts[0] == texts[1]
    assert all(isinstance(p, Packed) for p in past_packed(spec, *args))


def _times(start: float, count: int, step: float) -> list[float]:
    return [start + step * i + 0.37 * (i % 7) for i in range(count)]


@pytest.mark.parametrize(
    ("kind", "params"),
    [
        ("idle", {}),
        ("inference", {}),
        ("inference", {"peak_util": 100.0, "night_util": 30.0, "peak_hour": 1.5, "weekend_factor": 1.0}),
        ("training", {}),
        ("training", {"util": 80.0, "checkpoint_every": 600.0, "checkpoint_seconds": 200.0}),
        ("notebook", {}),
        ("notebook", {"working_hours_only": 0.0, "burst_probability": 0.9, "bucket": 60.0}),
        ("steady", {}),
        ("steady", {"util": 99.0, "jitter": 5.0}),
    ],
)
def test_a_models_series_is_its_activity_at_each_time(kind: str, params: dict[str, float]) -> None:
    model = wl.MODELS[kind]
    values = {**model.defaults(), **params}
    busy = False
    for step in (1.0, 7.0, 300.0, 900.0):
        times = _times(EPOCH - 3 * DAY, 700, step)
        running = [t - (EPOCH - 3 * DAY) - 50.0 for t in times]  # warming up at first
        key = ("job", 3)
        series = model.series(5, key, times, running, 3600.0, values)
        memo: wl.NoiseMemo = {}
        expected = []
        for t, r in zip(times, running, strict=True):
            a = model.activity(wl.Moment(5, key, t, r, 3600.0, memo), values)
            expected.append((a.utilization_percent, a.memory_fraction))
        assert series == expected, (kind, step)
        busy = busy or any(u > 0 for u, _m in series)
    assert busy or kind == "idle"


def test_the_noise_of_a_bucket_is_the_hash_of_its_whole_key() -> None:
    for seed, key, bucket in ((0, (), 0), (7, ("w", 3, "wave"), 28_345_123), (2**31, ("x\x1fy", 1.5), -4)):
        assert wl._noise_at(seed, key, bucket) == wl.noise(seed, *key, bucket)
        expected = (
            wl.noise(seed, *key, bucket)
            + (wl.noise(seed, *key, bucket + 1) - wl.noise(seed, *key, bucket)) * 0.5**2 * 2.0
        )
        assert wl.smooth_noise(seed, key, (bucket + 0.5) * 10.0, 10.0) == pytest.approx(
            expected, rel=0, abs=1e-15
        )
        assert math.isfinite(wl.smooth_noise(seed, key, bucket * 10.0, 10.0, {}))
