"""The rows form of a sample stream (core/delta.py `sample_rows`, codec.from_rows): exact, compact,
and as strict as a full sample on the way in."""

from __future__ import annotations

import contextlib
import copy
import itertools
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.core.codec import SAMPLE_ROW_FIELDS, DecodeError, from_delta, from_json, from_rows, to_json
from gpuops.core.delta import diff, sample_rows
from gpuops.core.model import NodeSample, NotAvailable
from gpuops.node.backends.sim import SimBackend
from gpuops.simfleet import build_fleet
from tests.hypothesis_budget import examples


def _documents(n: int, spec: Any = "demo-node") -> list[dict[str, Any]]:
    clock = [1_700_000_000.0]
    backend = SimBackend(spec, clock=lambda: clock[0])
    out = []
    for _ in range(n):
        out.append(to_json(backend.sample()))
        clock[0] += 1.0
    return out


def _wire(body: Any) -> Any:
    return json.loads(json.dumps(body))


def _replay(documents: list[dict[str, Any]]) -> tuple[int, int]:
    """Rebuild every document from rows; returns the bytes of full samples and of rows."""
    previous = from_json(NodeSample, documents[0])
    full = rows = 0
    for before, after in itertools.pairwise(documents):
        body = sample_rows(before, after, SAMPLE_ROW_FIELDS)
        assert body is not None
        rebuilt = from_rows(previous, _wire(body))
        assert rebuilt == from_json(NodeSample, after)
        full += len(json.dumps(after))
        rows += len(json.dumps(body))
        previous = rebuilt
    return full, rows


@pytest.mark.parametrize("spec", ["demo-node", "mixed-node", "hopper-node", "idle-silo"])
def test_rows_rebuild_every_sample_exactly(spec: str) -> None:
    full, rows = _replay(_documents(30, spec))
    assert rows * 6 < full


def test_rows_rebuild_every_profile_of_the_large_fleet() -> None:
    # training, inference (processes' memory moves), notebooks, MIG (utilization not available,
    # MIG instances' memory moves), saturated, idle
    plan = build_fleet("large", 40, 0, 1.7e9)
    seen = set()
    for node in plan.nodes:
        if node.profile in seen:
            continue
        seen.add(node.profile)
        _replay(_documents(6, node.spec))
    assert len(seen) == 6


def test_unchanged_parts_are_the_previous_objects() -> None:
    first, second = _documents(2)
    previous = from_json(NodeSample, first)
    rebuilt = from_rows(previous, _wire(sample_rows(first, second, SAMPLE_ROW_FIELDS)))
    for a, b in zip(previous.gpus, rebuilt.gpus, strict=True):
        assert a.info is b.info and a.mig is b.mig
        assert a.processes is b.processes or a.processes != b.processes


def test_a_row_carries_only_what_changed() -> None:
    first = _documents(1)[0]
    second = copy.deepcopy(first)
    second["timestamp"] += 1
    second["gpus"][0]["sample"]["power_watts"] = 123.25
    body = sample_rows(first, second, SAMPLE_ROW_FIELDS)
    assert body is not None and len(body) == 2  # no GPU delta: nothing but the sample changed
    row = body[1][0]
    assert row[SAMPLE_ROW_FIELDS.index("power_watts")] == 123.25
    assert [v for v in row if v is not None] == [123.25]
    assert body[1][1:] == [None] * (len(first["gpus"]) - 1)


def test_readings_can_become_not_available_and_back() -> None:
    first = _documents(1)[0]
    gone = copy.deepcopy(first)
    gone["gpus"][1]["sample"]["power_watts"] = {"na": "GPU_IS_LOST"}
    gone["gpus"][1]["sample"]["sm_clock_mhz"] = {"na": "GPU_IS_LOST"}
    previous = from_json(NodeSample, first)
    lost = from_rows(previous, _wire(sample_rows(first, gone, SAMPLE_ROW_FIELDS)))
    assert lost == from_json(NodeSample, gone)
    assert lost.gpus[1].sample is not None
    assert lost.gpus[1].sample.power_watts == NotAvailable("GPU_IS_LOST")
    back = from_rows(lost, _wire(sample_rows(gone, first, SAMPLE_ROW_FIELDS)))
    assert back == previous


def test_other_changes_of_a_gpu_travel_as_its_delta() -> None:
    first = _documents(1, "mixed-node")[0]
    second = copy.deepcopy(first)
    second["gpus"][0]["processes"] = second["gpus"][0]["processes"][:1]
    second["gpus"][0]["owner"] = "team-b"
    second["gpus"][1]["sample"] = None  # a GPU whose sample could not be read: not a row
    body = sample_rows(first, second, SAMPLE_ROW_FIELDS)
    assert body is not None and body[1][1] is None and body[2][1] is not None
    rebuilt = from_rows(from_json(NodeSample, first), _wire(body))
    assert rebuilt == from_json(NodeSample, second)
    # ... and back: a row for a GPU whose previous sample was none carries every value.
    body = sample_rows(second, first, SAMPLE_ROW_FIELDS)
    assert body is not None and None not in body[1][1]
    assert from_rows(rebuilt, _wire(body)) == from_json(NodeSample, first)


def test_integer_readings_of_float_fields_are_taken_as_floats() -> None:
    first = _documents(1)[0]
    second = copy.deepcopy(first)
    second["gpus"][0]["sample"]["power_watts"] = 300  # a JSON integer, as another encoder may send
    sample = from_rows(from_json(NodeSample, first), _wire(sample_rows(first, second, SAMPLE_ROW_FIELDS)))
    assert sample.gpus[0].sample is not None
    assert type(sample.gpus[0].sample.power_watts) is float
    assert sample == from_json(NodeSample, second)


def test_what_rows_cannot_say_needs_a_full_sample() -> None:
    first = _documents(1)[0]
    fewer = copy.deepcopy(first)
    fewer["gpus"].pop()
    renamed = copy.deepcopy(first)
    renamed["hostname"] = "elsewhere"
    for after in (fewer, renamed):
        assert sample_rows(first, after, SAMPLE_ROW_FIELDS) is None


def test_a_sample_with_other_fields_than_asked_goes_as_a_gpu_delta() -> None:
    first = _documents(1)[0]
    second = copy.deepcopy(first)
    second["timestamp"] += 1
    second["gpus"][0]["sample"]["timestamp"] += 1
    body = sample_rows(first, second, SAMPLE_ROW_FIELDS[:-1])
    assert body is not None and body[1][0] is None and body[2][0] is not None


def _bad(body: Any, message: str) -> None:
    (first,) = _documents(1)
    with pytest.raises(DecodeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_rows(from_json(NodeSample, first), body)


def _row(**values: Any) -> list[Any]:
    return [values.get(name) for name in SAMPLE_ROW_FIELDS]


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda n: {"~": {}}, "a rows delta is [timestamp, rows]"),
        (lambda n: [1.0], "a rows delta is [timestamp, rows]"),
        (lambda n: ["now", [None] * n], "NodeSample.timestamp: expected a number"),
        (lambda n: [1.0, [None] * (n + 1)], "NodeSample.gpus: expected a row and a delta"),
        (lambda n: [1.0, [None] * n, [None]], "NodeSample.gpus: expected a row and a delta"),
        (lambda n: [1.0, [[1.0]] + [None] * (n - 1)], "NodeSample.gpus[0].sample: expected a row of 9"),
        (
            lambda n: [1.0, [None, _row(power_watts="hot")] + [None] * (n - 2)],
            "NodeSample.gpus[1].sample.power_watts: expected a number",
        ),
        (
            lambda n: [1.0, [_row(temperature_celsius=float("inf"))] + [None] * (n - 1)],
            "NodeSample.gpus[0].sample.temperature_celsius: expected a finite number",
        ),
        (
            lambda n: [1.0, [_row(sm_clock_mhz=1.5)] + [None] * (n - 1)],
            "NodeSample.gpus[0].sample.sm_clock_mhz: expected an integer",
        ),
        (
            lambda n: [1.0, [_row(sm_clock_mhz=True)] + [None] * (n - 1)],
            "NodeSample.gpus[0].sample.sm_clock_mhz: expected an integer",
        ),
        (
            lambda n: [1.0, [_row(power_watts={"na": 5})] + [None] * (n - 1)],
            'NodeSample.gpus[0].sample.power_watts: expected {"na": REASON}',
        ),
        (
            lambda n: [1.0, [None] * n, [None, {"~": {"owner": 7}}] + [None] * (n - 2)],
            "NodeSample.gpus[1].owner: expected a string or null",
        ),
        (
            lambda n: [1.0, [None] * n, [{"~": {"nope": 1}}] + [None] * (n - 1)],
            "NodeSample.gpus[0].nope: unknown field 'nope'",
        ),
        (
            lambda n: [
                1.0,
                [None] * n,
                [{"~": {"processes": {"@": {"0": {"~": {"pid": "x"}}}}}}, *[None] * (n - 1)],
            ],
            "NodeSample.gpus[0].processes[0].pid: expected an integer",
        ),
        (
            lambda n: [1.0, [None] * n, [{"%": 1}] + [None] * (n - 1)],
            "NodeSample.gpus[0]: unknown delta kind",
        ),
    ],
)
def test_bad_rows_name_the_field(make: Any, message: str) -> None:
    (first,) = _documents(1)
    _bad(make(len(first["gpus"])), message)


def test_a_null_needs_a_previous_value() -> None:
    first = _documents(1)[0]
    first["gpus"][0]["sample"] = None
    rows = [_row(timestamp=1.0)] + [None] * (len(first["gpus"]) - 1)
    with pytest.raises(DecodeError, match=r"gpus\[0\]\.sample\.utilization_gpu_percent: null"):
        from_rows(from_json(NodeSample, first), [1.0, rows])


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=10) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=40,
)


@settings(max_examples=examples(300))
@given(json_values)
def test_garbage_rows_only_raise_decode_errors(body: object) -> None:
    (first,) = _documents(1)
    with contextlib.suppress(DecodeError):
        from_rows(from_json(NodeSample, first), body)


row_values = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.sampled_from([{"na": "NOT_SUPPORTED"}, {"na": 3}, {}, "x", []]),
)


@settings(max_examples=examples(300))
@given(st.lists(st.lists(row_values, min_size=9, max_size=9), min_size=8, max_size=8))
def test_rows_are_checked_as_full_samples_are(rows: list[list[Any]]) -> None:
    """Whatever the values, from_rows accepts exactly what a full sample with those values
    would decode to (nulls: the previous values), and refuses the rest."""
    (first,) = _documents(1)
    previous = from_json(NodeSample, first)
    document = copy.deepcopy(first)
    for gpu, row in zip(document["gpus"], rows, strict=True):
        for name, value in zip(SAMPLE_ROW_FIELDS, row, strict=True):
            if value is not None:
                gpu["sample"][name] = value
    try:
        expected = from_json(NodeSample, {**document, "timestamp": 5.0})
    except DecodeError:
        expected = None
    try:
        got = from_rows(previous, [5.0, rows])
    except DecodeError:
        got = None
    assert got == expected


@settings(max_examples=examples(200))
@given(
    st.lists(
        st.tuples(
            st.integers(min_value=0, max_value=3),
            st.sampled_from(["used_memory_bytes", "pid", "user", "tenant", "gpu_instance_id", "groups"]),
            row_values | st.text(max_size=3) | st.lists(st.text(max_size=2), max_size=2),
        ),
        max_size=4,
    )
)
def test_field_changes_are_checked_as_full_samples_are(changes: list[tuple[int, str, Any]]) -> None:
    """The `~` fast path (a memo of body shapes) takes exactly what decoding the new document
    would take."""
    first = _documents(1, "mixed-node")[0]
    second = copy.deepcopy(first)
    for gpu, name, value in changes:
        processes = second["gpus"][gpu]["processes"]
        if processes:
            processes[0][name] = value
    delta = diff(first, second)
    previous = from_json(NodeSample, first)
    try:
        expected = from_json(NodeSample, second)
    except DecodeError:
        expected = None
    try:
        got = previous if delta is None else from_delta(NodeSample, previous, delta)
    except DecodeError:
        got = None
    assert got == expected


@settings(max_examples=examples(200))
@given(
    st.lists(
        st.tuples(st.integers(min_value=0, max_value=7), st.sampled_from(SAMPLE_ROW_FIELDS), row_values),
        max_size=6,
    )
)
def test_tree_deltas_of_readings_are_checked_as_full_samples_are(changes: list[tuple[int, str, Any]]) -> None:
    """The same for the tree form's fast path (a value of its field's plain type taken as it is):
    non-finite floats, ints for floats, booleans, "not available"."""
    (first,) = _documents(1)
    second = copy.deepcopy(first)
    for gpu, name, value in changes:
        second["gpus"][gpu]["sample"][name] = value
    delta = diff(first, second)
    previous = from_json(NodeSample, first)
    try:
        expected = from_json(NodeSample, second)
    except DecodeError:
        expected = None
    try:
        got = previous if delta is None else from_delta(NodeSample, previous, _wire_or_raw(delta))
    except DecodeError:
        got = None
    assert got == expected


def _wire_or_raw(delta: Any) -> Any:
    """Through JSON text when it can go (not with nan or infinity, which JSON cannot carry)."""
    try:
        return json.loads(json.dumps(delta, allow_nan=False))
    except ValueError:
        return delta
