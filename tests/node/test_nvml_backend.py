"""NvmlBackend through the real pynvml ctypes path, against the fake libnvidia-ml.so.1.

Each scenario runs in a fresh Python process (pynvml and the loaded library are process-global):
`run_backend` writes the node description for the fake, starts the child, and returns what each
backend call gave, as codec JSON decoded back into model objects here.
"""

from __future__ import annotations

import ctypes.util
import dataclasses
import os
import pwd
import socket
from typing import Any, Dict, List, Tuple

import pytest

from gpuops.core.model import (
    ComputeInstance,
    Gpu,
    GpuInstance,
    GpuSample,
    Node,
    NodeSample,
    NotAvailable,
)
from gpuops.node.backends.base import MigModeChange
from tests.fakes.nvml_fake import GiB, MiB, Outcome, gpu, run_backend

pytestmark = pytest.mark.usefixtures("fake_nvml_library")

SAMPLE_FIELDS = tuple(f.name for f in dataclasses.fields(GpuSample) if f.name != "timestamp")
ME = os.getpid()


def _node_and_sample(config: Dict[str, Any], **kw: Any) -> Tuple[Node, NodeSample]:
    init, inv, smp = run_backend(config, (("inventory",), ("sample",)), **kw)
    assert init.error is None, init.error
    return inv.decode(Node), smp.decode(NodeSample)


def _sample_gpu(sample: NodeSample, index: int) -> Tuple[Gpu, GpuSample]:
    g = sample.gpus[index]
    assert g.sample is not None
    return g, g.sample


def _na_fields(s: GpuSample) -> Dict[str, str]:
    return {
        name: getattr(s, name).reason for name in SAMPLE_FIELDS if isinstance(getattr(s, name), NotAvailable)
    }


def _mig_h100(**overrides: Any) -> Dict[str, Any]:
    """An H100 with MIG on: 3g.40gb at 4 (one full CI) and 2g.20gb at 0 (two 1c CIs)."""
    mig = {
        "current": True,
        "pending": True,
        "gpu_instances": [
            {
                "id": 2,
                "profile_id": 9,
                "start": 4,
                "memory_used": 5 * GiB,
                "compute_instances": [{"id": 0, "profile_id": 2, "start": 0, "uuid": "MIG-3g-0000"}],
            },
            {
                "id": 3,
                "profile_id": 14,
                "start": 0,
                "memory_used": 1 * GiB,
                "compute_instances": [
                    {"id": 0, "profile_id": 0, "start": 0, "uuid": "MIG-2g-c0"},
                    {"id": 1, "profile_id": 0, "start": 1, "uuid": "MIG-2g-c1"},
                ],
            },
        ],
    }
    mig.update(overrides.pop("mig", {}))
    return gpu("H100-80GB", 1, mig=mig, **overrides)


# ---- the ordinary node ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain() -> Tuple[Node, NodeSample]:
    """An A100 (MIG off) running two processes and a T4; one child process for several tests."""
    config = {
        "driver_version": "550.54.15",
        "cuda_driver_version": 12040,
        "devices": [
            gpu(
                "A100-SXM4-40GB",
                0,
                memory_used=7 * GiB,
                memory_reserved=600 * MiB,
                utilization_gpu=63,
                utilization_memory=21,
                power_mw=201_500,
                temperature=55,
                sm_clock=1395,
                memory_clock=1215,
                processes=[
                    {"pid": ME, "used_memory": 3 * GiB, "type": "cg"},
                    {"pid": 4_194_000, "used_memory": 1 * GiB},  # not in this PID namespace
                    {"pid": 4_194_001, "used_memory": 256 * MiB, "type": "g"},
                ],
            ),
            gpu("T4", 1, processes=[{"pid": ME, "used_memory": 2**64 - 1}]),  # NVML_VALUE_NOT_AVAILABLE
        ],
    }
    return _node_and_sample(config)


def test_inventory_identity(plain: Tuple[Node, NodeSample]) -> None:
    node, _ = plain
    assert node.backend == "nvml"
    assert node.hostname == socket.gethostname()
    assert node.driver_version == "550.54.15"
    assert node.cuda_driver_version == "12.4"
    a100, t4 = node.gpus
    assert a100.info.index == 0 and t4.info.index == 1
    assert a100.info.name == "NVIDIA A100-SXM4-40GB"
    assert a100.info.uuid == "GPU-fa4e0000-0000-4000-8000-000000000000"
    assert a100.info.pci_bus_id == "00000000:07:00.0"
    assert a100.info.pci_device_id == 0x20B010DE
    assert a100.info.memory_total_bytes == 40960 * MiB
    assert a100.info.mig_capable and a100.info.mig_model == "A100-SXM4-40GB"
    assert a100.info.architecture == "ampere"
    assert a100.info.multiprocessor_count == 108
    assert a100.info.power_limit_watts == 400.0
    assert a100.mig is not None and not a100.mig.current and not a100.mig.pending
    assert a100.mig.gpu_instances == ()
    # No MIG on a T4: GetMigMode is NOT_SUPPORTED, so no MIG state at all.
    assert t4.info.name == "Tesla T4" and t4.info.architecture == "turing"
    assert not t4.info.mig_capable and t4.info.mig_model is None and t4.mig is None
    # Inventory carries no readings.
    assert all(g.sample is None and g.processes == () for g in node.gpus)


def test_sample_readings(plain: Tuple[Node, NodeSample]) -> None:
    node, sample = plain
    assert sample.hostname == node.hostname
    g, s = _sample_gpu(sample, 0)
    assert g.info == node.gpus[0].info
    assert s.utilization_gpu_percent == 63.0 and s.utilization_memory_percent == 21.0
    assert s.memory_used_bytes == 7 * GiB  # nvmlMemory_v2: reserved memory is not "used"
    assert s.memory_total_bytes == 40960 * MiB
    assert s.power_watts == 201.5
    assert s.temperature_celsius == 55.0
    assert s.sm_clock_mhz == 1395 and s.memory_clock_mhz == 1215
    assert abs(s.timestamp - sample.timestamp) < 5
    assert _na_fields(s) == {}
    assert g.mig is not None and g.mig_samples == ()


def test_processes_with_users_from_proc(plain: Tuple[Node, NodeSample]) -> None:
    _, sample = plain
    g, _ = _sample_gpu(sample, 0)
    by_pid = {p.pid: p for p in g.processes}
    assert sorted(by_pid) == [ME, 4_194_000, 4_194_001]
    me = by_pid[ME]  # in both the compute and the graphics list: reported once
    assert me.used_memory_bytes == 3 * GiB
    assert me.user == pwd.getpwuid(os.getuid()).pw_name
    with open("/proc/self/cmdline", "rb") as f:
        own = f.read().replace(b"\0", b" ").decode().strip()
    assert me.command == own
    assert me.gpu_instance_id is None and me.compute_instance_id is None
    ghost = by_pid[4_194_000]
    if not os.path.exists("/proc/4194000"):
        assert ghost.user == "" and ghost.command == ""
    assert ghost.used_memory_bytes == 1 * GiB
    assert by_pid[4_194_001].used_memory_bytes == 256 * MiB  # graphics-only process
    (unknown,) = sample.gpus[1].processes
    assert unknown.pid == ME and unknown.used_memory_bytes == NotAvailable("NOT_SUPPORTED")


# ---- MIG ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mig() -> Tuple[Node, NodeSample]:
    config = {
        "devices": [
            gpu("A100-SXM4-40GB", 0),
            _mig_h100(
                processes=[
                    {"pid": ME, "used_memory": 2 * GiB, "gpu_instance_id": 2, "compute_instance_id": 0},
                ],
            ),
            gpu(
                "A100-SXM4-40GB",
                2,
                mig={
                    "current": True,
                    "pending": True,
                    "gpu_instances": [
                        {
                            "id": 13,
                            "profile_id": 19,
                            "start": 6,
                            "compute_instances": [{"id": 0, "profile_id": 0}],
                        },
                        {"id": 1, "profile_id": 5, "start": 0},  # a GI without compute instances
                    ],
                },
            ),
        ]
    }
    return _node_and_sample(config)


def test_mig_layout_in_inventory(mig: Tuple[Node, NodeSample]) -> None:
    node, _ = mig
    h100 = node.gpus[1]
    assert h100.info.mig_model == "H100-80GB" and h100.info.architecture == "hopper"
    assert h100.mig is not None and h100.mig.current and h100.mig.pending
    two_g, three_g = h100.mig.gpu_instances  # ordered by placement
    assert (two_g.id, two_g.profile_id, two_g.profile_name, two_g.start, two_g.size) == (
        3,
        14,
        "2g.20gb",
        0,
        2,
    )
    assert (three_g.id, three_g.profile_id, three_g.profile_name, three_g.start, three_g.size) == (
        2,
        9,
        "3g.40gb",
        4,
        4,
    )
    assert three_g.memory_total_bytes == 40448 * MiB and three_g.multiprocessor_count == 60
    assert three_g.compute_instances == (
        ComputeInstance(
            id=0, profile_id=2, name="3g.40gb", start=0, size=3, multiprocessor_count=60, uuid="MIG-3g-0000"
        ),
    )
    c0, c1 = two_g.compute_instances
    assert (c0.id, c0.profile_id, c0.name, c0.start, c0.size, c0.uuid) == (
        0,
        0,
        "1c.2g.20gb",
        0,
        1,
        "MIG-2g-c0",
    )
    assert (c1.id, c1.start, c1.uuid) == (1, 1, "MIG-2g-c1")
    assert c0.multiprocessor_count == 16
    a100 = node.gpus[2]
    assert a100.mig is not None
    names = [(gi.id, gi.profile_name, gi.start) for gi in a100.mig.gpu_instances]
    assert names == [(1, "4g.20gb", 0), (13, "1g.5gb", 6)]
    one_g = a100.mig.gpu_instances[1]
    assert one_g.compute_instances[0].name == "1g.5gb"
    assert one_g.compute_instances[0].uuid.startswith("MIG-")  # the fake made one up


def test_mig_sample_memory_from_mig_devices(mig: Tuple[Node, NodeSample]) -> None:
    _, sample = mig
    g, s = _sample_gpu(sample, 1)
    # Utilization rates are not supported on a MIG-enabled GPU; everything else is there.
    assert _na_fields(s) == {
        "utilization_gpu_percent": "NOT_SUPPORTED",
        "utilization_memory_percent": "NOT_SUPPORTED",
    }
    per_gi = {m.gpu_instance_id: m for m in g.mig_samples}
    assert per_gi[2].memory_used_bytes == 5 * GiB and per_gi[2].memory_total_bytes == 40448 * MiB
    assert per_gi[3].memory_used_bytes == 1 * GiB and per_gi[3].memory_total_bytes == 20096 * MiB
    (proc,) = g.processes
    assert (proc.pid, proc.gpu_instance_id, proc.compute_instance_id) == (ME, 2, 0)
    assert proc.used_memory_bytes == 2 * GiB
    # A GI without compute instances has no MIG device to ask: its memory in use is n/a.
    a100 = sample.gpus[2]
    no_ci = {m.gpu_instance_id: m for m in a100.mig_samples}[1]
    assert no_ci.memory_used_bytes == NotAvailable("NOT_FOUND")
    assert no_ci.memory_total_bytes == 19968 * MiB
    # The MIG-capable GPU with MIG off still reports utilization.
    _, s0 = _sample_gpu(sample, 0)
    assert s0.utilization_gpu_percent == 42.0


def test_mig_device_errors_stay_in_mig_samples() -> None:
    config = {"devices": [_mig_h100(mig_errors={"nvmlDeviceGetMemoryInfo_v2": "NO_PERMISSION"})]}
    _, sample = _node_and_sample(config)
    g, s = _sample_gpu(sample, 0)
    assert all(m.memory_used_bytes == NotAvailable("NO_PERMISSION") for m in g.mig_samples)
    assert len(g.mig_samples) == 2
    assert s.memory_used_bytes == 3 * GiB  # the parent GPU's memory is unaffected
    assert g.mig is not None and len(g.mig.gpu_instances) == 2


# ---- one failing field never takes down the rest --------------------------------------------


@pytest.mark.parametrize(
    ("function", "code", "fields"),
    [
        ("nvmlDeviceGetPowerUsage", "NOT_SUPPORTED", {"power_watts"}),
        ("nvmlDeviceGetTemperature", "GPU_IS_LOST", {"temperature_celsius"}),
        ("nvmlDeviceGetMemoryInfo_v2", "NO_PERMISSION", {"memory_used_bytes", "memory_total_bytes"}),
        (
            "nvmlDeviceGetUtilizationRates",
            "NOT_SUPPORTED",
            {"utilization_gpu_percent", "utilization_memory_percent"},
        ),
    ],
)
def test_injected_error_turns_one_reading_into_na(function: str, code: str, fields: set) -> None:
    config = {"devices": [gpu("A100-SXM4-40GB", 0, errors={function: code}), gpu("T4", 1)]}
    _, sample = _node_and_sample(config)
    g, s = _sample_gpu(sample, 0)
    assert _na_fields(s) == {name: code for name in fields}
    assert _na_fields(_sample_gpu(sample, 1)[1]) == {}
    assert g.info.uuid and g.mig is not None


def test_missing_function_is_function_not_found() -> None:
    config = {"devices": [gpu("A100-SXM4-40GB", 0)]}
    _, sample = _node_and_sample(config, missing=["nvmlDeviceGetPowerUsage"])
    _, s = _sample_gpu(sample, 0)
    assert _na_fields(s) == {"power_watts": "FUNCTION_NOT_FOUND"}


def test_old_driver_memory_info_falls_back_to_v1() -> None:
    config = {"devices": [gpu("A100-SXM4-40GB", 0, memory_used=2 * GiB, memory_reserved=512 * MiB)]}
    node, sample = _node_and_sample(config, missing=["nvmlDeviceGetMemoryInfo_v2"])
    _, s = _sample_gpu(sample, 0)
    assert _na_fields(s) == {}
    assert s.memory_used_bytes == 2 * GiB + 512 * MiB  # v1 counts reserved memory as used
    assert node.gpus[0].info.memory_total_bytes == 40960 * MiB
    _, sample = _node_and_sample(config, missing=["nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMemoryInfo"])
    _, s = _sample_gpu(sample, 0)
    assert _na_fields(s) == {
        "memory_used_bytes": "FUNCTION_NOT_FOUND",
        "memory_total_bytes": "FUNCTION_NOT_FOUND",
    }


def test_old_driver_without_mig_calls() -> None:
    """A driver that predates MIG: no GetMigMode symbol means no MIG state, not a failure."""
    config = {"devices": [gpu("A100-SXM4-40GB", 0)]}
    node, sample = _node_and_sample(
        config,
        missing=[
            "nvmlDeviceGetMigMode",
            "nvmlDeviceGetComputeRunningProcesses_v3",
            "nvmlDeviceGetAttributes_v2",
        ],
    )
    g = node.gpus[0]
    assert not g.info.mig_capable and g.mig is None
    assert g.info.multiprocessor_count == 108  # from the catalog when NVML cannot say
    _, s = _sample_gpu(sample, 0)
    assert _na_fields(s) == {}


def test_lost_gpu_still_appears() -> None:
    config = {"devices": [gpu("A100-SXM4-40GB", 0), gpu("A100-SXM4-40GB", 1, lost=True), gpu("T4", 2)]}
    node, sample = _node_and_sample(config)
    assert [g.info.index for g in node.gpus] == [0, 1, 2]
    lost = node.gpus[1]
    assert lost.info.memory_total_bytes == NotAvailable("GPU_IS_LOST")
    assert lost.info.uuid == "" and lost.mig is None
    g, s = _sample_gpu(sample, 1)
    assert set(_na_fields(s).values()) == {"GPU_IS_LOST"} and len(_na_fields(s)) == len(SAMPLE_FIELDS)
    assert g.processes == () and g.processes_error == "GPU_IS_LOST"
    for i in (0, 2):
        assert _na_fields(_sample_gpu(sample, i)[1]) == {}
        assert sample.gpus[i].info.uuid


def test_processes_from_mig_devices_when_the_gpu_will_not_list_them() -> None:
    denied = {
        "nvmlDeviceGetComputeRunningProcesses_v3": "NO_PERMISSION",
        "nvmlDeviceGetGraphicsRunningProcesses_v3": "NO_PERMISSION",
    }
    procs = [
        {"pid": ME, "used_memory": 2 * GiB, "gpu_instance_id": 2, "compute_instance_id": 0},
        {"pid": 4_194_002, "used_memory": GiB, "gpu_instance_id": 3, "compute_instance_id": 1},
    ]
    _, sample = _node_and_sample({"devices": [_mig_h100(errors=denied, processes=procs)]})
    g, _ = _sample_gpu(sample, 0)
    got = [(p.pid, p.gpu_instance_id, p.compute_instance_id, p.used_memory_bytes) for p in g.processes]
    assert sorted(got) == sorted([(ME, 2, 0, 2 * GiB), (4_194_002, 3, 1, GiB)])
    assert g.processes_error == ""


def test_a_process_list_nobody_will_give_is_unknown_not_empty() -> None:
    denied = {
        "nvmlDeviceGetComputeRunningProcesses_v3": "NO_PERMISSION",
        "nvmlDeviceGetGraphicsRunningProcesses_v3": "NO_PERMISSION",
    }
    procs = [{"pid": ME, "used_memory": GiB}]
    _, sample = _node_and_sample({"devices": [gpu("T4", 0, errors=denied, processes=procs)]})
    g, s = _sample_gpu(sample, 0)
    assert g.processes == () and g.processes_error == "NO_PERMISSION"
    assert _na_fields(s) == {}  # the rest of the sample survives


_FALL_OFF_THE_BUS = "result = pynvml.nvmlLib.fake_nvml_set_lost(0, 1)"


def test_gpu_lost_while_running_keeps_its_identity() -> None:
    config = {"devices": [_mig_h100(processes=[{"pid": ME, "used_memory": GiB}]), gpu("T4", 1)]}
    ops = [("sample",), ("script", _FALL_OFF_THE_BUS), ("sample",), ("set_mig_mode", 0, False)]
    out = run_backend(config, ops)[1:]
    before = out[0].decode(NodeSample).gpus[0]
    assert _ok(out[1]) == 0
    after = out[2].decode(NodeSample)
    g, s = _sample_gpu(after, 0)
    assert g.info == before.info and g.info.uuid  # identity read before it was lost
    assert _na_fields(s) == {name: "GPU_IS_LOST" for name in SAMPLE_FIELDS}
    assert g.mig is None and g.mig_samples == () and g.processes == ()
    assert _na_fields(_sample_gpu(after, 1)[1]) == {}
    assert _code(out[3]) == "GPU_IS_LOST"


def test_handle_error_and_system_errors() -> None:
    config = {
        "errors": {
            "nvmlSystemGetDriverVersion": "UNKNOWN",
            "nvmlSystemGetCudaDriverVersion": "NOT_SUPPORTED",
        },
        "devices": [gpu("T4", 0, errors={"nvmlDeviceGetHandleByIndex_v2": "NO_PERMISSION"}), gpu("T4", 1)],
    }
    node, sample = _node_and_sample(config)
    assert node.driver_version == "" and node.cuda_driver_version == ""
    assert node.gpus[0].info.memory_total_bytes == NotAvailable("NO_PERMISSION")
    assert set(_na_fields(_sample_gpu(sample, 0)[1]).values()) == {"NO_PERMISSION"}
    assert node.gpus[1].info.name == "Tesla T4"


# ---- starting the backend -------------------------------------------------------------------


def _init_error(outcomes: List[Outcome]) -> str:
    assert outcomes[0].op == "init" and outcomes[0].error is not None, outcomes
    assert outcomes[0].error["type"] == "BackendUnavailable"
    return outcomes[0].error["message"]


def test_missing_library_is_backend_unavailable() -> None:
    message = _init_error(run_backend({}, (), library="/nonexistent/libnvidia-ml.so.1"))
    assert message.startswith("NVML is unavailable: cannot load /nonexistent/libnvidia-ml.so.1")
    assert "\n" not in message


@pytest.mark.skipif(ctypes.util.find_library("nvidia-ml") is not None, reason="a real NVML is installed")
def test_no_driver_is_backend_unavailable() -> None:
    message = _init_error(run_backend({}, (), load="none"))
    assert message == "NVML is unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine?)"


def test_driver_not_loaded_is_backend_unavailable() -> None:
    message = _init_error(run_backend({"init_error": "DRIVER_NOT_LOADED"}, ()))
    assert "NVIDIA kernel driver is not loaded" in message


@pytest.mark.parametrize("load", ["env", "ld_library_path"])
def test_other_ways_to_find_the_library(load: str) -> None:
    init, inv = run_backend({"devices": [gpu("T4", 0)]}, (("inventory",),), load=load)
    assert init.error is None
    assert inv.decode(Node).gpus[0].info.name == "Tesla T4"


# ---- MIG control ----------------------------------------------------------------------------


def _ok(outcome: Outcome) -> Any:
    assert outcome.error is None, (outcome.op, outcome.error)
    return outcome.value


def _code(outcome: Outcome) -> str:
    assert outcome.error is not None, (outcome.op, outcome.value)
    return outcome.error["code"]


def test_create_and_destroy_instances() -> None:
    config = {"devices": [gpu("A100-SXM4-40GB", 0, mig={"current": True, "pending": True})]}
    ops = [
        ("create_gpu_instance", 0, 9),  # 3g.20gb, driver's choice: memory slice 4
        ("create_gpu_instance", 0, 14, 0),  # 2g.10gb at 0
        ("create_gpu_instance", 0, 19),  # 1g.5gb: 6 is taken by the 3g, 4 too... -> 2
        ("create_gpu_instance", 0, 9),  # no room for a second 3g
        ("create_gpu_instance", 0, 19, 5),  # overlaps the 3g
        ("create_gpu_instance", 0, 19, 7),  # not a placement of 1g.5gb
        ("create_gpu_instance", 0, 42),  # no such profile
        ("create_compute_instance", 0, 2, 0, 0),  # 1c.3g.20gb at compute slice 0 of GI 2 (3g at 4)
        ("create_compute_instance", 0, 2, 1),  # 2c.3g.20gb: placement 0 is taken by the 1c
        ("create_compute_instance", 0, 2, 0),  # 1c in the remaining slice
        ("destroy_gpu_instance", 0, 2),  # has compute instances -> IN_USE
        ("inventory",),
        ("destroy_compute_instance", 0, 2, 0),
        ("destroy_compute_instance", 0, 2, 1),
        ("destroy_gpu_instance", 0, 2),
        ("destroy_gpu_instance", 0, 2),  # already gone
        ("inventory",),
    ]
    out = run_backend(config, ops)[1:]
    three_g = out[0].decode(GpuInstance)
    assert (three_g.id, three_g.profile_name, three_g.start, three_g.size) == (2, "3g.20gb", 4, 4)
    assert three_g.memory_total_bytes == 19968 * MiB and three_g.multiprocessor_count == 42
    assert (_ok(out[1])["id"], _ok(out[1])["start"]) == (3, 0)
    assert (_ok(out[2])["profile_name"], _ok(out[2])["start"], _ok(out[2])["id"]) == ("1g.5gb", 2, 9)
    assert _code(out[3]) == "INSUFFICIENT_RESOURCES"
    assert "Insufficient Resources" in out[3].error["message"]  # type: ignore[index]
    assert _code(out[4]) == "INSUFFICIENT_RESOURCES"
    assert (
        _code(out[5]) == "INVALID_ARGUMENT" and "valid starts: 0, 1, 2, 3, 4, 5, 6" in out[5].error["message"]
    )  # type: ignore[index]
    assert _code(out[6]) == "INVALID_ARGUMENT" and "3g.20gb (9)" in out[6].error["message"]  # type: ignore[index]
    ci = out[7].decode(ComputeInstance)
    assert (ci.id, ci.profile_id, ci.name, ci.start, ci.size) == (0, 0, "1c.3g.20gb", 0, 1)
    assert ci.uuid.startswith("MIG-") and ci.multiprocessor_count == 14
    assert _code(out[8]) == "INSUFFICIENT_RESOURCES"
    assert out[9].decode(ComputeInstance).start == 1
    assert _code(out[10]) == "IN_USE" and "stop the processes" in out[10].error["message"]  # type: ignore[index]
    node = out[11].decode(Node)
    assert node.gpus[0].mig is not None
    assert [(gi.id, len(gi.compute_instances)) for gi in node.gpus[0].mig.gpu_instances] == [
        (3, 0),
        (9, 0),
        (2, 2),
    ]
    assert [_ok(o) for o in out[12:15]] == [None, None, None]
    assert _code(out[15]) == "NOT_FOUND"
    node = out[16].decode(Node)
    assert node.gpus[0].mig is not None
    assert [gi.profile_name for gi in node.gpus[0].mig.gpu_instances] == ["2g.10gb", "1g.5gb"]


def test_mig_control_refuses_busy_instances() -> None:
    config = {
        "devices": [
            _mig_h100(
                processes=[{"pid": ME, "used_memory": GiB, "gpu_instance_id": 3, "compute_instance_id": 1}]
            )
        ]
    }
    ops = [
        ("destroy_compute_instance", 0, 3, 1),  # a process runs there
        ("destroy_compute_instance", 0, 3, 0),
        ("destroy_gpu_instance", 0, 3),  # still has CI 1 and the process
        ("set_mig_mode", 0, False),  # processes and instances
    ]
    out = run_backend(config, ops)[1:]
    assert _code(out[0]) == "IN_USE"
    assert _ok(out[1]) is None
    assert _code(out[2]) == "IN_USE"
    assert _code(out[3]) == "IN_USE"


def test_mig_mode_changes() -> None:
    config = {"devices": [gpu("A100-SXM4-40GB", 0), gpu("H100-80GB", 1), gpu("T4", 2)]}
    ops = [
        ("set_mig_mode", 0, True),  # Ampere: pending until a GPU reset
        ("set_mig_mode", 1, True),  # Hopper: at once
        ("set_mig_mode", 2, True),  # no MIG on a T4
        ("reset_gpu", 0),
        ("set_mig_mode", 7, True),
        ("inventory",),
    ]
    out = run_backend(config, ops)[1:]
    ampere = out[0].decode(MigModeChange)
    assert (ampere.current, ampere.pending, ampere.reset_required) == (False, True, True)
    hopper = out[1].decode(MigModeChange)
    assert (hopper.current, hopper.pending, hopper.reset_required) == (True, True, False)
    assert _code(out[2]) == "NOT_SUPPORTED"
    assert _code(out[3]) == "NOT_SUPPORTED" and "nvidia-smi -r -i 00000000:07:00.0" in out[3].error["message"]  # type: ignore[index]
    assert _code(out[4]) == "INVALID_ARGUMENT"
    node = out[5].decode(Node)
    assert node.gpus[0].mig is not None and (node.gpus[0].mig.current, node.gpus[0].mig.pending) == (
        False,
        True,
    )
    assert node.gpus[1].mig is not None and node.gpus[1].mig.current


def test_sample_follows_mig_changes() -> None:
    config = {"devices": [gpu("H100-80GB", 0, mig={"current": True, "pending": True})]}
    ops = [("sample",), ("create_gpu_instance", 0, 19, 3), ("create_compute_instance", 0, 10, 0), ("sample",)]
    out = run_backend(config, ops)[1:]
    before = out[0].decode(NodeSample).gpus[0]
    assert before.mig is not None and before.mig.gpu_instances == () and before.mig_samples == ()
    after = out[3].decode(NodeSample).gpus[0]
    assert after.mig is not None
    (gi,) = after.mig.gpu_instances
    assert (gi.id, gi.profile_name, gi.start) == (10, "1g.10gb", 3)
    assert gi.compute_instances[0].uuid.startswith("MIG-")
    (m,) = after.mig_samples
    assert (m.gpu_instance_id, m.memory_used_bytes, m.memory_total_bytes) == (10, 0, 9984 * MiB)


# ---- the fake itself, through pynvml ----------------------------------------------------------

_RAW = """
import ctypes
h = pynvml.nvmlDeviceGetHandleByIndex(0)
fn = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetComputeRunningProcesses_v3")
count = ctypes.c_uint(1)
first = fn(h, ctypes.byref(count), (pynvml.c_nvmlProcessInfo_v3_t * 1)())
needed = count.value
bad = pynvml.c_nvmlMemory_v2_t()
bad.version = 1
mismatch = pynvml._nvmlGetFunctionPointer("nvmlDeviceGetMemoryInfo_v2")(h, ctypes.byref(bad))
pynvml.nvmlShutdown()
try:
    pynvml.nvmlDeviceGetCount()
    after = 0
except pynvml.NVMLError as exc:
    after = exc.value
pynvml.nvmlInit()
result = [first, needed, mismatch, after, pynvml.nvmlDeviceGetCount()]
"""


def test_fake_follows_nvml_protocols() -> None:
    procs = [{"pid": 100 + i, "used_memory": MiB} for i in range(3)]
    _, raw = run_backend({"devices": [gpu("T4", 0, processes=procs)]}, [("script", _RAW)])
    # INSUFFICIENT_SIZE with the needed count; version mismatch; UNINITIALIZED after shutdown.
    assert _ok(raw) == [7, 3, 25, 1, 1]
