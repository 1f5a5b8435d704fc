"""Build and drive the fake ``libamd_smi.so`` (``tests/fakes/fake_amdsmi/fake_amdsmi.c``).

The real ``amdsmi`` package binds every function of libamd_smi.so when it is imported (ctypes
attribute look-ups), so the fake must export all of them: the ones gpuops' AMD backend calls are
written in C as amdsmi.h documents them; every other name the installed binding binds is an
alias of ``fake_not_supported`` (AMDSMI_STATUS_NOT_SUPPORTED, what the library answers for a
feature the GPU lacks), generated here from the binding's own list. The library is installed as
``<dir>/lib/libamd_smi.so`` (and as ``librocm-core.so``, for ``getROCmVersion``); the binding
finds both through ``$ROCM_PATH``, its first place to look. The node is described by
``$FAKE_AMDSMI_CONFIG`` (format: ``fake_amdsmi/README.md``).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping

HERE = Path(__file__).resolve().parent
PLUGIN = HERE.parents[1] / "plugins" / "gpuops-backend-amd"
SOURCE = HERE / "fake_amdsmi" / "fake_amdsmi.c"
BUILD_DIR = Path(os.environ.get("FAKE_NVML_BUILD_DIR", str(HERE / "build")))
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden", "-shared"]

GiB = 1 << 30
MiB = 1 << 20

# The functions fake_amdsmi.c implements (every other one answers NOT_SUPPORTED).
IMPLEMENTED = (
    "amdsmi_init",
    "amdsmi_shut_down",
    "amdsmi_get_socket_handles",
    "amdsmi_get_processor_handles",
    "amdsmi_get_gpu_device_bdf",
    "amdsmi_get_gpu_device_uuid",
    "amdsmi_get_gpu_asic_info",
    "amdsmi_get_gpu_driver_info",
    "amdsmi_get_gpu_memory_total",
    "amdsmi_get_gpu_memory_usage",
    "amdsmi_get_gpu_activity",
    "amdsmi_get_power_info",
    "amdsmi_get_temp_metric",
    "amdsmi_get_clock_info",
    "amdsmi_get_gpu_process_list",
    "amdsmi_get_gpu_compute_partition",
    "amdsmi_set_gpu_compute_partition",
    "amdsmi_get_gpu_memory_partition",
    "amdsmi_set_gpu_memory_partition",
)

MI300X: Dict[str, Any] = {
    "market_name": "AMD Instinct MI300X",
    "device_id": 0x74A1,
    "rev_id": 0,
    "compute_units": 304,
    "gfx_version": 0x942,
    "vram_total": 196592 * MiB,
    "compute_partition": "SPX",
    "memory_partition": "NPS1",
    "compute_modes": "SPX DPX QPX CPX",
    "memory_modes": "NPS1 NPS4",
}


def gpu(index: int = 0, **overrides: Any) -> Dict[str, Any]:
    """An MI300X with plausible readings, then `overrides` (``procs``: [(pid, vram, name)],
    ``fail``: {function: status name})."""
    dev: Dict[str, Any] = dict(MI300X)
    dev.update(
        {
            "serial": "0x%016X" % (0x5EC0_0000_0000_0000 + index),
            "uuid": f"{0x9EFF74A1:08x}-0000-1000-80e9-{0xB17E00 + index:012x}",
            "bdf": "0000:%02x:00.0" % (0x0C + 0x10 * index),
            "vram_used": 6 * GiB,
            "activity": (37, 12, 0),
            "power": 312,
            "temperature": (-1, 54),  # MI300X has no edge sensor
            "clocks": (2100, 1300),
            "procs": [],
            "fail": {},
        }
    )
    dev.update(overrides)
    return dev


def install_plugin(work: Path) -> Path:
    """plugins/gpuops-backend-amd installed by pip into `work`/site, as an operator would (its
    entry point in a dist-info); returns the directory to put on PYTHONPATH."""
    source = work / "src"
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = work / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            str(source),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError("pip could not install the AMD plugin:\n" + done.stdout + done.stderr)
    entry_points = "".join(
        p.read_text() for p in target.glob("gpuops_backend_amd-*.dist-info/entry_points.txt")
    )
    if "amd = gpuops_backend_amd:AmdSmiBackend" not in entry_points:
        raise RuntimeError("the installed AMD plugin has no gpuops.backends entry point")
    return target


def binding_symbols() -> List[str]:
    """The library functions the installed amdsmi binding binds at import."""
    spec = importlib.util.find_spec("amdsmi")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the amdsmi package is not installed")
    wrapper = Path(next(iter(spec.submodule_search_locations))) / "amdsmi_wrapper.py"
    names = re.findall(r"_libraries\['libamd_smi\.so'\]\.(\w+)", wrapper.read_text())
    return sorted(set(names))


def build_library() -> Path:
    """The fake installed as a ROCm tree (``<dir>/lib/libamd_smi.so``); returns <dir> for
    $ROCM_PATH. Built once per source and binding version."""
    symbols = binding_symbols()
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(symbols).encode()).hexdigest()[:16]
    root = BUILD_DIR / ("amdsmi-" + digest)
    lib = root / "lib" / "libamd_smi.so"
    if lib.exists():
        return root
    work = BUILD_DIR / f"amdsmi-{digest}.tmp{os.getpid()}"
    (work / "lib").mkdir(parents=True, exist_ok=True)
    aliases = [
        f'uint32_t {name}(void) __attribute__((alias("fake_not_supported"), visibility("default")));'
        for name in symbols
        if name not in IMPLEMENTED
    ]
    unit = work / "fake_amdsmi_all.c"
    unit.write_text('#include "{}"\n\n{}\n'.format(SOURCE, "\n".join(aliases)))
    done = subprocess.run(
        ["gcc", *CFLAGS, "-o", str(work / "lib" / "libamd_smi.so"), str(unit)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError("building the fake libamd_smi.so failed:\n" + done.stderr)
    shutil.copyfile(work / "lib" / "libamd_smi.so", work / "lib" / "librocm-core.so")
    try:
        work.rename(root)
    except OSError:  # another process built it first
        shutil.rmtree(work, ignore_errors=True)
    return root


def config_lines(node: Mapping[str, Any]) -> List[str]:
    lines = [
        "driver_version {}".format(node.get("driver_version", "6.10.5")),
        "rocm_version {}".format(node.get("rocm", "7.0.2")),
    ]
    if node.get("init_status"):
        lines.append("init_status {}".format(node["init_status"]))
    for index, dev in enumerate(node.get("gpus", ())):
        for key, value in dev.items():
            if key == "procs":
                lines += [f"{index}.proc {pid} {vram} {name}" for pid, vram, name in value]
            elif key == "fail":
                lines += [f"{index}.fail {fn} {status}" for fn, status in value.items()]
            elif isinstance(value, tuple):
                lines.append(f"{index}.{key} " + " ".join(str(v) for v in value))
            else:
                lines.append(f"{index}.{key} {value}")
    return lines


def environment(node: Mapping[str, Any], directory: Path) -> Dict[str, str]:
    """The environment a process needs to run the real amdsmi over the fake, for `node`."""
    config = directory / "fake_amdsmi.conf"
    # Bytes that are not UTF-8 (what a driver or a process may put in a name) are given as
    # surrogate escapes ("\udcff" for the byte 0xFF) and written as those bytes.
    config.write_bytes(("\n".join(config_lines(node)) + "\n").encode("utf-8", "surrogateescape"))
    state = directory / "fake_amdsmi.state"  # the modes set since: a new node starts with none
    state.unlink(missing_ok=True)
    env = dict(os.environ)
    env["ROCM_PATH"] = str(build_library())
    env.pop("ROCM_HOME", None)  # the binding prefers it to ROCM_PATH
    env["FAKE_AMDSMI_CONFIG"] = str(config)
    env["FAKE_AMDSMI_STATE"] = str(state)
    return env
