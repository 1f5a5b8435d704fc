"""The history format (gpuops/core/history.py): JSON both ways, strict decoding, per-sample shares."""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.core.history import (
    HOUR,
    MINUTE,
    Bucket,
    GpuUsage,
    History,
    UserUsage,
    gpu_shares,
    history_from_json,
    history_to_json,
)
from gpuops.core.model import (
    Gpu,
    GpuInfo,
    GpuInstance,
    GpuProcess,
    GpuSample,
    MigInstanceSample,
    MigState,
    NotAvailable,
)
from tests.hypothesis_budget import examples

T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC


def _user(name: str = "alice", gi: int | None = None) -> UserUsage:
    return UserUsage(
        name, ("vision", "users"), "vision", "limiter", gi, 3600.0, 2700.0, 2160.0, 1e14, 32, 16, 2
    )


def _history() -> History:
    gpu = GpuUsage(
        0,
        "GPU-1",
        "NVIDIA A100",
        80 << 30,
        "vision",
        False,
        3600.0,
        2880.0,
        1.5e14,
        40 << 30,
        (_user(), _user("bob")),
    )
    mig = GpuUsage(1, "GPU-2", "NVIDIA H100", 0, None, True, 1800.0, 771.4, 0.0, 0, (_user("carol", 1),))
    return History(
        "hour",
        T0,
        T0 + 2 * HOUR,
        True,
        T0 - 30 * 86400,
        (Bucket(T0, HOUR, (gpu, mig)), Bucket(T0 + HOUR, HOUR, ())),
    )


def test_round_trip_through_json_text() -> None:
    h = _history()
    assert history_from_json(json.loads(json.dumps(history_to_json(h)))) == h
    empty = History("minute", T0, T0, False, None, ())
    assert history_from_json(history_to_json(empty)) == empty


def _mutate(data: Any, path: tuple[Any, ...], value: Any) -> Any:
    data = json.loads(json.dumps(data))
    target = data
    for part in path[:-1]:
        target = target[part]
    if value is _DELETE:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (("resolution",), "day", "History.resolution: expected 'minute' or 'hour'"),
        (("since",), "x", "History.since: expected a number"),
        (("until",), T0 - 1, "History.until: before since"),
        (("recording",), 1, "History.recording: expected true or false"),
        (("oldest",), -5, "History.oldest: expected a finite number >= 0"),
        (("buckets",), {}, "History.buckets: expected a list"),
        (("buckets", 0, "span"), 60.0, "History.buckets[0].span: 60 in a history of hour buckets"),
        (
            ("buckets", 1, "start"),
            T0,
            "History.buckets[1].start: buckets must be ordered by start, each once",
        ),
        (("buckets", 0, "start"), T0 + 1, "History.buckets[0].start: not a multiple of the span"),
        (
            ("buckets", 0, "gpus", 0, "users", 1, "held"),
            float("inf"),
            "History.buckets[0].gpus[0].users[1].held",
        ),
        (("buckets", 0, "gpus", 0, "users", 1, "user"), "alice", "users[1]: the same key twice"),
        (("buckets", 0, "gpus", 1, "index"), 0, "History.buckets[0].gpus[1].index: GPU 0 twice"),
        (("buckets", 0, "gpus", 0, "users", 0, "groups", 1), 7, "users[0].groups[1]: expected a string"),
        (
            ("buckets", 0, "gpus", 0, "users", 0, "processes"),
            1.5,
            "users[0].processes: expected a whole number",
        ),
        (("buckets", 0, "gpus", 0, "memory_max"), True, "gpus[0].memory_max: expected a whole number"),
        (("buckets", 0, "gpus", 0, "mig"), None, "gpus[0].mig: expected true or false"),
        (("buckets", 0, "gpus", 0, "seconds"), _DELETE, "History.buckets[0].gpus[0]: missing 'seconds'"),
        (("buckets", 0, "gpus", 0, "extra"), 1, "History.buckets[0].gpus[0]: unknown key 'extra'"),
    ],
)
def test_malformed_fields_are_located(path: tuple[Any, ...], value: Any, message: str) -> None:
    data = _mutate(history_to_json(_history()), path, value)
    with pytest.raises(ValueError) as info:
        history_from_json(data)
    assert message in str(info.value)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=30,
)


@settings(max_examples=examples(300), deadline=None)
@given(_json)
def test_anything_decodes_or_is_a_value_error(data: Any) -> None:
    with contextlib.suppress(ValueError):
        history_from_json(data)


_keys = st.sampled_from(
    [
        ("resolution",),
        ("since",),
        ("until",),
        ("oldest",),
        ("recording",),
        ("buckets", 0, "start"),
        ("buckets", 0, "span"),
        ("buckets", 0, "gpus"),
        ("buckets", 0, "gpus", 0, "uuid"),
        ("buckets", 0, "gpus", 0, "owner"),
        ("buckets", 0, "gpus", 0, "busy"),
        ("buckets", 0, "gpus", 1, "users"),
        ("buckets", 0, "gpus", 0, "users", 0),
        ("buckets", 0, "gpus", 0, "users", 0, "tenant"),
        ("buckets", 0, "gpus", 0, "users", 0, "gpu_instance_id"),
        ("buckets", 0, "gpus", 0, "users", 1, "groups"),
    ]
)


@settings(max_examples=examples(300), deadline=None)
@given(_keys, _json)
def test_any_field_replaced_decodes_or_is_a_located_value_error(path: tuple[Any, ...], value: Any) -> None:
    data = _mutate(history_to_json(_history()), path, value)
    try:
        history_from_json(data)
    except ValueError as exc:
        assert str(exc).startswith("History")


# ---- shares of one sample ------------------------------------------------------------------------

GIB = 1 << 30


def _sample(util: object, used: int) -> GpuSample:
    na = NotAvailable("NOT_SUPPORTED")
    return GpuSample(T0, util, na, used, 80 * GIB, na, na, na, na)  # type: ignore[arg-type]


def _info(mig_model: str | None = None) -> GpuInfo:
    return GpuInfo(0, "GPU-0", "NVIDIA A100-SXM4-80GB", "0000:01:00.0", 0x20B210DE, 80 * GIB, True, mig_model)


def test_shares_by_memory_on_a_whole_gpu() -> None:
    gpu = Gpu(
        info=_info(),
        sample=_sample(80.0, 40 * GIB),
        processes=(
            GpuProcess(1, 30 * GIB, user="alice", groups=("vision",)),
            GpuProcess(2, 10 * GIB, user="bob"),
        ),
    )
    share = gpu_shares(gpu)
    assert share.busy == pytest.approx(0.8) and share.memory == 40 * GIB and not share.mig
    by_user = {k.key[0]: k for k in share.keys}
    assert by_user["alice"].weight == pytest.approx(0.75) and by_user["alice"].busy == pytest.approx(0.6)
    assert by_user["bob"].weight == pytest.approx(0.25) and by_user["bob"].busy == pytest.approx(0.2)


def test_no_memory_shares_equally_and_no_utilization_counts_busy() -> None:
    gpu = Gpu(
        info=_info(),
        sample=_sample(NotAvailable("NOT_SUPPORTED"), 0),
        processes=(GpuProcess(1, 0, user="a"), GpuProcess(2, 0, user="b"), GpuProcess(3, 0, user="b")),
    )
    share = gpu_shares(gpu)
    assert share.busy == 1.0
    by_user = {k.key[0]: k for k in share.keys}
    assert by_user["a"].weight == pytest.approx(0.5) and by_user["b"].processes == 2
    idle = gpu_shares(Gpu(info=_info(), sample=_sample(NotAvailable("NOT_SUPPORTED"), 0)))
    assert idle.busy == 0.0 and idle.keys == ()


def test_mig_instances_are_their_fraction_of_the_gpu() -> None:
    gis = (
        GpuInstance(1, 9, "3g.40gb", 0, 4, 40 * GIB, 42),
        GpuInstance(9, 19, "1g.10gb", 6, 1, 10 * GIB, 14),
        GpuInstance(10, 19, "1g.10gb", 7, 1, 10 * GIB, 14),  # empty
    )
    gpu = Gpu(
        info=_info("A100-80GB"),
        mig=MigState(True, True, gis),
        sample=_sample(NotAvailable("NOT_SUPPORTED"), 26 * GIB),
        processes=(
            GpuProcess(1, 15 * GIB, user="carol", gpu_instance_id=1),
            GpuProcess(2, 5 * GIB, user="dave", gpu_instance_id=1),
            GpuProcess(3, 6 * GIB, user="erin", gpu_instance_id=9),
        ),
    )
    share = gpu_shares(gpu)
    assert share.mig and share.busy == pytest.approx(4 / 7)
    by_user = {k.key[0]: k for k in share.keys}
    assert by_user["carol"].weight == pytest.approx(3 / 7 * 0.75) == by_user["carol"].busy
    assert by_user["dave"].weight == pytest.approx(3 / 7 * 0.25)
    assert by_user["erin"].weight == pytest.approx(1 / 7) and by_user["erin"].key[4] == 9
    assert MINUTE == 60.0


def test_mig_instances_with_gpm_utilization_count_it_as_gpu_time() -> None:
    """Hopper: a held slice's GPU-time is its fraction times its SMs' utilization (NVML's GPM),
    as the live views count it (docs/tui.md, GPU-time); a slice without a figure (NO_DATA at its
    first sample) counts fully while held."""
    gis = (
        GpuInstance(1, 9, "3g.40gb", 0, 4, 40 * GIB, 42),
        GpuInstance(9, 19, "1g.10gb", 6, 1, 10 * GIB, 14),
        GpuInstance(10, 19, "1g.10gb", 5, 1, 10 * GIB, 14),
        GpuInstance(11, 19, "1g.10gb", 4, 1, 10 * GIB, 14),  # empty, yet its SMs report 30%
    )
    gpu = Gpu(
        info=GpuInfo(
            0, "GPU-0", "NVIDIA H100 80GB HBM3", "0000:01:00.0", 0x233010DE, 80 * GIB, True, "H100-80GB"
        ),
        mig=MigState(True, True, gis),
        sample=_sample(NotAvailable("NOT_SUPPORTED"), 26 * GIB),
        processes=(
            GpuProcess(1, 15 * GIB, user="carol", gpu_instance_id=1),
            GpuProcess(2, 5 * GIB, user="dave", gpu_instance_id=1),
            GpuProcess(3, 6 * GIB, user="erin", gpu_instance_id=9),
            GpuProcess(4, 1 * GIB, user="fred", gpu_instance_id=10),
        ),
        mig_samples=(
            MigInstanceSample(1, 20 * GIB, 40 * GIB, 50.0),
            MigInstanceSample(9, 6 * GIB, 10 * GIB, 120.0),  # clamped to all of it
            MigInstanceSample(10, 1 * GIB, 10 * GIB, NotAvailable("NO_DATA")),
            MigInstanceSample(11, 0, 10 * GIB, 30.0),
        ),
    )
    share = gpu_shares(gpu)
    assert share.mig and share.busy == pytest.approx(3 / 7 * 0.5 + 1 / 7 + 1 / 7)
    by_user = {k.key[0]: k for k in share.keys}
    assert by_user["carol"].weight == pytest.approx(3 / 7 * 0.75)
    assert by_user["carol"].busy == pytest.approx(3 / 7 * 0.75 * 0.5)
    assert by_user["dave"].busy == pytest.approx(3 / 7 * 0.25 * 0.5)
    assert by_user["erin"].busy == pytest.approx(1 / 7) == by_user["erin"].weight
    assert by_user["fred"].busy == pytest.approx(1 / 7) == by_user["fred"].weight
    assert share.busy == pytest.approx(sum(k.busy for k in share.keys))


# ---- the fast path and kept JSON -----------------------------------------------------------------
# bucket_from_json first tries `_fast_bucket` (one type test per value, exactly bucket_to_json's
# form) and falls back to `_checked_bucket` (field by field, errors located). The fast path may
# refuse anything, never accept what the checked decoder refuses, and never decode differently.


def _decode(decoder: Any, data: Any) -> Any:
    try:
        return decoder(data)
    except ValueError as exc:
        return ("error", str(exc))


def _bucket_json() -> dict[str, Any]:
    return json.loads(json.dumps(history_to_json(_history())))["buckets"][0]


_bucket_keys = st.sampled_from(
    [
        ("start",),
        ("span",),
        ("gpus",),
        ("extra",),
        ("gpus", 0),
        ("gpus", 1, "index"),
        ("gpus", 0, "uuid"),
        ("gpus", 0, "name"),
        ("gpus", 0, "memory_total"),
        ("gpus", 0, "owner"),
        ("gpus", 0, "mig"),
        ("gpus", 0, "seconds"),
        ("gpus", 0, "busy"),
        ("gpus", 0, "memory"),
        ("gpus", 0, "memory_max"),
        ("gpus", 0, "users"),
        ("gpus", 0, "extra"),
        ("gpus", 0, "users", 0),
        ("gpus", 0, "users", 1, "user"),
        ("gpus", 0, "users", 0, "groups"),
        ("gpus", 0, "users", 0, "groups", 0),
        ("gpus", 0, "users", 0, "tenant"),
        ("gpus", 0, "users", 0, "tenant_source"),
        ("gpus", 1, "users", 0, "gpu_instance_id"),
        ("gpus", 0, "users", 0, "seconds"),
        ("gpus", 0, "users", 0, "held"),
        ("gpus", 0, "users", 1, "busy"),
        ("gpus", 0, "users", 0, "memory"),
        ("gpus", 0, "users", 0, "memory_max"),
        ("gpus", 0, "users", 0, "process_max"),
        ("gpus", 0, "users", 1, "processes"),
        ("gpus", 0, "users", 0, "extra"),
    ]
)
# Values near the edges of what each field takes, besides anything JSON can hold.
_edges = st.sampled_from(
    [
        0,
        -1,
        7,
        2**63 - 1,
        2**63,
        0.0,
        -0.0,
        -1.0,
        2.5,
        3600.0,
        60.0,
        1e11,
        1e11 + 3600.0,
        1e308,
        float("inf"),
        float("nan"),
        True,
        False,
        None,
        "",
        "alice",
        "(other)",
        [],
        ["vision"],
        ["vision", 7],
        {},
        _DELETE,
    ]
)


@settings(max_examples=examples(600), deadline=None)
@given(st.lists(st.tuples(_bucket_keys, _json | _edges), min_size=1, max_size=3))
def test_the_fast_path_agrees_with_the_checked_decoder(changes: list[tuple[tuple[Any, ...], Any]]) -> None:
    from gpuops.core.history import _checked_bucket, _fast_bucket, bucket_from_json, bucket_to_json

    data: Any = _bucket_json()
    for path, value in changes:
        with contextlib.suppress(KeyError, IndexError, TypeError):
            data = _mutate(data, path, value)
    checked = _decode(_checked_bucket, data)
    for keep in (False, True):
        fast = _fast_bucket(data, keep)
        assert fast is None or fast == checked
        got = _decode(lambda d, keep=keep: bucket_from_json(d, keep_json=keep), data)
        assert got == checked
        if not isinstance(got, tuple):  # decoded: its JSON is the checked bucket's, as values
            assert json.loads(json.dumps(bucket_to_json(got))) == json.loads(
                json.dumps(bucket_to_json(checked))
            )


def test_the_fast_path_takes_what_bucket_to_json_writes() -> None:
    from gpuops.core.history import _fast_bucket

    data = json.loads(json.dumps(history_to_json(_history())))
    for n, b in enumerate(_history().buckets):
        assert _fast_bucket(data["buckets"][n], False) == b


def test_a_kept_bucket_gives_its_json_back_and_builds_gpus_when_asked() -> None:
    from gpuops.core.history import bucket_from_json, bucket_to_json

    data = _bucket_json()
    kept = bucket_from_json(data, keep_json=True)
    assert bucket_to_json(kept) is data
    assert "gpus" not in vars(kept)  # not built yet: a node sends `data`
    expected = _history().buckets[0]
    assert kept == expected and hash(kept) == hash(expected) and repr(kept) == repr(expected)
    assert kept.gpus[0].users[1].user == "bob"
    # Not in bucket_to_json's exact form (an int for a float): decoded field by field, not kept.
    data["gpus"][0]["seconds"] = 3600
    loose = bucket_from_json(data, keep_json=True)
    assert loose.gpus[0].seconds == 3600.0 and bucket_to_json(loose) is not data
    with pytest.raises(AttributeError):
        kept.nothing  # noqa: B018


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        (
            ("buckets", 0, "gpus", 0, "users", 0, "seconds"),
            float("nan"),
            "users[0].seconds: expected a finite",
        ),
        (("buckets", 0, "gpus", 0, "busy"), -0.5, "gpus[0].busy: expected a finite number >= 0"),
        (("buckets", 0, "gpus", 0, "index"), 0.0, "gpus[0].index: expected a whole number"),
        (("buckets", 0, "gpus", 1, "users", 0, "gpu_instance_id"), -1, "gpu_instance_id: expected a whole"),
        (("buckets", 0, "gpus", 0, "users", 0, "memory_max"), 2**63, "users[0].memory_max: expected a whole"),
        (("buckets", 0, "gpus", 0, "users", 0, "tenant_source"), None, "tenant_source: expected a string"),
        (("buckets", 0, "gpus", 0, "users", 0, "extra"), 1, "users[0]: unknown key 'extra'"),
        (("buckets", 0, "gpus", 0, "users", 0, "user"), _DELETE, "users[0]: missing 'user'"),
        (("buckets", 0, "start"), 2e11, "History.buckets[0].start: not a time"),
        (("buckets", 0, "span"), 60, "History.buckets[0].span: 60 in a history of hour buckets"),
    ],
)
def test_more_malformed_fields_are_located(path: tuple[Any, ...], value: Any, message: str) -> None:
    data = _mutate(history_to_json(_history()), path, value)
    with pytest.raises(ValueError) as info:
        history_from_json(data)
    assert message in str(info.value)
