"""Which history buckets' figures can be true (gpuops/core/history.py `bucket_fault`, `screened`):
none the recorder makes is refused, every figure pushed past what a GPU can do is, the decoder's
fast path finds what the check on objects finds, and nothing whatever the figures makes it
raise (hypothesis)."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.core.history import (
    HOUR,
    MAX_GPU_MEMORY,
    MAX_PROCESSES,
    MINUTE,
    SLACK,
    Bucket,
    GpuUsage,
    History,
    Unreadable,
    UserUsage,
    bucket_fault,
    bucket_from_json,
    bucket_to_json,
    screened,
)
from gpuops.simfleet.history import past_buckets
from tests.hypothesis_budget import examples
from tests.node.test_sim_past import NODES, _args, _odd_node

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC
GiB = 1 << 30


def _recorded() -> list[Bucket]:
    """A day of hours and two hours of minutes, as a recorder makes them, of every node shape of
    the simulated fleets (MIG with and without GPM, notebooks, lost GPUs, missing figures)."""
    out: list[Bucket] = []
    for _name, spec in [*NODES, ("odd", _odd_node())]:
        out += past_buckets(spec, *_args(1.0))
    return out


RECORDED = _recorded()


def test_no_bucket_a_recorder_makes_is_refused() -> None:
    assert len(RECORDED) > 500
    faults = [(b.start, b.span, bucket_fault(b)) for b in RECORDED if bucket_fault(b) is not None]
    assert faults == []
    # ... decoded from their JSON as a node and an operator decode them, either way
    for b in RECORDED[:200]:
        data = json.loads(json.dumps(bucket_to_json(b)))
        assert bucket_fault(bucket_from_json(data)) is None
        assert bucket_fault(bucket_from_json(json.loads(json.dumps(data)), keep_json=True)) is None


def _busy_users() -> list[tuple[int, int, int]]:
    """(bucket, GPU, key) positions of recorded keys with time in them."""
    return [
        (i, j, k)
        for i, b in enumerate(RECORDED)
        for j, g in enumerate(b.gpus)
        for k, u in enumerate(g.users)
        if u.seconds > 0 and u.held > 0 and u.memory_max > 0
    ]


BUSY = _busy_users()


def _limit(data: dict[str, Any], j: int, k: int, field: str) -> Any:
    """A value of `field` that no GPU can have, given the rest of the bucket."""
    g = data["gpus"][j]
    u = g["users"][k]
    cap = g["memory_total"] or MAX_GPU_MEMORY
    over = 1.0 + 3 * SLACK
    return {
        "gpu.seconds": data["span"] * over + 10,
        "gpu.busy": g["seconds"] * over + 10,
        "gpu.memory": (g["memory_max"] * g["seconds"] + 1e6) * over + 1e9,
        "gpu.memory_max": cap + 1,
        "gpu.memory_total": MAX_GPU_MEMORY + 1,
        "user.seconds": g["seconds"] * over + 10,
        "user.held": u["seconds"] * over + 10,
        "user.busy": u["held"] * over + 10,
        "user.memory": (u["memory_max"] * u["seconds"] + 1e6) * over + 1e9,
        "user.memory_max": cap + 1,
        "user.process_max": u["memory_max"] + 1,
        "user.processes": MAX_PROCESSES + 1,
        "user.forged_busy": 1e15,
        "user.forged_memory": 1e30,
    }[field]


FIELDS = (
    "gpu.seconds",
    "gpu.busy",
    "gpu.memory",
    "gpu.memory_max",
    "gpu.memory_total",
    "user.seconds",
    "user.held",
    "user.busy",
    "user.memory",
    "user.memory_max",
    "user.process_max",
    "user.processes",
    "user.forged_busy",
    "user.forged_memory",
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(where=st.sampled_from(BUSY), field=st.sampled_from(FIELDS), keep=st.booleans())
def test_a_figure_past_what_a_gpu_can_do_is_refused(
    where: tuple[int, int, int], field: str, keep: bool
) -> None:
    i, j, k = where
    data = json.loads(json.dumps(bucket_to_json(RECORDED[i])))
    value = _limit(data, j, k, field)
    owner, name = field.split(".")
    name = {"forged_busy": "busy", "forged_memory": "memory"}.get(name, name)
    target = data["gpus"][j] if owner == "gpu" else data["gpus"][j]["users"][k]
    target[name] = float(value) if isinstance(target[name], float) else int(value)
    fault = bucket_fault(bucket_from_json(data, keep_json=keep))
    assert fault is not None, (field, target)
    assert fault.startswith(f"GPU {data['gpus'][j]['index']}"), fault


_figure = st.one_of(
    st.floats(min_value=0.0, max_value=1e300, allow_nan=False, allow_infinity=False),
    st.sampled_from([0.0, 1.0, 59.999, 60.0, 3600.0, 3600.0001, 1e15, 1e30, 2.0**63]),
)
_count = st.one_of(
    st.integers(min_value=0, max_value=2**63 - 1), st.sampled_from([0, 1, 64, 2**22, 2**22 + 1])
)


_share = st.floats(min_value=0.0, max_value=1.03, allow_nan=False)  # around the bounds, both sides


@st.composite
def _near(draw: st.DrawFn) -> dict[str, Any]:
    """A bucket whose figures are near what can be true: each a share, up to 3% over, of its
    bound (time sampled of the span, busy of that, memory of the GPU's...)."""
    span = draw(st.sampled_from([MINUTE, HOUR]))
    gpus = []
    for index in range(draw(st.integers(0, 3))):
        total = draw(st.sampled_from([0, 80 * GiB, 192 * GiB]))
        cap = total or MAX_GPU_MEMORY
        seconds = span * draw(_share)
        mmax = int(cap * min(1.0, draw(_share)))
        users = []
        for n in range(draw(st.integers(0, 3))):
            u_seconds = seconds * draw(_share)
            held = u_seconds * draw(_share) / 3
            u_mmax = int(cap * draw(_share))
            users.append(
                {
                    "user": f"u{n}",
                    "groups": [],
                    "tenant": None,
                    "tenant_source": "",
                    "gpu_instance_id": None,
                    "seconds": u_seconds,
                    "held": held,
                    "busy": held * draw(_share),
                    "memory": u_mmax * u_seconds * draw(_share),
                    "memory_max": u_mmax,
                    "process_max": int(u_mmax * draw(_share)),
                    "processes": draw(st.integers(0, 8)),
                }
            )
        gpus.append(
            {
                "index": index,
                "uuid": f"GPU-{index}",
                "name": "NVIDIA A100",
                "memory_total": total,
                "owner": None,
                "mig": False,
                "seconds": seconds,
                "busy": seconds * draw(_share),
                "memory": mmax * seconds * draw(_share),
                "memory_max": mmax,
                "users": users,
            }
        )
    return {"start": T0, "span": span, "gpus": gpus}


@st.composite
def _buckets(draw: st.DrawFn) -> dict[str, Any]:
    span = draw(st.sampled_from([MINUTE, HOUR]))
    gpus = []
    for index in range(draw(st.integers(0, 3))):
        users = []
        for n in range(draw(st.integers(0, 3))):
            users.append(
                {
                    "user": f"u{n}",
                    "groups": [],
                    "tenant": None,
                    "tenant_source": "",
                    "gpu_instance_id": None,
                    "seconds": draw(_figure),
                    "held": draw(_figure),
                    "busy": draw(_figure),
                    "memory": draw(_figure),
                    "memory_max": draw(_count),
                    "process_max": draw(_count),
                    "processes": draw(_count),
                }
            )
        gpus.append(
            {
                "index": index,
                "uuid": f"GPU-{index}",
                "name": "NVIDIA A100",
                "memory_total": draw(st.sampled_from([0, 80 * GiB, MAX_GPU_MEMORY, 2**62])),
                "owner": None,
                "mig": draw(st.booleans()),
                "seconds": draw(_figure),
                "busy": draw(_figure),
                "memory": draw(_figure),
                "memory_max": draw(_count),
                "users": users,
            }
        )
    return {"start": T0, "span": span, "gpus": gpus}


def _room(limit: float) -> float:
    return limit * (1 + SLACK) + 1.0


@settings(max_examples=examples(500), deadline=None)
@given(data=st.one_of(_buckets(), _near()))
def test_any_figures_are_judged_the_same_either_way_and_what_passes_can_be_true(data: dict[str, Any]) -> None:
    fast = bucket_from_json(data)  # figures as floats: the decoder's fast path, fault found there
    kept = bucket_from_json(json.loads(json.dumps(data)), keep_json=True)
    built = Bucket(fast.start, fast.span, fast.gpus)  # the same bucket made in code: checked as objects
    fault = bucket_fault(built)
    assert bucket_fault(fast) == fault and bucket_fault(kept) == fault
    assert fault is None or isinstance(fault, str)
    if fault is not None:
        return
    for g in built.gpus:  # what is taken stays within the bucket's length and the GPU
        cap = g.memory_total or MAX_GPU_MEMORY
        assert g.seconds <= _room(built.span) and g.busy <= _room(g.seconds)
        assert sum(u.held for u in g.users) <= _room(g.seconds)
        assert g.memory_max <= cap <= MAX_GPU_MEMORY
        for u in g.users:
            assert u.busy <= _room(u.held) and u.held <= _room(u.seconds) <= _room(_room(g.seconds))
            assert u.process_max <= u.memory_max <= cap and u.processes <= MAX_PROCESSES
            assert u.memory <= _room(u.memory_max * u.seconds)


@pytest.mark.parametrize(
    "value",
    [float("nan"), float("inf"), -1.0, True, "3600"],
)
def test_a_bucket_built_in_code_with_any_value_is_judged_not_raised(value: Any) -> None:
    user = UserUsage("alice", (), None, "", None, 3600.0, value, 10.0, 0.0, 0, 0, 1)
    gpu = GpuUsage(0, "GPU-0", "A100", 80 * GiB, None, False, 3600.0, value, 0.0, 0, (user,))
    fault = bucket_fault(Bucket(T0, HOUR, (gpu,)))
    assert fault is not None and fault.startswith("GPU 0") and "negative or not a number" in fault


def test_screened_makes_an_older_agents_forged_hour_unreadable() -> None:
    """An agent that does not check its files itself sends the bucket: the operator flags it."""
    good = RECORDED[0]
    assert good.span == HOUR
    data = json.loads(json.dumps(bucket_to_json(good)))
    data["start"] = good.start + HOUR
    data["gpus"][0]["busy"] = 1e15
    forged = bucket_from_json(data)
    earlier = Unreadable(good.start - 86400, good.start - 3600, "hours-x.json: not JSON")
    since, until = good.start - 86400, good.start + 2 * HOUR
    history = History("hour", since, until, True, None, (good, forged), (earlier,))
    out = screened(history)
    assert out.buckets == (good,)
    assert out.unreadable[0] == earlier
    hole = out.unreadable[1]
    assert (hole.since, hole.until) == (forged.start, forged.start + HOUR)
    assert "figures that cannot be true: GPU 0: busy 1e+15s" in hole.reason
    assert hole.reason.startswith("the hour of ") and "UTC" in hole.reason
    assert screened(out) is out  # nothing more to take out: the same history
    assert math.isfinite(sum(g.busy for b in out.buckets for g in b.gpus))
