"""The NVML backend against a real driver, read-only: every field it reads, beside nvidia-smi's view.

One module fixture reads inventory, sample and capabilities once, asks nvidia-smi the same
questions, and writes both as $GPUOPS_GPU_RESULTS/nvml.json before any test asserts, so the
record survives a failed comparison. The tests collect every mismatch before failing: the GPU
machine is lent rarely and one run should say everything that is wrong. Nothing here changes
the GPU (MIG mode is read, never set).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time
from typing import Any

import pytest

from gpuops.core.model import FloatMetric, IntMetric, Node, NodeSample, NotAvailable
from gpuops.node.backends.nvml import NvmlBackend
from tests.gpu import torchlab

pytestmark = pytest.mark.gpu

MIB = 1 << 20
SMI_FIELDS = (
    "index", "uuid", "name", "pci.bus_id", "pci.device_id", "driver_version", "compute_cap",
    "memory.total", "memory.used", "memory.reserved", "mig.mode.current", "mig.mode.pending",
    "power.limit", "enforced.power.limit", "power.draw", "temperature.gpu", "utilization.gpu",
    "utilization.memory", "clocks.sm", "clocks.mem", "clocks.max.sm",
)  # fmt: skip
_METRICS = ("IntMetric", "FloatMetric", IntMetric, FloatMetric)


def _smi(*args: str) -> str | None:
    """nvidia-smi's output, or None where it fails (the record keeps what could be had)."""
    try:
        p = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return p.stdout if p.returncode == 0 else None


def _query(fields: tuple[str, ...]) -> list[list[str]] | None:
    out = _smi(f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits")
    rows = [[f.strip() for f in line.split(",")] for line in (out or "").strip().splitlines()]
    return rows if rows and all(len(r) == len(fields) for r in rows) else None


def smi_gpus() -> list[dict[str, str]]:
    """SMI_FIELDS per GPU as nvidia-smi prints them ("" where it could not say)."""
    rows = _query(SMI_FIELDS)
    if rows is not None:
        return [dict(zip(SMI_FIELDS, row, strict=True)) for row in rows]
    # A field this driver's nvidia-smi does not know fails the whole query: ask one at a time.
    columns = {f: [r[0] for r in _query((f,)) or []] for f in SMI_FIELDS}
    count = len(columns["index"])
    return [{f: col[i] if i < len(col) else "" for f, col in columns.items()} for i in range(count)]


def num(raw: str) -> float | None:
    """A figure from nvidia-smi; None for "[N/A]", "N/A", "[Not Supported]", ""."""
    try:
        value = float(raw)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def smi_details(count: int) -> dict[str, Any]:
    """What --query-gpu does not answer: CUDA version, architecture, MIG devices, compute apps."""
    header = _smi() or ""
    cuda = re.search(r"CUDA Version\s*:\s*([\d.]+)", header)
    arches = []
    for i in range(count):
        found = re.search(r"Product Architecture\s*:\s*(\S+)", _smi("-q", "-i", str(i)) or "")
        arches.append(found.group(1) if found else "")
    mig: dict[str, list[str]] = {}
    gpu = ""
    for line in (_smi("-L") or "").splitlines():
        uuid = re.search(r"UUID:\s*([^\s)]+)", line)
        if uuid and uuid.group(1).startswith("GPU-"):
            gpu = uuid.group(1)
            mig[gpu] = []
        elif uuid and gpu:
            mig[gpu].append(uuid.group(1))
    apps = _smi("--query-compute-apps=gpu_uuid,pid,used_memory", "--format=csv,noheader,nounits")
    return {
        "cuda_version": cuda.group(1) if cuda else "",
        "architecture": arches,
        "mig_devices": mig,
        "compute_apps": (apps or "").strip().splitlines(),
    }


def plain(value: Any) -> Any:
    """A model value as JSON data, a missing figure as "n/a: REASON"."""
    if isinstance(value, NotAvailable):
        return f"n/a: {value.reason}"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple | list):
        return [plain(v) for v in value]
    return value


def bad_fields(value: Any, where: str) -> list[str]:
    """Every figure under `value` that is neither a finite number nor NotAvailable with a reason."""
    if isinstance(value, NotAvailable):
        return [] if value.reason.strip() else [f"{where}: NotAvailable without a reason"]
    bad = []
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            is_number = isinstance(item, int | float) and not isinstance(item, bool) and math.isfinite(item)
            if f.type in _METRICS and not (is_number or isinstance(item, NotAvailable)):
                bad.append(f"{where}.{f.name} = {item!r}: neither a figure nor NotAvailable")
            bad += bad_fields(item, f"{where}.{f.name}")
    elif isinstance(value, tuple | list):
        for i, item in enumerate(value):
            bad += bad_fields(item, f"{where}[{i}]")
    return bad


@dataclasses.dataclass(frozen=True)
class Reading:
    node: Node
    sample: NodeSample
    capabilities: tuple[str, ...]
    smi: list[dict[str, str]]
    details: dict[str, Any]


@pytest.fixture(scope="module")
def reading() -> Reading:
    smi = smi_gpus()
    details = smi_details(len(smi))
    found: dict[str, Any] = {"nvidia_smi": details, "gpus": []}
    for row in smi:
        mig_mode = f"current {row['mig.mode.current']}, pending {row['mig.mode.pending']}"
        found["gpus"].append({"nvidia_smi": row, "mig_mode_found": mig_mode})
    try:
        backend = NvmlBackend()
        try:
            node, sample, caps = backend.inventory(), backend.sample(), backend.capabilities()
        finally:
            backend.close()
    except Exception as exc:
        torchlab.write_result("nvml", {**found, "error": repr(exc)})
        raise
    found["node"] = {k: v for k, v in plain(node).items() if k != "gpus"}
    found["capabilities"] = list(caps)
    # Extra GPUs on either side stay out of the record; the tests fail on the count.
    for entry, inventory, now in zip(found["gpus"], node.gpus, sample.gpus, strict=False):
        entry["inventory"] = {"info": plain(inventory.info), "mig": plain(inventory.mig)}
        entry["sample"] = {k: v for k, v in plain(now).items() if k != "info"}
    torchlab.write_result("nvml", found)
    return Reading(node, sample, caps, smi, details)


def _near(problems: list[str], what: str, ours: Any, theirs: str, tolerance: float, scale: float = 1) -> None:
    """ours (in nvidia-smi's unit after dividing by scale) within tolerance of nvidia-smi's figure."""
    expected = num(theirs)
    if expected is None:
        return  # nvidia-smi cannot say either: nothing to compare
    if isinstance(ours, NotAvailable):
        problems.append(f"{what}: n/a ({ours.reason}) but nvidia-smi says {theirs}")
    elif abs(ours / scale - expected) > tolerance:
        problems.append(f"{what}: {ours / scale:.1f} against nvidia-smi's {theirs} (tolerance {tolerance})")


def test_inventory_matches_nvidia_smi(reading: Reading) -> None:
    node, smi = reading.node, reading.smi
    assert len(node.gpus) == len(smi) > 0, f"NVML sees {len(node.gpus)} GPUs, nvidia-smi {len(smi)}"
    problems = bad_fields(node, "inventory")
    versions = {
        "backend": (node.backend, "nvml"),
        "driver version": (node.driver_version, smi[0]["driver_version"]),
        # nvidia-smi prints the CUDA version in its header only; "?" where a side cannot say.
        "CUDA driver version": (node.cuda_driver_version or "?", reading.details["cuda_version"] or "?"),
    }
    problems += [f"{k}: {a!r} against nvidia-smi's {b!r}" for k, (a, b) in versions.items() if a != b]
    for gpu, row, arch in zip(node.gpus, smi, reading.details["architecture"], strict=True):
        info, at = gpu.info, f"GPU {row['index']}"
        mig: tuple[str, ...] = ("[N/A]", "[N/A]")  # what nvidia-smi prints for a GPU without MIG
        if gpu.mig is not None:
            mig = tuple("Enabled" if on else "Disabled" for on in (gpu.mig.current, gpu.mig.pending))
        same = {
            "index": (str(info.index), row["index"]),
            "uuid": (info.uuid, row["uuid"]),
            "name": (info.name, row["name"]),
            "PCI bus id": (info.pci_bus_id.upper(), row["pci.bus_id"].upper()),
            "PCI device id": (f"0X{info.pci_device_id:08X}", row["pci.device_id"].upper()),
            "architecture": (info.architecture or "?", arch.lower() or info.architecture or "?"),
            "MIG mode (current, pending)": (mig, (row["mig.mode.current"], row["mig.mode.pending"])),
            "MIG capable": (info.mig_capable, row["mig.mode.current"] in ("Enabled", "Disabled")),
        }
        problems += [f"{at} {k}: {a!r} against nvidia-smi's {b!r}" for k, (a, b) in same.items() if a != b]
        _near(problems, f"{at} memory total MiB", info.memory_total_bytes, row["memory.total"], 1, MIB)
        limit = row["enforced.power.limit"] if num(row["enforced.power.limit"]) else row["power.limit"]
        _near(problems, f"{at} enforced power limit W", info.power_limit_watts, limit, 1)
        if not isinstance(info.multiprocessor_count, NotAvailable) and info.multiprocessor_count <= 0:
            problems.append(f"{at}: multiprocessor count {info.multiprocessor_count}")
    assert not problems, "\n".join(problems)


def test_sample_matches_nvidia_smi(reading: Reading) -> None:
    sample, smi = reading.sample, reading.smi
    assert len(sample.gpus) == len(smi) > 0
    problems = bad_fields(sample, "sample")
    if abs(sample.timestamp - time.time()) > 600:
        problems.append(f"sample timestamp {sample.timestamp} is not now")
    for gpu, row in zip(sample.gpus, smi, strict=True):
        at, s = f"GPU {row['index']}", gpu.sample
        if s is None:
            problems.append(f"{at}: no sample")
            continue
        for name in ("utilization_gpu_percent", "utilization_memory_percent"):
            value = getattr(s, name)
            if not isinstance(value, NotAvailable) and not 0 <= value <= 100:
                problems.append(f"{at}: {name} {value}")
        # Memory moves between the two reads: 64 MiB is room for that, not for reserved memory.
        _near(problems, f"{at} memory used MiB", s.memory_used_bytes, row["memory.used"], 64, MIB)
        if s.memory_total_bytes != gpu.info.memory_total_bytes:
            problems.append(
                f"{at}: sample total {s.memory_total_bytes} vs inventory {gpu.info.memory_total_bytes}"
            )
        _near(problems, f"{at} temperature C", s.temperature_celsius, row["temperature.gpu"], 5)
        limit = gpu.info.power_limit_watts
        ceiling = math.inf if isinstance(limit, NotAvailable) else limit * 1.1
        if isinstance(s.power_watts, NotAvailable) or not 0 < s.power_watts < ceiling:
            problems.append(
                f"{at}: power {s.power_watts!r} W, limit {limit!r}, nvidia-smi {row['power.draw']}"
            )
        max_sm = num(row["clocks.max.sm"]) or 10_000
        if isinstance(s.sm_clock_mhz, NotAvailable) or not 0 < s.sm_clock_mhz <= max_sm * 1.05:
            problems.append(f"{at}: SM clock {s.sm_clock_mhz!r} MHz, nvidia-smi max {row['clocks.max.sm']}")
        # The memory clock is fixed on HBM boards; 10% covers boards that step it.
        mem_clock = num(row["clocks.mem"]) or 0
        _near(problems, f"{at} memory clock MHz", s.memory_clock_mhz, row["clocks.mem"], mem_clock * 0.1)
        for m in gpu.mig_samples:
            used, total = m.memory_used_bytes, m.memory_total_bytes
            if not isinstance(used, NotAvailable) and not isinstance(total, NotAvailable) and used > total:
                problems.append(f"{at} GI {m.gpu_instance_id}: memory used {used} > total {total}")
    assert not problems, "\n".join(problems)


def test_mig_devices_match_nvidia_smi(reading: Reading) -> None:
    for gpu in reading.node.gpus:
        instances = gpu.mig.gpu_instances if gpu.mig is not None and gpu.mig.current else ()
        ours = sorted(ci.uuid for gi in instances for ci in gi.compute_instances)
        theirs = sorted(reading.details["mig_devices"].get(gpu.info.uuid, []))
        # NVML documents its GPU instance queries as root-only: a non-root run may miss the layout.
        assert ours == theirs, f"{gpu.info.uuid}: {ours} vs nvidia-smi -L {theirs} (uid {os.getuid()})"
        for gi in instances:
            assert gi.memory_total_bytes > 0 and gi.size > 0 and gi.profile_name, gi


def test_processes_and_capabilities(reading: Reading) -> None:
    assert {"inventory", "sample"} <= set(reading.capabilities), reading.capabilities
    for gpu in reading.sample.gpus:
        assert isinstance(gpu.processes, tuple) and isinstance(gpu.processes_error, str)
        for p in gpu.processes:
            assert p.pid > 0, p
            used = p.used_memory_bytes
            assert used.reason if isinstance(used, NotAvailable) else isinstance(used, int) and used >= 0, p
            if gpu.mig is None or not gpu.mig.current:
                assert p.gpu_instance_id is None and p.compute_instance_id is None, p


def test_discover_local_on_the_real_gpu(reading: Reading) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "gpuops", "discover", "--local", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert document["backend"] == "nvml"
    assert [g["info"]["uuid"] for g in document["gpus"]] == [row["uuid"] for row in reading.smi]
