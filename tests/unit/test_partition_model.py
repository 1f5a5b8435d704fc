"""Mode partitions (AMD compute/memory partitions) in the node model and on the wire."""

from __future__ import annotations

import json

from gpuops.core.codec import from_json, sample_to_json, to_json
from gpuops.core.model import Gpu, GpuInfo, Node, NodeSample, PartitionState


def _gpu(partition: PartitionState | None) -> Gpu:
    info = GpuInfo(0, "GPU-x", "AMD Instinct MI300X", "0000:0c:00.0", 0x74A11002, 192 << 30, False)
    return Gpu(info=info, partition=partition)


def test_a_gpu_without_partitions_sends_no_key_for_them() -> None:
    sample = NodeSample(hostname="n", timestamp=1.0, gpus=(_gpu(None),))
    assert "partition" not in sample_to_json(sample)["gpus"][0]
    assert "partition" not in to_json(Node("n", "nvml", gpus=(_gpu(None),)))["gpus"][0]


def test_partitions_round_trip_through_json() -> None:
    state = PartitionState("CPX", "NPS4", ("SPX", "DPX", "QPX", "CPX"), ("NPS1", "NPS4"), 8)
    node = Node("n", "amd", gpus=(_gpu(state),))
    text = json.dumps(to_json(node))
    assert from_json(Node, json.loads(text)) == node


def test_a_bad_partition_is_located() -> None:
    data = to_json(Node("n", "amd", gpus=(_gpu(PartitionState("SPX", "NPS1")),)))
    data["gpus"][0]["partition"]["partitions"] = "one"
    try:
        from_json(Node, data)
    except ValueError as exc:
        assert "gpus[0].partition.partitions" in str(exc)
    else:
        raise AssertionError("accepted a bad partition count")
