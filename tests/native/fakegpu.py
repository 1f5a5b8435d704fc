"""Reader of the fake GPU's shared state (tests/native/fake/fakegpu.h), for measuring what the
fake hardware itself accounted: memory in use, and which process ran kernels when."""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0x31555047454B4146
DEV_OFF, DEV_SIZE = 128, 128
PROC_OFF, PROC_SIZE, MAX_PROCS = 640, 128, 4096
LOG_OFF, LOG_SIZE, LOG_ENTRIES = 524928, 32, 65536
MAX_DEV = 4


@dataclass(frozen=True)
class Kernel:
    start_ns: int
    end_ns: int
    pid: int
    dev: int


class FakeGpu:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def _map(self) -> mmap.mmap:
        with open(self.path, "rb") as f:
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def used_memory(self, dev: int = 0) -> int:
        with self._map() as m:
            (magic,) = struct.unpack_from("<Q", m, 0)
            assert magic == MAGIC
            return struct.unpack_from("<Q", m, DEV_OFF + dev * DEV_SIZE + 8)[0]

    def ooms(self, dev: int = 0) -> int:
        """How many allocations (contexts included) the fake driver refused for lack of memory."""
        with self._map() as m:
            return struct.unpack_from("<Q", m, DEV_OFF + dev * DEV_SIZE + 120)[0]

    def busy_by_pid(self, dev: int = 0) -> dict[int, int]:
        out: dict[int, int] = {}
        with self._map() as m:
            for i in range(MAX_PROCS):
                base = PROC_OFF + i * PROC_SIZE
                (pid,) = struct.unpack_from("<i", m, base)
                if pid > 0:
                    busy = struct.unpack_from("<Q", m, base + 48 + 8 * dev)[0]
                    out[pid] = out.get(pid, 0) + busy
        return out

    def kernels(self, dev: int = 0) -> list[Kernel]:
        out = []
        with self._map() as m:
            (head,) = struct.unpack_from("<Q", m, 16)
            first = max(0, head - LOG_ENTRIES)
            for idx in range(first, head):
                base = LOG_OFF + (idx % LOG_ENTRIES) * LOG_SIZE
                seq, start, end, pid, d = struct.unpack_from("<QQQii", m, base)
                if seq == idx + 1 and d == dev:
                    out.append(Kernel(start, end, pid, d))
        out.sort(key=lambda k: k.start_ns)
        return out


def busy_in_window(kernels: list[Kernel], pids: set[int], t0: int, t1: int) -> int:
    """GPU nanoseconds that kernels of `pids` ran inside [t0, t1)."""
    total = 0
    for k in kernels:
        if k.pid in pids:
            a, b = max(k.start_ns, t0), min(k.end_ns, t1)
            if b > a:
                total += b - a
    return total
