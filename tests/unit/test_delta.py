"""Deltas between successive samples: exact, smaller, and strictly checked on the way in."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.core.codec import DecodeError, from_delta, from_json, to_json
from gpuops.core.delta import DeltaError, apply, diff
from gpuops.core.model import NodeSample, NotAvailable
from gpuops.node.backends.sim import SimBackend
from tests.hypothesis_budget import examples

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=25,
)


@given(json_values, json_values)
def test_apply_of_diff_gives_the_new_document(old: object, new: object) -> None:
    delta = diff(old, new)
    if delta is None:
        assert old == new
    else:
        # The delta crosses the wire as JSON text.
        assert apply(old, json.loads(json.dumps(delta))) == new


def _samples(n: int, spec: str = "demo-node") -> list[NodeSample]:
    clock = [1_700_000_000.0]
    backend = SimBackend(spec, clock=lambda: clock[0])
    out = []
    for _ in range(n):
        out.append(backend.sample())
        clock[0] += 1.0
    return out


@pytest.mark.parametrize("spec", ["demo-node", "mixed-node", "hopper-node"])
def test_from_delta_rebuilds_every_sample_exactly(spec: str) -> None:
    samples = _samples(30, spec)
    previous = samples[0]
    full_bytes = delta_bytes = 0
    for sample in samples[1:]:
        delta = diff(to_json(previous), to_json(sample))
        wire = json.loads(json.dumps(delta or {"~": {}}))
        rebuilt = from_delta(NodeSample, previous, wire)
        assert rebuilt == sample
        assert rebuilt == from_json(NodeSample, to_json(sample))
        full_bytes += len(json.dumps(to_json(sample)))
        delta_bytes += len(json.dumps(wire))
        previous = rebuilt
    assert delta_bytes * 4 < full_bytes  # what repeats is not sent again


def test_unchanged_parts_are_the_previous_objects() -> None:
    first, second = _samples(2)
    rebuilt = from_delta(NodeSample, first, diff(to_json(first), to_json(second)))
    assert all(a.info is b.info for a, b in zip(first.gpus, rebuilt.gpus, strict=True))


@pytest.mark.parametrize(
    ("delta", "message"),
    [
        ({"~": {"gpus": {"@": {"99": {"~": {}}}}}}, "NodeSample.gpus: no item '99'"),
        (
            {"~": {"gpus": {"@": {"0": {"~": {"sample": {"~": {"power_watts": "hot"}}}}}}}},
            "gpus[0].sample.power_watts",
        ),
        ({"~": {"hostname": 5}}, "NodeSample.hostname: expected a string"),
        ({"~": {"nope": 1}}, "unknown field 'nope'"),
        ({"~": {}, "$": 1}, "exactly one of the keys"),
        ({"%": 1}, "unknown delta kind"),
        ({"~": {"gpus": {"~": {}}}}, "a ~ delta needs an object"),
    ],
)
def test_bad_deltas_name_the_field(delta: object, message: str) -> None:
    (first,) = _samples(1)
    with pytest.raises(DecodeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_delta(NodeSample, first, delta)


def test_a_reading_can_become_not_available_and_back() -> None:
    (first,) = _samples(1)
    path = to_json(first)
    gone = json.loads(json.dumps(path))
    gone["gpus"][0]["sample"]["power_watts"] = {"na": "GPU_IS_LOST"}
    lost = from_delta(NodeSample, first, diff(path, gone))
    assert lost.gpus[0].sample is not None
    assert lost.gpus[0].sample.power_watts == NotAvailable("GPU_IS_LOST")
    back = from_delta(NodeSample, lost, diff(gone, path))
    assert back == first


@settings(max_examples=examples(200))
@given(json_values)
def test_garbage_deltas_only_raise_decode_errors(delta: object) -> None:
    (first,) = _samples(1)
    with contextlib.suppress(DecodeError):
        from_delta(NodeSample, first, delta)


@given(json_values, json_values)
def test_garbage_apply_only_raises_delta_errors(old: object, delta: object) -> None:
    with contextlib.suppress(DeltaError):
        apply(old, delta)
