"""The node exporter on NVML (the fake libnvidia-ml.so.1 in a real agent process), scraped over
HTTP: MIG-slice utilization from GPM, XID counters from the agent's event thread, and
dcgm-exporter's names and units with --dcgm-compat (never without)."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.nvml_fake import GiB, build_library, gpu, write_config
from tests.integration.metrics_helpers import one, parse, promtool_problems, running_exporter, scrape


@pytest.fixture(scope="module")
def fake_nvml_library() -> Path:
    if shutil.which(os.environ.get("CC", "gcc")) is None:
        pytest.skip("gcc is needed to build the fake libnvidia-ml.so.1")
    return build_library()


def _env(tmp_path: Path, library: Path) -> dict[str, str]:
    h100 = gpu(
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
                    "sm_util": 70.0,
                    "compute_instances": [{"id": 0, "profile_id": 2, "start": 0}],
                }
            ],
        },
        events=[
            {"after_ms": 200, "type": "xid", "data": 48, "gpu_instance_id": 2, "compute_instance_id": 0},
            {"after_ms": 400, "type": "xid", "data": 79},
            {"after_ms": 500, "type": "xid", "data": 79},
        ],
    )
    a100 = gpu(
        "A100-SXM4-40GB",
        1,
        memory_used=7 * GiB,
        utilization_gpu=63,
        events=[{"after_ms": 300, "type": "xid", "data": 13}],
    )
    conf = write_config({"devices": [h100, a100]}, tmp_path / "nvml.conf")
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "LD_LIBRARY_PATH")}
    env.update(GPUOPS_NVML_LIBRARY=str(library), FAKE_NVML_CONFIG=str(conf))
    return env


def _args(tmp_path: Path, *extra: str) -> list[str]:
    dirs = ["--state-dir", str(tmp_path / "state"), "--limiter-dir", str(tmp_path / "limiter")]
    return ["--backend", "nvml", "--interval", "0.2", *dirs, *extra]


def _until(url: str, done: Any, timeout: float = 20.0) -> tuple[str, dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while True:
        text = scrape(url)
        series = parse(text)
        if done(series) or time.monotonic() > deadline:
            return text, series
        time.sleep(0.2)


def test_mig_utilization_xids_and_dcgm_names(tmp_path: Path, fake_nvml_library: Path) -> None:
    env = _env(tmp_path, fake_nvml_library)
    with running_exporter(*_args(tmp_path, "--dcgm-compat"), env=env) as (url, _proc):
        text, series = _until(
            url,
            lambda s: (
                one(s, "gpuops_xid_errors_total", gpu="0", xid="79") == 2.0
                and one(s, "gpuops_mig_instance_utilization_ratio", GPU_I_ID="2") is not None
            ),
        )
    mig = {"gpu": "0", "GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "2"}
    assert one(series, "gpuops_mig_instance_utilization_ratio", **mig) == 0.7
    assert one(series, "gpuops_mig_instance_memory_used_bytes", **mig) == 5 * GiB
    # The whole GPU's utilization stays absent with MIG on (NVML: NOT_SUPPORTED).
    assert one(series, "gpuops_gpu_utilization_ratio", gpu="0") is None
    xids = {(lbl["gpu"], lbl["xid"]): v for lbl, v in series["gpuops_xid_errors_total"]}
    assert xids == {("0", "48"): 1.0, ("0", "79"): 2.0, ("1", "13"): 1.0}
    (labels, _), *_ = series["gpuops_xid_errors_total"]
    assert set(labels) == {"gpu", "UUID", "Hostname", "node", "xid"} and labels["UUID"].startswith("GPU-")

    # dcgm-exporter's names, units and labels.
    assert one(series, "DCGM_FI_DEV_GPU_UTIL", gpu="1") == 63.0  # percent
    assert one(series, "DCGM_FI_DEV_GPU_UTIL", gpu="0", GPU_I_ID="2") == 70.0  # GPM, per instance
    assert one(series, "DCGM_FI_DEV_FB_USED", gpu="1") == 7 * 1024  # MiB
    assert one(series, "DCGM_FI_DEV_FB_FREE", gpu="1") == 40960 - 7 * 1024
    assert one(series, "DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_PROFILE="3g.40gb", GPU_I_ID="2") == 5 * 1024
    assert one(series, "DCGM_FI_DEV_FB_USED", gpu="0", GPU_I_ID="") is None  # per instance on MIG
    assert one(series, "DCGM_FI_DEV_POWER_USAGE", gpu="0") == 123.456  # W
    assert one(series, "DCGM_FI_DEV_GPU_TEMP", gpu="1") == 47.0  # C
    assert one(series, "DCGM_FI_DEV_XID_ERRORS", gpu="0") == 79.0  # the last XID
    assert one(series, "DCGM_FI_DEV_XID_ERRORS", gpu="1") == 13.0
    (labels, _), *_ = series["DCGM_FI_DEV_GPU_TEMP"]
    assert set(labels) == {"gpu", "UUID", "device", "modelName", "Hostname", "GPU_I_PROFILE", "GPU_I_ID"}
    assert labels["device"] == f"nvidia{labels['gpu']}" and labels["modelName"].startswith("NVIDIA ")
    problems = promtool_problems(text)
    assert not problems, problems


def test_dcgm_names_only_when_asked(tmp_path: Path, fake_nvml_library: Path) -> None:
    env = _env(tmp_path, fake_nvml_library)
    with running_exporter(*_args(tmp_path), env=env) as (url, _proc):
        _text, series = _until(url, lambda s: "gpuops_mig_instance_utilization_ratio" in s)
    assert "gpuops_gpu_info" in series
    assert not [name for name in series if name.startswith("DCGM_")]
