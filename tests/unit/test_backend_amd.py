"""The AMD backend plugin (plugins/gpuops-backend-amd), installed for real by pip, running AMD's
real `amdsmi` binding over the fake libamd_smi.so (tests/fakes/fake_amdsmi): discover through a
local agent, live samples, processes, unsupported figures, partition changes."""

from __future__ import annotations

import ctypes
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fakes"))
import amdsmi_fake as fake

ROOT = Path(__file__).resolve().parents[2]
PLUGIN = ROOT / "plugins" / "gpuops-backend-amd"

if shutil.which("gcc") is None:  # pragma: no cover
    pytest.skip("needs gcc to build the fake libamd_smi.so", allow_module_level=True)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The plugin installed by pip, as an operator would (its entry point in a dist-info)."""
    return fake.install_plugin(tmp_path_factory.mktemp("amd-plugin"))


def _env(node: dict[str, Any], tmp_path: Path, site: Path) -> dict[str, str]:
    env = fake.environment(node, tmp_path)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(ROOT)])
    return env


def discover(
    node: dict[str, Any], tmp_path: Path, site: Path, *args: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", "discover", "--local", "--backend", "amd", *args],
        env=_env(node, tmp_path, site),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_fake_structures_are_the_bindings(tmp_path: Path) -> None:
    """The C structures have the sizes of the binding's ctypes ones (the ABI amdsmi speaks)."""
    env = fake.environment({"gpus": [fake.gpu()]}, tmp_path)
    code = textwrap.dedent(
        """
        import ctypes, json, os
        from amdsmi import amdsmi_wrapper as w
        lib = ctypes.CDLL(os.path.join(os.environ["ROCM_PATH"], "lib", "libamd_smi.so"))
        lib.fake_amdsmi_sizeof.restype = ctypes.c_size_t
        pairs = {"asic_info": w.amdsmi_asic_info_t, "driver_info": w.amdsmi_driver_info_t,
                 "power_info": w.amdsmi_power_info_t, "clk_info": w.amdsmi_clk_info_t,
                 "engine_usage": w.amdsmi_engine_usage_t, "proc_info": w.amdsmi_proc_info_t}
        sizes = {k: [lib.fake_amdsmi_sizeof(k.encode()), ctypes.sizeof(t)] for k, t in pairs.items()}
        print(json.dumps(sizes))
        """
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for name, (ours, theirs) in json.loads(done.stdout).items():
        assert ours == theirs, name


def test_discover_local_reads_the_node_through_amdsmi(installed: Path, tmp_path: Path) -> None:
    node = {
        "driver_version": "6.10.5",
        "rocm": "7.0.2",
        "gpus": [
            fake.gpu(0, procs=[(os.getpid(), 3 * fake.GiB, "python3")]),
            fake.gpu(1, compute_partition="CPX", memory_partition="NPS4", activity=(88, 40, 0), power=640),
        ],
    }
    done = discover(node, tmp_path, installed, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["backend"] == "amd"
    assert doc["driver_version"] == "6.10.5"
    assert doc["cuda_driver_version"] == "7.0.2"  # the ROCm release
    g0, g1 = doc["gpus"]
    assert g0["info"]["name"] == "AMD Instinct MI300X"
    assert g0["info"]["uuid"] == "9eff74a1-0000-1000-80e9-000000b17e00"
    assert g0["info"]["pci_bus_id"] == "0000:0c:00.0"
    assert g0["info"]["pci_device_id"] == 0x74A11002
    assert g0["info"]["memory_total_bytes"] == 196592 * fake.MiB
    assert g0["info"]["architecture"] == "cdna3"
    assert g0["info"]["multiprocessor_count"] == 304
    assert g0["sample"]["utilization_gpu_percent"] == 37.0
    assert g0["sample"]["utilization_memory_percent"] == 12.0
    assert g0["sample"]["memory_used_bytes"] == 6 * fake.GiB
    assert g0["sample"]["power_watts"] == 312.0
    assert g0["sample"]["temperature_celsius"] == 54.0
    assert (g0["sample"]["sm_clock_mhz"], g0["sample"]["memory_clock_mhz"]) == (2100, 1300)
    (proc,) = g0["processes"]
    assert proc["pid"] == os.getpid()
    assert proc["used_memory_bytes"] == 3 * fake.GiB
    assert proc["command"] and proc["user"]  # from /proc: this test's own process
    assert g0["partition"]["compute_mode"] == "SPX" and g0["partition"]["partitions"] == 1
    assert g1["partition"] == {
        "compute_mode": "CPX",
        "memory_mode": "NPS4",
        "compute_modes": ["SPX", "DPX", "QPX", "CPX"],
        "memory_modes": ["NPS1", "NPS4"],
        "partitions": 8,
    }
    assert (g1["sample"]["utilization_gpu_percent"], g1["sample"]["power_watts"]) == (88.0, 640.0)


def test_the_table_shows_partitions_and_rocm(installed: Path, tmp_path: Path) -> None:
    node = {"gpus": [fake.gpu(0, compute_partition="QPX", memory_partition="NPS4")]}
    done = discover(node, tmp_path, installed)
    assert done.returncode == 0, done.stderr
    assert "backend amd" in done.stdout and "ROCm 7.0.2" in done.stdout
    assert "partition QPX (4) / NPS4" in done.stdout


def test_unsupported_figures_carry_amdsmis_status(installed: Path, tmp_path: Path) -> None:
    node = {
        "gpus": [
            fake.gpu(
                0,
                fail={"amdsmi_get_power_info": "NOT_SUPPORTED", "amdsmi_get_gpu_process_list": "NO_PERM"},
                compute_partition="",  # an MI210: no partitions
                memory_partition="",
            )
        ]
    }
    done = discover(node, tmp_path, installed, "--json")
    assert done.returncode == 0, done.stderr
    (g,) = json.loads(done.stdout)["gpus"]
    assert g["sample"]["power_watts"] == {"na": "NOT_SUPPORTED"}
    assert g["sample"]["temperature_celsius"] == 54.0  # the other figures are still there
    assert g["processes"] == [] and g["processes_error"] == "NO_PERM"
    assert "partition" not in g


def test_no_driver_is_one_line_with_the_status(installed: Path, tmp_path: Path) -> None:
    done = discover({"init_status": "DRIVER_NOT_LOADED", "gpus": [fake.gpu()]}, tmp_path, installed)
    assert done.returncode != 0
    assert "amdsmi_init failed: DRIVER_NOT_LOADED" in done.stderr
    assert "Traceback" not in done.stderr


# ---- partition changes, through the backend in a process of its own -------------------------


def change(
    node: dict[str, Any], tmp_path: Path, site: Path, compute: str | None, memory: str | None
) -> dict[str, Any]:
    """Build the backend over `node`, change GPU 0's partitions, report the outcome and the
    modes the library reads afterwards (from a fresh handle list)."""
    code = textwrap.dedent(
        f"""
        import json
        from gpuops.node.backends.registry import create_backend
        from gpuops.node.backends.base import BackendError
        b = create_backend("amd")
        out = {{}}
        try:
            state = b.set_partition(0, {compute!r}, {memory!r})
            out["ok"] = [state.compute_mode, state.memory_mode, state.partitions]
        except BackendError as exc:
            out["error"] = [exc.code, exc.message]
        p = b.inventory().gpus[0].partition
        out["now"] = [p.compute_mode, p.memory_mode]
        print(json.dumps(out))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=_env(node, tmp_path, site),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_partition_change_on_an_idle_gpu(installed: Path, tmp_path: Path) -> None:
    out = change({"gpus": [fake.gpu()]}, tmp_path, installed, "CPX", "NPS4")
    assert out == {"ok": ["CPX", "NPS4", 8], "now": ["CPX", "NPS4"]}


def test_partition_change_is_refused_while_processes_run(installed: Path, tmp_path: Path) -> None:
    node = {"gpus": [fake.gpu(procs=[(os.getpid(), fake.GiB, "trainer")])]}
    out = change(node, tmp_path, installed, "CPX", None)
    code, message = out["error"]
    assert code == "IN_USE"
    assert f"pid {os.getpid()}" in message and "needs it idle" in message
    assert out["now"] == ["SPX", "NPS1"]


def test_a_failed_step_rolls_back_what_was_changed(installed: Path, tmp_path: Path) -> None:
    # The memory mode changes first; the compute mode then fails as a driver restart would.
    node = {"gpus": [fake.gpu(fail={"amdsmi_set_gpu_compute_partition": "AMDGPU_RESTART_ERR"})]}
    out = change(node, tmp_path, installed, "CPX", "NPS4")
    code, message = out["error"]
    assert code == "UNKNOWN"
    assert "AMDSMI_STATUS_AMDGPU_RESTART_ERR" in message and "back in its old modes" in message
    assert out["now"] == ["SPX", "NPS1"]


def test_a_mode_the_gpu_does_not_take_is_refused_before_any_change(installed: Path, tmp_path: Path) -> None:
    out = change({"gpus": [fake.gpu()]}, tmp_path, installed, "TPX", None)
    assert out["error"][0] == "INVALID_ARGUMENT" and "SPX/DPX/QPX/CPX" in out["error"][1]
    assert out["now"] == ["SPX", "NPS1"]


def test_functions_the_fake_leaves_out_answer_not_supported() -> None:
    """Every function the binding binds exists in the fake; those gpuops does not call answer
    AMDSMI_STATUS_NOT_SUPPORTED (2), as the library does for a feature the GPU lacks."""
    lib = ctypes.CDLL(str(fake.build_library() / "lib" / "libamd_smi.so"))
    for name in fake.binding_symbols():
        assert hasattr(lib, name), name
    assert lib.amdsmi_get_gpu_vram_usage(None, None) == 2
