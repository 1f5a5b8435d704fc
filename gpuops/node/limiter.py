"""The node side of the interception limiter (native/libgpuops-limiter.so).

- The tenant table, ``<dir>/tenants``: written here (atomically) by the agent, read by every
  CUDA process that loads the library.  Environment variables of a process can only lower what
  the table grants.  A copy, ``<dir>/tenants.last-good``, is what processes that start while the
  table is bad go by (docs/limiter.md, "Threat model: what fails closed, and how").
- The shared regions, ``<dir>/gpu-<UUID>.region``: one per GPU, written by the library.  Read
  here for per-tenant and per-process usage.  The layout mirrors native/src/region.h (checked
  by tests/native against ``gpuops-limiter-layout``).

Standard library only; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import struct
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple, Union

# The table's text format lives in core/ (the operator side builds the same lines); its names
# are re-exported here, where the node side and its tests know them from.
from gpuops.core.atomic_file import atomic_write
from gpuops.core.tenant_table import (
    CLASSES,
    POLICIES,
    LimiterError,
    TenantSpec,
    format_table,
    parse_table,
)

DEFAULT_DIR = "/run/gpuops/limiter"
TABLE_FILE = "tenants"
LAST_GOOD_FILE = "tenants.last-good"

# Public names, the table's text format from core/ among them (mypy: explicit re-exports).
__all__ = [
    "CLASSES",
    "DEFAULT_DIR",
    "HEADER_SIZE",
    "LAST_GOOD_FILE",
    "MAGIC",
    "MAX_SLOTS",
    "MAX_TENANTS",
    "OFFSETS",
    "POLICIES",
    "SLOTS_OFF",
    "SLOT_SIZE",
    "TABLE_FILE",
    "TENANTS_OFF",
    "TENANT_SIZE",
    "TOTAL_SIZE",
    "VERSION",
    "LimiterError",
    "ProcessUsage",
    "RegionHeader",
    "RegionSnapshot",
    "TenantSpec",
    "TenantUsage",
    "format_table",
    "gpu_shares",
    "parse_table",
    "read_header",
    "read_headers",
    "read_region",
    "read_regions",
    "read_table",
    "region_paths",
    "write_table",
]


def read_table(directory: Union[str, Path] = DEFAULT_DIR) -> Tuple[int, List[TenantSpec]]:
    path = Path(directory) / TABLE_FILE
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return 0, []
    except (OSError, UnicodeDecodeError) as exc:
        raise LimiterError("%s: %s" % (path, exc)) from None
    try:
        return parse_table(text)
    except LimiterError as exc:
        raise LimiterError("%s: %s" % (path, exc)) from None


def write_table(
    directory: Union[str, Path], specs: Sequence[TenantSpec], generation: Optional[int] = None
) -> int:
    """Replaces the tenant table atomically (write, fsync, rename); returns its generation.
    Running programs pick it up within about a second.  The same text goes first to
    ``tenants.last-good``, the copy programs starting while the table is bad go by."""
    directory = Path(directory)
    if generation is None:
        try:
            generation = read_table(directory)[0] + 1
        except LimiterError:
            generation = int(time.time())
    text = format_table(specs, generation)
    directory.mkdir(parents=True, exist_ok=True)
    for name in (LAST_GOOD_FILE, TABLE_FILE):
        atomic_write(directory / name, text, 0o644)
    return generation


# --------------------------------------------------------------------------- shared regions

MAGIC = 0x314E4F4947455250
VERSION = 1
HEADER_SIZE = 4096
MAX_TENANTS = 64
MAX_SLOTS = 1024
TENANT_SIZE = 512
SLOT_SIZE = 128
TENANTS_OFF = HEADER_SIZE
SLOTS_OFF = TENANTS_OFF + MAX_TENANTS * TENANT_SIZE
TOTAL_SIZE = SLOTS_OFF + MAX_SLOTS * SLOT_SIZE

# field offsets (see native/src/region.h)
OFFSETS = {
    "rg_header.gpu_uuid": 48,
    "rg_header.lease": 192,
    "rg_header.lease_deadline_ns": 208,
    "rg_header.nwaiting": 228,
    "rg_header.transitions": 240,
    "rg_header.ctx_bytes": 256,
    "rg_header.ctx_driver": 264,
    "rg_header.ctx_measured": 268,
    "rg_header.ctx_max": 272,
    "rg_header.cuda_total": 280,
    "rg_header.ctx_unmeasured": 288,
    "rg_header.ctx_lock_byte": 296,
    "rg_tenant.state": 0,
    "rg_tenant.name": 8,
    "rg_tenant.mem_limit": 72,
    "rg_tenant.share_permille": 80,
    "rg_tenant.policy": 84,
    "rg_tenant.klass": 88,
    "rg_tenant.waiting": 92,
    "rg_tenant.busy_ns": 96,
    "rg_tenant.charged_ns": 104,
    "rg_tenant.config_gen": 160,
    "rg_tenant.mem_capped": 180,
    "rg_tenant.grants": 168,
    "rg_tenant.members": 256,
    "rg_slot.state": 0,
    "rg_slot.pid": 8,
    "rg_slot.tenant": 12,
    "rg_slot.starttime": 16,
    "rg_slot.pidns": 24,
    "rg_slot.mem_used": 32,
    "rg_slot.busy_ns": 40,
    "rg_slot.launches": 48,
    "rg_slot.mem_limit": 88,
    "rg_slot.init_ns": 96,
    "rg_slot.init_cpu_ns": 104,
    "rg_slot.waited_ns": 112,
    "rg_slot.init_lock_wait_us": 124,
}

_LEASE_STATES = ("free", "held", "draining")
_F_OFD_GETLK = getattr(fcntl, "F_OFD_GETLK", 36)
_FLOCK = "hh4xqqi4x"  # struct flock on 64-bit Linux


@dataclass(frozen=True)
class ProcessUsage:
    slot: int
    pid: int
    tenant: str
    alive: bool
    memory_used: int
    memory_limit: int  # 0 = none, or its tenant's cap of 0 (TenantUsage.memory_capped)
    busy_ns: int
    launches: int
    waited_ns: int
    init_ns: int  # wall time of the limiter's start-up in the process
    init_cpu_ns: int  # its CPU time
    init_lock_wait_ns: int  # time it waited on the region lock


@dataclass(frozen=True)
class TenantUsage:
    name: str
    memory_limit: int  # 0 = none, unless memory_capped
    compute_percent: float  # 0 = none
    policy: str
    klass: str
    memory_used: int  # summed over live processes
    busy_ns: int  # GPU time measured by its processes
    charged_ns: int  # GPU time the scheduler charged it
    grants: int
    processes: int
    waiting: int
    memory_capped: bool = False  # memory_limit is a cap, 0 included (every allocation refused)


@dataclass(frozen=True)
class RegionSnapshot:
    path: str
    gpu_uuid: str
    taken_ns: int  # time.monotonic_ns() of the reading
    lease_state: str
    lease_holder: Optional[str]
    transitions: int
    tenants: Tuple[TenantUsage, ...] = field(default_factory=tuple)
    processes: Tuple[ProcessUsage, ...] = field(default_factory=tuple)
    # What the driver takes of the GPU, as the library observed it (native/src/context.c): the
    # device memory of one CUDA context (None: never measured), under which CUDA driver version
    # (cuDriverGetVersion: 13000 is 13.0), how many clean measurements and the largest; and what
    # CUDA programs can use of the card (cuDeviceTotalMem; 0: not known).
    context_bytes: Optional[int] = None
    context_cuda_version: int = 0
    context_measured: int = 0
    context_max_bytes: int = 0
    cuda_total_bytes: int = 0

    def tenant(self, name: str) -> Optional[TenantUsage]:
        for t in self.tenants:
            if t.name == name:
                return t
        return None


def _fnv1a(data: bytes, h: int = 2166136261) -> int:
    for b in data:
        h = ((h ^ b) * 16777619) & 0xFFFFFFFF
    return h


def _u32(buf: bytes, off: int) -> int:
    return int(struct.unpack_from("<I", buf, off)[0])


def _u64(buf: bytes, off: int) -> int:
    return int(struct.unpack_from("<Q", buf, off)[0])


def _cstr(buf: bytes, off: int, size: int) -> str:
    return buf[off : off + size].split(b"\0", 1)[0].decode("utf-8", "replace")


def _own_pidns() -> int:
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def _starttime(pid: int) -> int:
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return 0
    fields = data[data.rfind(b")") + 2 :].split()
    return int(fields[19]) if len(fields) > 19 else 0


def _lock_held(fd: int, slot: int) -> bool:
    """True if some process holds the slot's OFD byte lock (that is, the slot's owner lives)."""
    arg = struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, SLOTS_OFF + slot * SLOT_SIZE, 1, 0)
    try:
        res = fcntl.fcntl(fd, _F_OFD_GETLK, arg)
    except OSError as exc:
        if exc.errno in (errno.EINVAL, errno.ENOSYS):
            return True  # cannot tell: count it
        raise
    return int(struct.unpack(_FLOCK, res)[0]) != fcntl.F_UNLCK


def _alive(fd: int, slot: int, pid: int, starttime: int, pidns: int, own_ns: int) -> bool:
    if not _lock_held(fd, slot):
        return False
    if pidns and pidns == own_ns and pid > 0:
        if not os.path.exists("/proc/%d" % pid):
            return False
        now = _starttime(pid)
        if now and starttime and now != starttime:
            return False  # the pid was reused
    return True


def read_region(path: Union[str, Path]) -> RegionSnapshot:
    """One consistent-enough reading of a region (counters are read lock-free)."""
    path = str(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        raise LimiterError("%s: %s" % (path, exc.strerror)) from None
    try:
        size = os.fstat(fd).st_size
        if size < TOTAL_SIZE:
            raise LimiterError("%s: not a gpuops region (size %d)" % (path, size))
        with mmap.mmap(fd, TOTAL_SIZE, prot=mmap.PROT_READ) as m:
            buf = bytes(m[:TOTAL_SIZE])
        taken = time.monotonic_ns()
        _check_header(path, buf)
        own_ns = _own_pidns()
        tenant_names: Dict[int, str] = {}
        raw_tenants = []
        for i in range(MAX_TENANTS):
            base = TENANTS_OFF + i * TENANT_SIZE
            if _u32(buf, base) != 2:
                continue
            name = _cstr(buf, base + OFFSETS["rg_tenant.name"], 64)
            tenant_names[i] = name
            raw_tenants.append((i, base, name))
        processes = []
        for s in range(MAX_SLOTS):
            base = SLOTS_OFF + s * SLOT_SIZE
            if _u64(buf, base) & 0xFF != 1:
                continue
            pid = struct.unpack_from("<i", buf, base + OFFSETS["rg_slot.pid"])[0]
            tidx = struct.unpack_from("<i", buf, base + OFFSETS["rg_slot.tenant"])[0]
            alive = _alive(
                fd,
                s,
                pid,
                _u64(buf, base + OFFSETS["rg_slot.starttime"]),
                _u64(buf, base + OFFSETS["rg_slot.pidns"]),
                own_ns,
            )
            processes.append(
                ProcessUsage(
                    slot=s,
                    pid=pid,
                    tenant=tenant_names.get(tidx, "?"),
                    alive=alive,
                    memory_used=_u64(buf, base + OFFSETS["rg_slot.mem_used"]),
                    memory_limit=_u64(buf, base + OFFSETS["rg_slot.mem_limit"]),
                    busy_ns=_u64(buf, base + OFFSETS["rg_slot.busy_ns"]),
                    launches=_u64(buf, base + OFFSETS["rg_slot.launches"]),
                    waited_ns=_u64(buf, base + OFFSETS["rg_slot.waited_ns"]),
                    init_ns=_u64(buf, base + OFFSETS["rg_slot.init_ns"]),
                    init_cpu_ns=_u64(buf, base + OFFSETS["rg_slot.init_cpu_ns"]),
                    init_lock_wait_ns=_u32(buf, base + OFFSETS["rg_slot.init_lock_wait_us"]) * 1000,
                )
            )
    finally:
        os.close(fd)
    tenants = []
    for _i, base, name in raw_tenants:
        live = [p for p in processes if p.alive and p.tenant == name]
        policy = _u32(buf, base + OFFSETS["rg_tenant.policy"])
        klass = _u32(buf, base + OFFSETS["rg_tenant.klass"])
        tenants.append(
            TenantUsage(
                name=name,
                memory_limit=_u64(buf, base + OFFSETS["rg_tenant.mem_limit"]),
                compute_percent=_u32(buf, base + OFFSETS["rg_tenant.share_permille"]) / 10.0,
                policy=POLICIES[policy] if policy < len(POLICIES) else "?",
                klass=CLASSES[klass] if klass < len(CLASSES) else "?",
                memory_used=sum(p.memory_used for p in live),
                busy_ns=_u64(buf, base + OFFSETS["rg_tenant.busy_ns"]),
                charged_ns=_u64(buf, base + OFFSETS["rg_tenant.charged_ns"]),
                grants=_u64(buf, base + OFFSETS["rg_tenant.grants"]),
                processes=len(live),
                waiting=_u32(buf, base + OFFSETS["rg_tenant.waiting"]),
                memory_capped=_u32(buf, base + OFFSETS["rg_tenant.mem_capped"]) == 1,
            )
        )
    lease = _u64(buf, OFFSETS["rg_header.lease"])
    state = lease & 0xFF
    holder = (lease >> 8) & 0xFF
    measured = _u32(buf, OFFSETS["rg_header.ctx_measured"])
    return RegionSnapshot(
        path=path,
        gpu_uuid=_cstr(buf, OFFSETS["rg_header.gpu_uuid"], 48),
        taken_ns=taken,
        lease_state=_LEASE_STATES[state] if state < len(_LEASE_STATES) else "?",
        lease_holder=tenant_names.get(holder) if state else None,
        transitions=_u64(buf, OFFSETS["rg_header.transitions"]),
        tenants=tuple(tenants),
        processes=tuple(processes),
        context_bytes=_u64(buf, OFFSETS["rg_header.ctx_bytes"]) if measured else None,
        context_cuda_version=_u32(buf, OFFSETS["rg_header.ctx_driver"]) if measured else 0,
        context_measured=measured,
        context_max_bytes=_u64(buf, OFFSETS["rg_header.ctx_max"]) if measured else 0,
        cuda_total_bytes=_u64(buf, OFFSETS["rg_header.cuda_total"]),
    )


@dataclass(frozen=True)
class RegionHeader:
    """A region's header alone: the GPU and what the library observed of its driver memory
    (`RegionSnapshot`'s fields of the same names)."""

    path: str
    gpu_uuid: str
    context_bytes: Optional[int]
    context_cuda_version: int
    context_measured: int
    cuda_total_bytes: int


def read_header(path: Union[str, Path]) -> RegionHeader:
    """The header of a region (its first 4 KiB: a cheap reading, no process slots)."""
    path = str(path)
    try:
        with open(path, "rb") as f:
            buf = f.read(HEADER_SIZE)
            size = os.fstat(f.fileno()).st_size
    except OSError as exc:
        raise LimiterError("%s: %s" % (path, exc.strerror)) from None
    if size < TOTAL_SIZE or len(buf) < HEADER_SIZE:
        raise LimiterError("%s: not a gpuops region (size %d)" % (path, size))
    _check_header(path, buf)
    measured = _u32(buf, OFFSETS["rg_header.ctx_measured"])
    return RegionHeader(
        path=path,
        gpu_uuid=_cstr(buf, OFFSETS["rg_header.gpu_uuid"], 48),
        context_bytes=_u64(buf, OFFSETS["rg_header.ctx_bytes"]) if measured else None,
        context_cuda_version=_u32(buf, OFFSETS["rg_header.ctx_driver"]) if measured else 0,
        context_measured=measured,
        cuda_total_bytes=_u64(buf, OFFSETS["rg_header.cuda_total"]),
    )


def read_headers(directory: Union[str, Path] = DEFAULT_DIR) -> List[RegionHeader]:
    """The headers of every region of the node that reads (a bad one is left out: the library
    works on alone in that case, and read_regions says why)."""
    out = []
    for path in region_paths(directory):
        try:
            out.append(read_header(path))
        except LimiterError:
            continue
    return out


def _check_header(path: str, buf: bytes) -> None:
    magic, version, header_size, max_tenants, max_slots, total, tsize, ssize, check = struct.unpack_from(
        "<QIIIIQIII", buf, 0
    )
    expected = (MAGIC, VERSION, HEADER_SIZE, MAX_TENANTS, MAX_SLOTS, TOTAL_SIZE, TENANT_SIZE, SLOT_SIZE)
    if (magic, version, header_size, max_tenants, max_slots, total, tsize, ssize) != expected:
        raise LimiterError("%s: not a gpuops region of layout version %d" % (path, VERSION))
    if check != _fnv1a(buf[48:96], _fnv1a(buf[:40])):
        raise LimiterError("%s: region header is corrupt" % path)


def region_paths(directory: Union[str, Path] = DEFAULT_DIR) -> List[Path]:
    return sorted(Path(directory).glob("gpu-*.region"))


def read_regions(
    directory: Union[str, Path] = DEFAULT_DIR,
) -> List[Tuple[Path, Optional[RegionSnapshot], Optional[str]]]:
    """Every region of the node: (path, snapshot, None) or (path, None, error)."""
    out: List[Tuple[Path, Optional[RegionSnapshot], Optional[str]]] = []
    for path in region_paths(directory):
        try:
            out.append((path, read_region(path), None))
        except LimiterError as exc:
            out.append((path, None, str(exc)))
    return out


def gpu_shares(before: RegionSnapshot, after: RegionSnapshot) -> Dict[str, float]:
    """Each tenant's share of the GPU (0..1) between two readings of one region, from the GPU
    time the scheduler charged it (measured by CUDA events in its processes)."""
    elapsed = after.taken_ns - before.taken_ns
    if elapsed <= 0:
        return {}
    old = {t.name: t for t in before.tenants}
    shares = {}
    for t in after.tenants:
        prev = old.get(t.name)
        busy = max(t.busy_ns, t.charged_ns) - (max(prev.busy_ns, prev.charged_ns) if prev else 0)
        used = t.charged_ns - (prev.charged_ns if prev else 0)
        # charged_ns lags by up to a lease; fall back to measured time while nothing was charged
        value = used if used > 0 else busy
        shares[t.name] = max(0.0, min(1.0, value / elapsed))
    return shares
