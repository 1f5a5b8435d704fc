"""MIG-slice utilization through NVML's GPM, the real pynvml ctypes path against the fake
libnvidia-ml.so.1 (tests/fakes): Hopper gives each GPU instance's SM utilization from two GPM
samples, Ampere says NOT_SUPPORTED, and a failing GPM call is that instance's reason."""

from __future__ import annotations

from typing import Any, Dict, List

import pytest

from gpuops.core.model import NodeSample, NotAvailable
from tests.fakes.nvml_fake import GiB, gpu, run_backend

pytestmark = pytest.mark.usefixtures("fake_nvml_library")


def _h100(**overrides: Any) -> Dict[str, Any]:
    return gpu(
        "H100-80GB",
        0,
        mig={
            "current": True,
            "pending": True,
            "gpu_instances": [
                {
                    "id": 2,
                    "profile_id": 9,
                    "start": 4,
                    "memory_used": 5 * GiB,
                    "sm_util": 62.5,
                    "compute_instances": [{"id": 0, "profile_id": 2, "start": 0}],
                },
                {
                    "id": 3,
                    "profile_id": 14,
                    "start": 0,
                    "sm_util": 12.0,
                    "compute_instances": [{"id": 0, "profile_id": 1, "start": 0}],
                },
            ],
        },
        **overrides,
    )


def _a100() -> Dict[str, Any]:
    return gpu(
        "A100-SXM4-40GB",
        1,
        mig={
            "current": True,
            "pending": True,
            "gpu_instances": [
                {
                    "id": 1,
                    "profile_id": 5,
                    "start": 0,
                    "sm_util": 40.0,
                    "compute_instances": [{"id": 0, "profile_id": 3, "start": 0}],
                }
            ],
        },
    )


def _samples(config: Dict[str, Any], count: int, pause: float = 0.15) -> List[NodeSample]:
    """`count` samples from one backend, `pause` seconds apart (GPM wants over 100 ms)."""
    script = (
        "import time\n"
        "from gpuops.core.codec import to_json\n"
        "result = []\n"
        f"for i in range({count}):\n"
        f"    if i: time.sleep({pause})\n"
        "    result.append(to_json(backend.sample()))\n"
    )
    init, out = run_backend(config, (("script", script),))
    assert init.error is None and out.error is None, (init.error, out.error)
    from gpuops.core.codec import from_json

    return [from_json(NodeSample, s) for s in out.value]


def _util(sample: NodeSample, gpu_index: int) -> Dict[int, object]:
    return {m.gpu_instance_id: m.sm_utilization_percent for m in sample.gpus[gpu_index].mig_samples}


def test_hopper_gives_each_gpu_instance_its_sm_utilization_from_two_samples() -> None:
    first, second, third = _samples({"devices": [_h100(), _a100()]}, 3)
    # One sample has nothing to compare with.
    assert _util(first, 0) == {2: NotAvailable("NO_DATA"), 3: NotAvailable("NO_DATA")}
    for later in (second, third):
        util = _util(later, 0)
        assert util[2] == pytest.approx(62.5, abs=0.01) and util[3] == pytest.approx(12.0, abs=0.01)
        # NVML's utilization rates stay NOT_SUPPORTED with MIG on: the figure is GPM's.
        s = later.gpus[0].sample
        assert s is not None and s.utilization_gpu_percent == NotAvailable("NOT_SUPPORTED")
    # Ampere has no GPM: NVML's reason, never a figure.
    assert _util(third, 1) == {1: NotAvailable("NOT_SUPPORTED")}


def test_a_failing_gpm_sample_is_that_instance_reason() -> None:
    config = {"devices": [_h100(errors={"nvmlGpmMigSampleGet": "NO_PERMISSION"})]}
    _first, second = _samples(config, 2)
    assert _util(second, 0) == {2: NotAvailable("NO_PERMISSION"), 3: NotAvailable("NO_PERMISSION")}
    per_gi = {m.gpu_instance_id: m for m in second.gpus[0].mig_samples}
    assert per_gi[2].memory_used_bytes == 5 * GiB  # the rest of the sample stays


def test_a_driver_without_gpm_is_function_not_found() -> None:
    _init, out = run_backend({"devices": [_h100()]}, (("sample",),), missing=["nvmlGpmQueryDeviceSupport"])
    sample = out.decode(NodeSample)
    assert set(_util(sample, 0).values()) == {NotAvailable("FUNCTION_NOT_FOUND")}


def test_samples_closer_than_gpm_refresh_keep_the_last_figure() -> None:
    samples = _samples({"devices": [_h100()]}, 10, pause=0.03)
    values = [_util(s, 0)[2] for s in samples]
    # 30 ms apart: within NVML's 100 ms refresh of the first sample the figure is not there yet
    # (no new GPM sample is taken), once 100 ms passed it is.
    assert values[1] == NotAvailable("NO_DATA")
    assert values[-1] == pytest.approx(62.5, abs=0.01)
