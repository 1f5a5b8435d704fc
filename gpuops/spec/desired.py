"""What carve: wants, resolved per kind: the values of the entry that decides each kind for a GPU
(`DesiredMig`, `DesiredMps`, `DesiredLimiter`), defaults filled in and located in the file.

The YAML shapes these are built from are in `carve_entry.py` (`MigSpec`, `MpsSpec`,
`LimiterSpec`); `desired_gpu.py` puts the three together for one live GPU. A limiter tenant
resolves to the line the node's table will hold (`TenantSpec`), not a shape of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from gpuops.core.tenant_table import TenantSpec
from gpuops.spec.carve_entry import (
    DEFAULT_MPS_LOG_DIRECTORY,
    DEFAULT_MPS_PIPE_DIRECTORY,
    LimiterSpec,
    LimiterTenantSpec,
    MigSpec,
    MpsSpec,
    PartitionSpec,
    parse_placement,
)


@dataclass(frozen=True)
class DesiredMig:
    """The MIG state wanted on a GPU. `profiles` (counts) or `placements` ((profile, start));
    both None: MIG mode only, instances left as they are (`keeps_instances`). `compute` maps a GI
    profile to the CI split of each of its instances (short names 1c, 2c, ...)."""

    enabled: bool
    profiles: tuple[tuple[str, int], ...] | None
    placements: tuple[tuple[str, int], ...] | None
    compute: tuple[tuple[str, tuple[str, ...]], ...]
    entry: int  # index in carve
    location: str  # "fleet.yaml:30:7" (or "carve[0]" for a fleet built in code)

    @property
    def keeps_instances(self) -> bool:
        return self.enabled and self.profiles is None and self.placements is None

    def profile_counts(self) -> dict[str, int]:
        """Instances per profile, from the counts or the placements."""
        if self.profiles is not None:
            return dict(self.profiles)
        counts: dict[str, int] = {}
        for name, _ in self.placements or ():
            counts[name] = counts.get(name, 0) + 1
        return counts

    def compute_split(self, profile: str) -> tuple[str, ...] | None:
        for name, split in self.compute:
            if name == profile:
                return split
        return None


def desired_mig(spec: MigSpec, entry: int = 0, location: str = "") -> DesiredMig:
    profiles = None
    if spec.profiles is not None:
        profiles = tuple((k, v) for k, v in spec.profiles.items() if v > 0)
    placements = None
    if spec.placements is not None:
        placements = tuple(parse_placement(p) for p in spec.placements)
    compute = tuple((k, tuple(v)) for k, v in spec.compute.items())
    return DesiredMig(spec.enabled, profiles, placements, compute, entry, location or f"carve[{entry}]")


@dataclass(frozen=True)
class DesiredMpsTenant:
    name: str
    active_thread_percentage: int | None
    pinned_memory_limit: int | None  # bytes


@dataclass(frozen=True)
class DesiredMps:
    """MPS wanted on a GPU: one control daemon per GPU, or per MIG instance when MIG is on, each
    with its own pipe and log directory (`pipe_directory_for(uuid)`)."""

    enabled: bool
    active_thread_percentage: int | None  # None: MPS's default (100)
    pinned_memory_limit: int | None  # bytes; None: no limit
    per_tenant: tuple[DesiredMpsTenant, ...]
    pipe_directory: str
    log_directory: str
    entry: int
    location: str

    def pipe_directory_for(self, device_uuid: str) -> str:
        """CUDA_MPS_PIPE_DIRECTORY of the daemon of a GPU (GPU-...) or MIG instance (MIG-...)."""
        return f"{self.pipe_directory}/{device_uuid}"

    def log_directory_for(self, device_uuid: str) -> str:
        return f"{self.log_directory}/{device_uuid}"

    def for_tenant(self, name: str) -> DesiredMpsTenant:
        """A tenant's values: its own where given, else the defaults."""
        for t in self.per_tenant:
            if t.name == name:
                return DesiredMpsTenant(
                    name,
                    t.active_thread_percentage
                    if t.active_thread_percentage is not None
                    else self.active_thread_percentage,
                    t.pinned_memory_limit if t.pinned_memory_limit is not None else self.pinned_memory_limit,
                )
        return DesiredMpsTenant(name, self.active_thread_percentage, self.pinned_memory_limit)


def desired_mps(spec: MpsSpec, entry: int = 0, location: str = "") -> DesiredMps:
    return DesiredMps(
        enabled=spec.enabled,
        active_thread_percentage=spec.active_thread_percentage,
        pinned_memory_limit=spec.pinned_memory_limit,
        per_tenant=tuple(
            DesiredMpsTenant(k, v.active_thread_percentage, v.pinned_memory_limit)
            for k, v in spec.per_tenant.items()
        ),
        pipe_directory=spec.pipe_directory or DEFAULT_MPS_PIPE_DIRECTORY,
        log_directory=spec.log_directory or DEFAULT_MPS_LOG_DIRECTORY,
        entry=entry,
        location=location or f"carve[{entry}]",
    )


@dataclass(frozen=True)
class DesiredLimiter:
    """The limiter tenant lines wanted for a GPU: `TenantSpec`s (core/tenant_table.py, the line
    from fleet.yaml to the node), their policy resolved, no GPUs named. Not enabled: no lines."""

    enabled: bool
    tenants: tuple[TenantSpec, ...]
    entry: int
    location: str

    def tenant_specs(self, gpus: Sequence[str] = ()) -> tuple[TenantSpec, ...]:
        """The lines for the GPUs `gpus` (indices or UUIDs; none: the GPU's own lines)."""
        if not self.enabled:
            return ()
        return tuple(replace(t, gpus=tuple(gpus)) for t in self.tenants)


def effective_policy(limiter: LimiterSpec, tenant: LimiterTenantSpec) -> str:
    """The tenant's policy, else the entry's, else the limiter's rule: fixed-share with a share."""
    if tenant.policy is not None:
        return tenant.policy
    if limiter.policy is not None:
        return limiter.policy
    return "fixed-share" if tenant.compute is not None else "best-effort"


def desired_limiter(spec: LimiterSpec, entry: int = 0, location: str = "") -> DesiredLimiter:
    return DesiredLimiter(
        enabled=spec.enabled,
        tenants=tuple(
            TenantSpec(k, v.memory, v.compute, effective_policy(spec, v), v.klass)
            for k, v in spec.tenants.items()
        ),
        entry=entry,
        location=location or f"carve[{entry}]",
    )


@dataclass(frozen=True)
class DesiredPartition:
    """The partition modes wanted on a GPU (None: keep that one as it is)."""

    compute: str | None
    memory: str | None
    entry: int
    location: str


def desired_partition(spec: PartitionSpec, entry: int = 0, location: str = "") -> DesiredPartition:
    return DesiredPartition(spec.compute, spec.memory, entry, location or f"carve[{entry}]")


__all__ = [
    "DesiredLimiter",
    "DesiredMig",
    "DesiredMps",
    "DesiredMpsTenant",
    "DesiredPartition",
    "desired_limiter",
    "desired_mig",
    "desired_mps",
    "desired_partition",
    "effective_policy",
]
