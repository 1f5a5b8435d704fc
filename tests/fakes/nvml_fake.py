"""Build and drive the fake ``libnvidia-ml.so.1`` (``tests/fakes/fake_nvml/fake_nvml.c``).

The fake is compiled with gcc into ``tests/fakes/build/`` (gitignored), once per source version:
one object file, then one shared library per set of *missing* functions (a linker version script
hides them, so ``dlsym`` fails and pynvml raises FUNCTION_NOT_FOUND as it would on an old driver).

A test describes the node as a dict (see ``README.md`` in ``fake_nvml/`` and :func:`gpu`);
:func:`write_config` turns it into the line format the C library reads at ``nvmlInit`` from
``$FAKE_NVML_CONFIG``. pynvml and the loaded library are process-global, so every scenario runs
in a fresh Python process (:func:`run_backend`): it builds ``NvmlBackend``, calls the listed
methods and prints their results as codec JSON, which :class:`Outcome` decodes back into model
objects.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from gpuops.core.mig.catalog import MODELS, MigModel

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
SOURCE = HERE / "fake_nvml" / "fake_nvml.c"
BUILD_DIR = Path(os.environ.get("FAKE_NVML_BUILD_DIR", str(HERE / "build")))
SONAME = "libnvidia-ml.so.1"
CFLAGS = ["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-fvisibility=hidden"]

GiB = 1 << 30
MiB = 1 << 20
NO_ID = 0xFFFFFFFF  # NVML's gpuInstanceId/computeInstanceId for a process not on a MIG device

# NVML return codes by name (nvml.h), for error injection.
CODES: Dict[str, int] = {
    "UNINITIALIZED": 1,
    "INVALID_ARGUMENT": 2,
    "NOT_SUPPORTED": 3,
    "NO_PERMISSION": 4,
    "NOT_FOUND": 6,
    "INSUFFICIENT_SIZE": 7,
    "DRIVER_NOT_LOADED": 9,
    "TIMEOUT": 10,
    "FUNCTION_NOT_FOUND": 13,
    "GPU_IS_LOST": 15,
    "RESET_REQUIRED": 16,
    "IN_USE": 19,
    "INSUFFICIENT_RESOURCES": 23,
    "ARGUMENT_VERSION_MISMATCH": 25,
    "UNKNOWN": 999,
}

# nvmlEventType* by the names tests use.
EVENT_TYPES: Dict[str, int] = {
    "ecc_single_bit": 0x1,
    "ecc_double_bit": 0x2,
    "pstate": 0x4,
    "xid": 0x8,
    "clock": 0x10,
}

# Device presets: what NVML reports for a few real boards.
PRESETS: Dict[str, Dict[str, Any]] = {
    "A100-SXM4-40GB": {
        "name": "NVIDIA A100-SXM4-40GB",
        "pci_device_id": 0x20B010DE,
        "pci_subsystem_id": 0x134F10DE,
        "memory_total": 40960 * MiB,
        "sm_count": 108,
        "architecture": 7,
        "power_limit_mw": 400_000,
        "mig_model": "A100-SXM4-40GB",
        "mig_needs_reset": True,  # Ampere: the mode stays pending until a GPU reset
    },
    "H100-80GB": {
        "name": "NVIDIA H100 80GB HBM3",
        "pci_device_id": 0x233010DE,
        "pci_subsystem_id": 0x16C110DE,
        "memory_total": 81559 * MiB,
        "sm_count": 132,
        "architecture": 9,
        "power_limit_mw": 700_000,
        "mig_model": "H100-80GB",
        "mig_needs_reset": False,  # Hopper: no reset needed
    },
    "A30-24GB": {
        "name": "NVIDIA A30",
        "pci_device_id": 0x20B710DE,
        "pci_subsystem_id": 0x153210DE,
        "memory_total": 24576 * MiB,
        "sm_count": 56,
        "architecture": 7,
        "power_limit_mw": 165_000,
        "mig_model": "A30-24GB",
        "mig_needs_reset": True,
    },
    "T4": {
        "name": "Tesla T4",
        "pci_device_id": 0x1EB810DE,
        "pci_subsystem_id": 0x12A210DE,
        "memory_total": 15360 * MiB,
        "sm_count": 40,
        "architecture": 6,
        "power_limit_mw": 70_000,
        "mig_model": None,
    },
}


def gpu(model: str = "A100-SXM4-40GB", index: int = 0, **overrides: Any) -> Dict[str, Any]:
    """A device dict for the fake: a preset board plus plausible readings, then `overrides`.

    MIG-capable presets get ``"mig": {"current": False, "pending": False}`` unless overridden;
    pass ``mig={"current": True, "pending": True, "gpu_instances": [...]}`` for a MIG layout.
    """
    preset = dict(PRESETS[model])
    dev: Dict[str, Any] = {
        "name": preset["name"],
        "uuid": f"GPU-{0xFA4E0000 + index:08x}-0000-4000-8000-{index:012x}",
        "pci_bus_id": f"00000000:{0x07 + 0x10 * index:02X}:00.0",
        "pci_device_id": preset["pci_device_id"],
        "pci_subsystem_id": preset["pci_subsystem_id"],
        "memory_total": preset["memory_total"],
        "memory_used": 3 * GiB,
        "memory_reserved": 512 * MiB,
        "utilization_gpu": 42,
        "utilization_memory": 17,
        "power_mw": 123_456,
        "power_limit_mw": preset["power_limit_mw"],
        "temperature": 47,
        "sm_clock": 1410,
        "memory_clock": 1215,
        "sm_count": preset["sm_count"],
        "architecture": preset["architecture"],
        "processes": [],
        "errors": {},
    }
    if preset["mig_model"]:
        dev["mig_model"] = preset["mig_model"]
        dev["mig"] = {"current": False, "pending": False, "needs_reset": preset["mig_needs_reset"]}
    dev.update(overrides)
    return dev


# --------------------------------------------------------------------------------------------
# Building


def _source_digest() -> str:
    h = hashlib.sha256(SOURCE.read_bytes())
    h.update(" ".join(CFLAGS).encode())
    return h.hexdigest()[:16]


def _atomic_build(target: Path, argv: List[str]) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    proc = subprocess.run([*argv, "-o", str(tmp)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"building the fake NVML failed:\n{proc.stdout}{proc.stderr}")
    os.replace(tmp, target)


def build_library(missing: Iterable[str] = ()) -> Path:
    """Path of a built fake ``libnvidia-ml.so.1`` without the functions in `missing`.

    Cached in BUILD_DIR by source digest (and by the missing set); safe to call from parallel
    test processes (each build goes to a temporary file that is renamed into place).
    """
    cc = os.environ.get("CC", "gcc")
    digest = _source_digest()
    base = BUILD_DIR / digest
    obj = base / "fake_nvml.o"
    if not obj.exists():
        _atomic_build(obj, [cc, *CFLAGS, "-c", str(SOURCE)])
        for old in BUILD_DIR.iterdir():  # builds of earlier versions of the source
            if old.is_dir() and old.name != digest and len(old.name) == len(digest):
                shutil.rmtree(old, ignore_errors=True)
    hidden = sorted(set(missing))
    variant = (
        "full" if not hidden else "without-" + hashlib.sha256("\n".join(hidden).encode()).hexdigest()[:12]
    )
    lib = base / variant / SONAME
    if lib.exists():
        return lib
    argv = [cc, "-shared", "-pthread", "-Wl,-soname," + SONAME, str(obj)]
    if hidden:
        script = base / variant / "hide.map"
        script.parent.mkdir(parents=True, exist_ok=True)
        # Exact names take precedence over the wildcard: these become local, everything else
        # stays exported (the object was built with -fvisibility=hidden and explicit exports).
        names = "".join(f"    {n};\n" for n in hidden)
        script.write_text("{\n  global: *;\n  local:\n" + names + "};\n")
        argv.append("-Wl,--version-script=" + str(script))
    _atomic_build(lib, argv)
    return lib


# --------------------------------------------------------------------------------------------
# The configuration file


def _code(value: Any) -> int:
    if isinstance(value, str):
        return CODES[value]
    return int(value)


def _csv(values: Sequence[int]) -> str:
    return ",".join(str(v) for v in values) if values else "-"


def _profile_lines(model: MigModel) -> List[str]:
    lines: List[str] = []
    for p in model.profiles:
        e = p.engines
        # Driver order first; any placement it leaves out is still a valid start.
        starts = list(p.driver_order) + [s for s in p.placements if s not in p.driver_order]
        fields = (
            p.enum,
            p.id,
            p.compute_slices,
            p.memory_slices,
            p.max_count,
            p.multiprocessor_count,
            e.copy_engines,
            e.decoders,
            0,  # encoders: none on A100/H100/A30
            e.jpeg,
            e.ofa,
            p.memory_mib,
        )
        lines.append(f"gip {' '.join(str(f) for f in fields)} {_csv(starts)} MIG {p.name}")
        for cp in p.compute_profiles:
            lines.append(
                f"cip {cp.id} {cp.slices} {cp.max_count} {cp.multiprocessor_count} {_csv(cp.placements)}"
            )
    return lines


def config_lines(config: Mapping[str, Any]) -> List[str]:
    """The fake's line format for a node dict (see README.md)."""
    out = [
        f"driver_version {config.get('driver_version', '550.54.15')}",
        f"cuda_driver_version {int(config.get('cuda_driver_version', 12040))}",
        f"nvml_version {config.get('nvml_version', '12.550.54.15')}",
    ]
    if config.get("init_error"):
        out.append(f"init_error {_code(config['init_error'])}")
    for fn, code in config.get("errors", {}).items():
        out.append(f"error {fn} {_code(code)}")
    for dev in config.get("devices", ()):
        out += [
            "device",
            f"name {dev['name']}",
            f"uuid {dev['uuid']}",
            f"bus_id {dev['pci_bus_id']}",
            f"pci 0x{dev['pci_device_id']:08X} 0x{dev.get('pci_subsystem_id', 0):08X}",
            f"memory {dev['memory_total']} {dev.get('memory_used', 0)} {dev.get('memory_reserved', 0)}",
            f"utilization {dev.get('utilization_gpu', 0)} {dev.get('utilization_memory', 0)}",
            f"power {dev.get('power_mw', 0)} {dev.get('power_limit_mw', 0)}",
            f"temperature {dev.get('temperature', 0)}",
            f"clocks {dev.get('sm_clock', 0)} {dev.get('memory_clock', 0)}",
            f"architecture {dev.get('architecture', 0)}",
        ]
        if dev.get("sm_count") is not None:
            out.append(f"sm_count {dev['sm_count']}")
        if dev.get("lost"):
            out.append("lost 1")
        # GPM: Hopper and newer, unless the dict says otherwise.
        out.append(f"gpm {int(dev.get('gpm', dev.get('architecture', 0) >= 9))}")
        if dev.get("events_supported") is not None:
            out.append(f"events_supported 0x{dev['events_supported']:X}")
        for ev in dev.get("events", ()):
            gi_id = ev.get("gpu_instance_id")
            ci_id = ev.get("compute_instance_id")
            kind = EVENT_TYPES.get(ev["type"], ev["type"])
            out.append(
                f"event {int(ev['after_ms'])} {kind} {int(ev.get('data', 0))} "
                f"{NO_ID if gi_id is None else gi_id} {NO_ID if ci_id is None else ci_id}"
            )
        mig = dev.get("mig")
        if mig is not None:
            model = MODELS[dev["mig_model"]]
            current = bool(mig.get("current"))
            pending = bool(mig.get("pending", current))
            needs_reset = bool(mig.get("needs_reset", False))
            max_devices = mig.get("max_devices", model.compute_slice_count)
            out.append(
                f"mig {current:d} {pending:d} {needs_reset:d} {max_devices} "
                f"{model.memory_slice_count} {model.compute_slice_count}"
            )
            out.extend(_profile_lines(model))
            for gi in mig.get("gpu_instances", ()):
                out.append(
                    f"gi {gi['id']} {gi['profile_id']} {gi['start']} {gi.get('memory_used', 0)} "
                    f"{float(gi.get('sm_util', 0.0))}"
                )
                for ci in gi.get("compute_instances", ()):
                    uuid = ci.get("uuid", "-")  # "-": the fake makes one up
                    out.append(f"ci {gi['id']} {ci['id']} {ci['profile_id']} {ci.get('start', 0)} {uuid}")
        for proc in dev.get("processes", ()):
            gi_id = proc.get("gpu_instance_id")
            ci_id = proc.get("compute_instance_id")
            gi_id = NO_ID if gi_id is None else gi_id
            ci_id = NO_ID if ci_id is None else ci_id
            out.append(
                f"proc {proc['pid']} {proc.get('used_memory', 0)} {gi_id} {ci_id} {proc.get('type', 'c')}"
            )
        for fn, code in dev.get("errors", {}).items():
            out.append(f"error {fn} {_code(code)}")
        for fn, code in dev.get("mig_errors", {}).items():
            out.append(f"mig_error {fn} {_code(code)}")
    return out


def write_config(config: Mapping[str, Any], path: Path) -> Path:
    path.write_text("\n".join(config_lines(config)) + "\n")
    return path


# --------------------------------------------------------------------------------------------
# Running the backend in a child process


@dataclasses.dataclass
class Outcome:
    """What one call in the child returned: `value` (codec JSON) or `error` (type, code, message)."""

    op: str
    value: Any = None
    error: Optional[Dict[str, str]] = None

    def decode(self, cls: Any) -> Any:
        from gpuops.core.codec import from_json

        if self.error is not None:
            raise AssertionError(f"{self.op} failed: {self.error}")
        return from_json(cls, self.value)


_CHILD = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, %r)
    from tests.fakes.nvml_fake import _child_main
    _child_main()
    """
)


def run_backend(
    config: Mapping[str, Any],
    ops: Sequence[Tuple[Any, ...]] = (("inventory",), ("sample",)),
    *,
    missing: Iterable[str] = (),
    load: str = "library",
    library: Optional[str] = None,
    timeout: float = 30.0,
) -> List[Outcome]:
    """Run NvmlBackend against the fake in a fresh process; one Outcome for "init" and per op.

    `ops` are ``(method, *args)`` tuples called on the backend, or ``("script", code)`` to run
    Python with ``backend``, ``pynvml`` and ``result`` (assign the JSON-able answer to it) in scope.
    `load` says how the child finds the fake: "library" passes its path to NvmlBackend,
    "env" sets GPUOPS_NVML_LIBRARY, "ld_library_path" lets pynvml's own dlopen find it by
    soname, "none" loads nothing (as on a machine without the driver); `library` overrides
    the path given in the "library" and "env" modes.
    """
    lib = build_library(missing)
    with tempfile.TemporaryDirectory(prefix="fake-nvml-") as tmp:
        cfg = write_config(config, Path(tmp) / "nvml.conf")
        env = dict(os.environ)
        for var in ("GPUOPS_NVML_LIBRARY", "LD_LIBRARY_PATH", "LD_PRELOAD"):
            env.pop(var, None)
        env["FAKE_NVML_CONFIG"] = str(cfg)
        init: Dict[str, Any] = {}
        path = library if library is not None else str(lib)
        if load == "library":
            init["library"] = path
        elif load == "env":
            env["GPUOPS_NVML_LIBRARY"] = path
        elif load == "ld_library_path":
            env["LD_LIBRARY_PATH"] = str(lib.parent)
        elif load != "none":
            raise ValueError(f"unknown load mode {load!r}")
        spec = {"init": init, "ops": [list(op) for op in ops]}
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD % str(ROOT)],
            input=json.dumps(spec),
            capture_output=True,
            text=True,
            env=env,
            cwd=str(ROOT),
            timeout=timeout,
        )
    if proc.returncode != 0:
        raise AssertionError(f"child failed (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if len(lines) != 1:
        raise AssertionError(f"child printed no result:\n{proc.stdout}\n{proc.stderr}")
    return [Outcome(**item) for item in json.loads(lines[0])["results"]]


def _child_main() -> None:
    spec = json.load(sys.stdin)
    from gpuops.core.codec import to_json
    from gpuops.node.backends.base import BackendError, BackendUnavailable
    from gpuops.node.backends.nvml import NvmlBackend

    results: List[Dict[str, Any]] = []
    try:
        backend = NvmlBackend(**spec["init"])
    except BackendUnavailable as exc:
        results.append(
            {"op": "init", "error": {"type": "BackendUnavailable", "code": "", "message": str(exc)}}
        )
        print(json.dumps({"results": results}))
        return
    results.append({"op": "init", "value": None})
    for op in spec["ops"]:
        name, args = op[0], op[1:]
        try:
            if name == "script":
                import pynvml

                scope: Dict[str, Any] = {"backend": backend, "pynvml": pynvml, "result": None}
                exec(args[0], scope)
                value = scope["result"]
            else:
                value = to_json(getattr(backend, name)(*args))
            results.append({"op": name, "value": value})
        except BackendError as exc:
            results.append(
                {"op": name, "error": {"type": "BackendError", "code": exc.code, "message": exc.message}}
            )
    backend.close()
    print(json.dumps({"results": results}))
