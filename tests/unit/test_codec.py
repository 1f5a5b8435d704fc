from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops.core.codec import DecodeError, from_json, to_json
from gpuops.core.model import (
    ComputeInstance,
    Gpu,
    GpuInfo,
    GpuInstance,
    GpuProcess,
    GpuSample,
    MigState,
    Node,
    NodeSample,
    NotAvailable,
)


def _node() -> Node:
    gi = GpuInstance(
        id=1,
        profile_id=9,
        profile_name="3g.20gb",
        start=4,
        size=4,
        memory_total_bytes=19968 * 1024**2,
        multiprocessor_count=42,
        compute_instances=(ComputeInstance(0, 2, "3g.20gb", 0, 3, 42, "MIG-abc"),),
    )
    info = GpuInfo(
        index=0,
        uuid="GPU-1",
        name="NVIDIA A100-SXM4-40GB",
        pci_bus_id="00000000:07:00.0",
        pci_device_id=0x20B010DE,
        memory_total_bytes=40 * 1024**3,
        mig_capable=True,
        mig_model="A100-SXM4-40GB",
    )
    sample = GpuSample(
        timestamp=1.5,
        utilization_gpu_percent=NotAvailable("NOT_SUPPORTED"),
        utilization_memory_percent=NotAvailable("NOT_SUPPORTED"),
        memory_used_bytes=123,
        memory_total_bytes=40 * 1024**3,
        power_watts=88.5,
        temperature_celsius=40.0,
        sm_clock_mhz=1410,
        memory_clock_mhz=NotAvailable("GPU_IS_LOST"),
    )
    gpu = Gpu(
        info=info,
        mig=MigState(True, True, (gi,)),
        sample=sample,
        processes=(GpuProcess(42, 1024, "alice", "python train.py", 1, 0, "ml", "user"),),
    )
    return Node("node-1", "sim", "550.54", "12.4", (gpu,))


def test_round_trip_through_json_text() -> None:
    node = _node()
    text = json.dumps(to_json(node))
    assert from_json(Node, json.loads(text)) == node


def test_not_available_is_explicit() -> None:
    data = to_json(_node())
    assert data["gpus"][0]["sample"]["utilization_gpu_percent"] == {"na": "NOT_SUPPORTED"}
    assert data["gpus"][0]["sample"]["memory_clock_mhz"] == {"na": "GPU_IS_LOST"}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d["gpus"][0]["sample"].__setitem__("power_watts", "hot"), "gpus[0].sample.power_watts"),
        (lambda d: d["gpus"][0]["info"].pop("uuid"), "gpus[0].info.uuid: missing"),
        (
            lambda d: d["gpus"][0]["info"].__setitem__("index", True),
            "gpus[0].info.index: expected an integer",
        ),
        (lambda d: d.__setitem__("gpus", {}), "Node.gpus: expected a list"),
        (lambda d: d.__setitem__("extra", 1), "unknown field 'extra'"),
        (lambda d: d["gpus"][0]["sample"].__setitem__("power_watts", {"na": 3}), "power_watts"),
    ],
)
def test_decode_errors_name_the_field(mutate, message: str) -> None:  # type: ignore[no-untyped-def]
    data = to_json(_node())
    mutate(data)
    with pytest.raises(DecodeError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_json(Node, data)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=30,
)


@given(json_values)
def test_garbage_gives_decode_error_only(data: object) -> None:
    for cls in (Node, NodeSample, Gpu):
        with contextlib.suppress(DecodeError):
            from_json(cls, data)
