"""Tenant labels from the limiter's regions on the processes of a sample.

A process that runs under the interception limiter has a slot in its GPU's region
(`<dir>/gpu-<UUID>.region`, native/src/region.h) naming its tenant. That label is the first
attribution source (docs/tenancy.md): it says which team a process works for even when a shared
service account runs it. Backends know nothing of the limiter (NVML has no such notion), so the
agent and the recorder put the labels on after sampling, here, for every backend.

Regions are read (whole, about 160 KiB each) at most every `REFRESH` seconds, and sooner only
when a process appears that the last reading did not know, at most once a `RECHECK`: a node of
processes that are not under the limiter costs one reading per `RECHECK` while new ones come,
and one per `REFRESH` otherwise. A slot's pid is matched in the agent's pid namespace: a process
in a container with its own pid namespace is not matched (it keeps its user or group
attribution), which docs/limiter.md lists as a limitation.

The same regions say what the driver keeps of each GPU's memory, as the library measured it
(native/src/context.c): what one CUDA context costs there and what CUDA programs can use of the
card. `tag` puts that on each GPU's `GpuInfo.driver_memory` (reserved: NVML's total less CUDA's),
from the regions' headers, read at most every `REFRESH` seconds: that is how the node reports the
driver's overhead it observes (docs/limiter.md, "What a cap bounds").

Standard library only; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from pathlib import Path
from typing import Callable, Dict, Optional, Set, Union

from gpuops.core.driver_memory import DriverMemory, cuda_version_text
from gpuops.core.model import Gpu, NodeSample
from gpuops.node.limiter import DEFAULT_DIR, RegionHeader, read_headers, read_regions, region_paths

log = logging.getLogger("gpuops.agent")

REFRESH = 10.0  # seconds between readings of the regions when nothing new appears
RECHECK = 1.0  # at least this long between readings caused by a process the last one did not know
SOURCE = "limiter"


class LimiterTagger:
    """Puts each process's limiter tenant on a sample (`tag`), where the backend gave none."""

    def __init__(
        self, directory: Union[str, Path] = DEFAULT_DIR, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.directory = str(directory)
        self._clock = clock
        self._read_at: Optional[float] = None
        self._tenants: Dict[int, str] = {}  # pid -> tenant, from live slots
        self._unknown: Set[int] = set()  # pids asked about that the last reading did not have
        self.readings = 0  # how many times the regions were read (for tests and benchmarks)
        self._headers_at: Optional[float] = None
        self._headers: Dict[str, RegionHeader] = {}  # GPU UUID (lower case) -> its region's header

    def tag(self, sample: NodeSample) -> NodeSample:
        sample = self._driver_memory(sample)
        untagged = {p.pid for g in sample.gpus for p in g.processes if p.tenant is None}
        if not untagged:
            return sample
        self._refresh(untagged)
        if not self._tenants:
            return sample
        gpus = []
        changed = False
        for gpu in sample.gpus:
            procs = []
            tagged = False
            for p in gpu.processes:
                tenant = self._tenants.get(p.pid) if p.tenant is None else None
                if tenant is not None:
                    p = dataclasses.replace(p, tenant=tenant, tenant_source=SOURCE)
                    tagged = True
                procs.append(p)
            gpus.append(dataclasses.replace(gpu, processes=tuple(procs)) if tagged else gpu)
            changed = changed or tagged
        return dataclasses.replace(sample, gpus=tuple(gpus)) if changed else sample

    def _driver_memory(self, sample: NodeSample) -> NodeSample:
        """Each GPU's driver memory as its region says, where the backend gave none."""
        now = self._clock()
        if self._headers_at is None or now - self._headers_at >= REFRESH:
            self._headers_at = now
            self._headers = {h.gpu_uuid.lower(): h for h in read_headers(self.directory)}
        if not self._headers:
            return sample
        gpus = [self._observed(g) for g in sample.gpus]
        if all(a is b for a, b in zip(gpus, sample.gpus)):
            return sample
        return dataclasses.replace(sample, gpus=tuple(gpus))

    def _observed(self, gpu: Gpu) -> Gpu:
        info = gpu.info
        header = self._headers.get(info.uuid.lower())
        if header is None or info.driver_memory is not None:
            return gpu
        total = info.memory_total_bytes
        reserved = None
        if isinstance(total, int) and 0 < header.cuda_total_bytes <= total:
            reserved = total - header.cuda_total_bytes
        if header.context_bytes is None and reserved is None:
            return gpu
        memory = DriverMemory(header.context_bytes, reserved, cuda_version_text(header.context_cuda_version))
        return dataclasses.replace(gpu, info=dataclasses.replace(info, driver_memory=memory))

    def _refresh(self, pids: Set[int]) -> None:
        now = self._clock()
        if self._read_at is not None:
            age = now - self._read_at
            new = pids - self._unknown - set(self._tenants)
            if age < REFRESH and not (new and age >= RECHECK):
                return
        self._read_at = now
        self._tenants = {}
        if region_paths(self.directory):
            self.readings += 1
            for path, snapshot, error in read_regions(self.directory):
                if snapshot is None:  # the library keeps going with its last good state; so do we
                    log.warning("limiter region %s: %s", path, error)
                    continue
                for proc in snapshot.processes:
                    if proc.alive and proc.tenant not in ("", "?"):
                        self._tenants[proc.pid] = proc.tenant
        self._unknown = pids - set(self._tenants)
