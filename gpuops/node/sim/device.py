"""A simulated GPU: identity, electrical figures, and a MIG state machine with NVML's semantics.

The MIG rules (profiles, placements, the driver's default placement order) all come from
`gpuops.core.mig.catalog`; this module only keeps the state and enforces what NVML enforces:

- MIG mode: NOT_SUPPORTED on GPUs without MIG; IN_USE with processes on the GPU, or when
  disabling while GPU instances exist; Ampere parts keep the new mode *pending* until a GPU
  reset, Hopper and later switch at once. Instances never survive a reset or a mode change.
- GPU instances: NOT_SUPPORTED while MIG is off, INVALID_ARGUMENT for an unknown profile or a
  start outside the profile's placements, INSUFFICIENT_RESOURCES on overlapping memory slices,
  the profile's maximum count, or no compute slices left. Without a start, the driver's order.
- Compute instances: the same inside a GPU instance's compute slices.
- Destroying: IN_USE while processes run on the instance, or (GPU instance) while it has
  compute instances.
- Partition modes (AMD Instinct MI300 class, no MIG): NOT_SUPPORTED on GPUs without them,
  INVALID_ARGUMENT for a mode the model does not take, IN_USE with processes on the GPU, as the
  amd backend refuses before amdsmi would answer BUSY.

Whether processes run is the caller's knowledge (the backend's workloads), passed in as `busy`.
The state exports to, and imports from, JSON-ready dicts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Dict, Mapping, Optional, Sequence, Set, Tuple

from gpuops.core.driver_memory import DriverMemory, overhead_for
from gpuops.core.mig.catalog import MODELS as MIG_MODELS
from gpuops.core.mig.catalog import (
    ComputeProfile,
    GpuInstanceProfile,
    MigModel,
    find_model,
    normalize_model_name,
)
from gpuops.core.mig.placement import Placement, check_layout, solve
from gpuops.core.model import (
    ComputeInstance,
    GpuInfo,
    GpuInstance,
    MigState,
    NotAvailable,
    PartitionState,
)
from gpuops.core.partition_catalog import PARTITION_MODELS, PartitionModel
from gpuops.core.vendor import AMD_VENDOR_ID
from gpuops.node.backends.base import BackendError, MigModeChange

MIB = 1024 * 1024
NVIDIA_VENDOR = 0x10DE


@dataclass(frozen=True)
class Hardware:
    """What a simulated GPU model is: NVML identity plus the figures the physics needs."""

    key: str  # catalog key for MIG models, table key otherwise
    name: str  # as NVML reports it
    pci_device_id: int  # (device << 16) | vendor
    memory_total_mib: int
    multiprocessor_count: int
    architecture: str
    power_limit_watts: float
    idle_watts: float
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    memory_clock_mhz: int
    idle_memory_clock_mhz: int  # GDDR parts drop their memory clock at idle; HBM parts do not
    mig: Optional[MigModel] = None
    partition: Optional[PartitionModel] = None  # AMD's mode partitions (core/partition_catalog.py)

    @property
    def amd(self) -> bool:
        return self.pci_device_id & 0xFFFF == AMD_VENDOR_ID

    @property
    def memory_total_bytes(self) -> int:
        return self.memory_total_mib * MIB


@dataclass(frozen=True)
class _Electrical:
    power_limit_watts: float
    idle_watts: float
    max_sm_clock_mhz: int
    idle_sm_clock_mhz: int
    memory_clock_mhz: int


# Power and clocks of the MIG-capable models (the MIG tables themselves live in the catalog).
_MIG_ELECTRICAL: Dict[str, _Electrical] = {
    "A100-SXM4-40GB": _Electrical(400.0, 55.0, 1410, 210, 1215),
    "A100-80GB": _Electrical(400.0, 60.0, 1410, 210, 1593),
    "H100-80GB": _Electrical(700.0, 70.0, 1980, 345, 2619),
    "H100-PCIE-80GB": _Electrical(350.0, 50.0, 1755, 345, 1593),
    "H200-141GB": _Electrical(700.0, 75.0, 1980, 345, 3201),
    "A30-24GB": _Electrical(165.0, 32.0, 1440, 210, 1215),
}
_DEFAULT_ELECTRICAL = _Electrical(400.0, 60.0, 1410, 210, 1215)

# GPUs without MIG that fleets commonly mix in.
_PlainRow = Tuple[str, str, int, int, int, str, float, float, int, int, int, int]
_PLAIN_ROWS: Tuple[_PlainRow, ...] = (
    # key, NVML name, PCI id, MiB, SMs, architecture, TDP W, idle W, SM MHz max/idle, memory MHz max/idle
    ("L40S", "NVIDIA L40S", 0x26B910DE, 46068, 142, "ada", 350.0, 35.0, 2520, 210, 9001, 405),
    ("RTX A6000", "NVIDIA RTX A6000", 0x223010DE, 49140, 84, "ampere", 300.0, 25.0, 2100, 210, 8001, 405),
    ("A10", "NVIDIA A10", 0x223610DE, 23028, 72, "ampere", 150.0, 20.0, 1695, 210, 6251, 405),
    ("T4", "Tesla T4", 0x1EB810DE, 15360, 40, "turing", 70.0, 10.0, 1590, 300, 5001, 405),
    ("V100-SXM2-32GB", "Tesla V100-SXM2-32GB", 0x1DB510DE, 32768, 80, "volta", 300.0, 40.0, 1530, 135, 877,
     877),
)  # fmt: skip
PLAIN_MODELS: Dict[str, Hardware] = {row[0]: Hardware(*row) for row in _PLAIN_ROWS}

# AMD Instinct, as amdsmi reports it: 192 GB HBM3 (amdsmi's VRAM total is 196592 MiB, the rest
# reserved by the driver), 304 compute units, a 750 W socket (OAM module), GFX clock up to
# 2100 MHz, HBM3 at a fixed 1300 MHz. The sim's physics uses the 750 W as its ceiling; the GPU
# reports no power limit (docs/backends.md: amdsmi's power_limit units differ between releases).
PLAIN_MODELS["MI300X"] = Hardware(
    key="MI300X",
    name="AMD Instinct MI300X",
    pci_device_id=(0x74A1 << 16) | AMD_VENDOR_ID,
    memory_total_mib=196592,
    multiprocessor_count=304,
    architecture="cdna3",
    power_limit_watts=750.0,
    idle_watts=140.0,
    max_sm_clock_mhz=2100,
    idle_sm_clock_mhz=132,
    memory_clock_mhz=1300,
    idle_memory_clock_mhz=1300,
    partition=PARTITION_MODELS["MI300X"],
)


def known_models() -> Tuple[str, ...]:
    return tuple(sorted(MIG_MODELS)) + tuple(sorted(PLAIN_MODELS))


def _pick_name(model: MigModel, text: str) -> Tuple[str, int]:
    """The NVML name and PCI ID that fit what the spec wrote (A100-80GB covers SXM and PCIe)."""
    names = list(model.nvml_names) or ["NVIDIA " + model.key]
    ids = list(model.pci_device_ids) or [NVIDIA_VENDOR]
    wanted = normalize_model_name(text)
    chosen = 0
    for i, name in enumerate(names):
        if normalize_model_name(name) == wanted:
            chosen = i
            break
    else:
        if "pcie" in wanted:
            chosen = next((i for i, n in enumerate(names) if "pcie" in normalize_model_name(n)), 0)
        elif "nvl" in wanted:
            chosen = next((i for i, n in enumerate(names) if "nvl" in normalize_model_name(n)), 0)
    return names[chosen], ids[chosen] if chosen < len(ids) else ids[0]


def resolve_hardware(text: str) -> Optional[Hardware]:
    """The simulated hardware for a model name a spec gives ("A100-SXM4-40GB", "L40S", ...)."""
    wanted = normalize_model_name(text)
    for key, hardware in PLAIN_MODELS.items():
        if wanted in (normalize_model_name(key), normalize_model_name(hardware.name)):
            return hardware
    model = MIG_MODELS.get(text) or find_model(text)
    if model is None:
        return None
    elec = _MIG_ELECTRICAL.get(model.key, _DEFAULT_ELECTRICAL)
    name, pci = _pick_name(model, text)
    if model.key == "A100-80GB" and "pcie" in normalize_model_name(name):
        elec = _Electrical(300.0, 50.0, elec.max_sm_clock_mhz, elec.idle_sm_clock_mhz, elec.memory_clock_mhz)
    return Hardware(
        key=model.key,
        name=name,
        pci_device_id=pci,
        memory_total_mib=int(model.memory_total_mib),
        multiprocessor_count=int(model.multiprocessor_count),
        architecture=model.architecture,
        power_limit_watts=elec.power_limit_watts,
        idle_watts=elec.idle_watts,
        max_sm_clock_mhz=elec.max_sm_clock_mhz,
        idle_sm_clock_mhz=elec.idle_sm_clock_mhz,
        memory_clock_mhz=elec.memory_clock_mhz,
        idle_memory_clock_mhz=elec.memory_clock_mhz,
        mig=model,
    )


def hashed_uuid(prefix: str, *key: object) -> str:
    """A stable UUID-shaped identifier from a key: "GPU-8c0c5d4e-....", "MIG-...."."""
    text = "\x1f".join(str(k) for k in key)
    h = hashlib.blake2b(text.encode("utf-8"), digest_size=16).hexdigest()
    return "%s-%s-%s-%s-%s-%s" % (prefix, h[:8], h[8:12], h[12:16], h[16:20], h[20:32])


# Bus numbers of an 8-GPU HGX board, then sequential ones.
_HGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


# Bus numbers of an 8-GPU MI300X platform (one OAM module per root port).
_OAM_BUSES = (0x0C, 0x22, 0x38, 0x5C, 0x9F, 0xAF, 0xBF, 0xDF)


def pci_bus_id(index: int, amd: bool = False) -> str:
    """NVML's form (00000000:07:00.0), or amdsmi's (0000:0c:00.0) for AMD GPUs."""
    if amd:
        bus = _OAM_BUSES[index] if index < len(_OAM_BUSES) else 0xE0 + index
        return "0000:%02x:00.0" % (bus % 256)
    bus = _HGX_BUSES[index] if index < len(_HGX_BUSES) else 0xC0 + index
    return "00000000:%02X:00.0" % (bus % 256)


def device_uuid(hardware: Hardware, *key: object) -> str:
    """A GPU's stable UUID in its vendor's form: NVML's "GPU-8c0c5d4e-...", amdsmi's bare
    "8c0c74a1-...." (AMD's carry the device id in the first group, as real MI300X UUIDs do)."""
    if not hardware.amd:
        return hashed_uuid("GPU", *key)
    bare = hashed_uuid("X", *key)[2:]
    return "%s%04x%s" % (bare[:4], (hardware.pci_device_id >> 16) & 0xFFFF, bare[8:])


def driver_major(version: str) -> int:
    head = version.strip().split(".", 1)[0]
    return int(head) if head.isdigit() else 0


class _Ci:
    __slots__ = ("id", "profile", "start", "uuid")

    def __init__(self, ci_id: int, profile: ComputeProfile, start: int, uuid: str) -> None:
        self.id = ci_id
        self.profile = profile
        self.start = start
        self.uuid = uuid


class _Gi:
    __slots__ = ("cis", "id", "profile", "start")

    def __init__(self, gi_id: int, profile: GpuInstanceProfile, start: int) -> None:
        self.id = gi_id
        self.profile = profile
        self.start = start
        self.cis: Dict[int, _Ci] = {}

    @property
    def memory_slices(self) -> range:
        return range(self.start, self.start + self.profile.memory_slices)


def _ci_name(gi: GpuInstanceProfile, cp: ComputeProfile) -> str:
    """The catalog names CI profiles "1c.3g.20gb"; the default (full) one carries the GI's name."""
    return cp.name or ("%dc.%s" % (cp.slices, gi.name))


def _tree_id(start: int, size: int, slices: int) -> Optional[int]:
    """The GPU-instance ID NVML gives a memory-slice span: node number in a binary tree of the
    slices (whole GPU 0; halves 1, 2; quarters 3-6; eighths 7-14). Matches the transcripts:
    7g gets 0, 2g at 0/2/4 gets 3/4/5, 1g in slot n gets 7+n."""
    if size <= 0 or slices % size or start % size:
        return None
    parts = slices // size
    if parts & (parts - 1):
        return None
    return parts - 1 + start // size


class SimDevice:
    """One simulated GPU and its MIG state. Every method that NVML can refuse raises BackendError."""

    def __init__(
        self,
        index: int,
        hardware: Hardware,
        uuid: str,
        driver_version: str = "550.54.15",
        owner: Optional[str] = None,
        mig_enabled: bool = False,
        mig_pending: Optional[bool] = None,
        lost: bool = False,
        unsupported: Sequence[str] = (),
        compute_mode: Optional[str] = None,
        memory_mode: Optional[str] = None,
        cuda_version: str = "",
    ) -> None:
        self.index = index
        self.hardware = hardware
        self.uuid = uuid
        self.pci_bus_id = pci_bus_id(index, hardware.amd)
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.owner = owner
        self.unsupported = frozenset(unsupported)
        # Bumped by every change of the MIG state or of `lost`: what the caches below, and the
        # backend's, are keyed on.
        self.version = 0
        self._info: Dict[bool, GpuInfo] = {}
        self._derived: Dict[Any, Any] = {}  # figures derived from the MIG state; cleared on a change
        self._lost = bool(lost)
        capable = hardware.mig is not None
        self._mig_current = bool(mig_enabled) and capable
        self._mig_pending = self._mig_current if mig_pending is None or not capable else bool(mig_pending)
        self.serial = 0  # counts creations, so a re-created MIG device gets a new UUID
        self._gis: Dict[int, _Gi] = {}
        part = hardware.partition
        # The modes a GPU comes up in: one logical GPU, one memory pool (AMD's defaults).
        self._compute_mode = compute_mode or (next(iter(part.compute)) if part is not None else "")
        self._memory_mode = memory_mode or (part.memory[0] if part is not None else "")

    def _changed(self) -> None:
        self.version += 1
        self._derived.clear()

    @property
    def lost(self) -> bool:
        return self._lost

    @lost.setter
    def lost(self, value: bool) -> None:
        self._lost = bool(value)
        self._changed()

    @property
    def mig_current(self) -> bool:
        return self._mig_current

    @mig_current.setter
    def mig_current(self, value: bool) -> None:
        self._mig_current = bool(value)
        self._changed()

    @property
    def mig_pending(self) -> bool:
        return self._mig_pending

    @mig_pending.setter
    def mig_pending(self, value: bool) -> None:
        self._mig_pending = bool(value)
        self._changed()

    # ---- identity -------------------------------------------------------------------------
    @property
    def mig_model(self) -> Optional[MigModel]:
        return self.hardware.mig

    @property
    def mig_capable(self) -> bool:
        return self.hardware.mig is not None

    def info(self, lost_now: bool = False) -> GpuInfo:
        """Identity and fixed figures; a lost GPU (or `lost_now`) answers GPU_IS_LOST for figures.
        The same (frozen) object every time: identity does not change."""
        is_lost = self._lost or lost_now
        info = self._info.get(is_lost)
        if info is None:
            info = self._info[is_lost] = self._make_info(is_lost)
        return info

    @property
    def context_bytes(self) -> int:
        """Device memory a CUDA context takes on this GPU: every process holds at least this
        (its NVML figure counts it); 0 on AMD GPUs, whose figures the simulator leaves as read."""
        return 0 if self.hardware.amd else overhead_for(self.hardware.key).context_bytes

    @property
    def reserved_bytes(self) -> int:
        """What the driver keeps of the card: no process can have it (NVML's "reserved")."""
        return 0 if self.hardware.amd else overhead_for(self.hardware.key).reserved_bytes

    @property
    def usable_bytes(self) -> int:
        """What processes can have of the whole GPU between them."""
        return self.hardware.memory_total_bytes - self.reserved_bytes

    def _make_info(self, is_lost: bool) -> GpuInfo:
        hw = self.hardware
        lost = NotAvailable("GPU_IS_LOST")
        # What the node observes of the driver's memory, as a node whose limiter has made a
        # context on the GPU reports it (node/limiter_tags.py): the model's figures.
        driver = (
            None
            if is_lost or hw.amd
            else DriverMemory(self.context_bytes, self.reserved_bytes, self.cuda_version)
        )
        return GpuInfo(
            index=self.index,
            uuid=self.uuid,
            name=hw.name,
            pci_bus_id=self.pci_bus_id,
            pci_device_id=hw.pci_device_id,
            memory_total_bytes=lost if is_lost else hw.memory_total_bytes,
            mig_capable=self.mig_capable,
            mig_model=hw.mig.key if hw.mig is not None else None,
            architecture=hw.architecture,
            multiprocessor_count=lost if is_lost else hw.multiprocessor_count,
            power_limit_watts=(
                lost
                if is_lost
                else NotAvailable("NOT_SUPPORTED")
                if "power_limit" in self.unsupported or hw.amd
                else hw.power_limit_watts
            ),
            driver_memory=driver,
        )

    @property
    def partitioned(self) -> bool:
        return self.hardware.partition is not None

    def partition_state(self) -> Optional[PartitionState]:
        """The modes of a GPU split by modes (AMD); None for other GPUs and lost ones. The same
        (frozen) object until the modes change."""
        part = self.hardware.partition
        if part is None or self._lost:
            return None
        state = self._derived.get("partition")
        if state is None:
            state = self._derived["partition"] = PartitionState(
                compute_mode=self._compute_mode,
                memory_mode=self._memory_mode,
                compute_modes=tuple(part.compute),
                memory_modes=part.memory,
                partitions=part.compute.get(self._compute_mode, 1),
            )
        return state

    def set_partition(
        self, compute_mode: Optional[str], memory_mode: Optional[str], busy: bool
    ) -> PartitionState:
        """The amd backend's `set_partition` (None: keep a mode): the same refusals, in its order
        (modes checked, then idleness), and nothing changed by a refusal."""
        self._alive()
        part = self.hardware.partition
        if part is None:
            raise BackendError(
                "NOT_SUPPORTED",
                "%s (%s) has no partition modes: AMDSMI_STATUS_NOT_SUPPORTED"
                % (self._where(), self.hardware.name),
            )
        compute = self._compute_mode if compute_mode is None else compute_mode
        memory = self._memory_mode if memory_mode is None else memory_mode
        if compute not in part.compute:
            raise BackendError(
                "INVALID_ARGUMENT",
                "%s takes compute modes %s, not %r" % (self._where(), "/".join(part.compute), compute),
            )
        if memory not in part.memory:
            raise BackendError(
                "INVALID_ARGUMENT",
                "%s takes memory modes %s, not %r" % (self._where(), "/".join(part.memory), memory),
            )
        if (compute, memory) != (self._compute_mode, self._memory_mode):
            if busy:
                raise BackendError(
                    "IN_USE",
                    "%s is in use: a partition change needs it idle (AMDSMI_STATUS_BUSY)" % self._where(),
                )
            self._compute_mode, self._memory_mode = compute, memory
            self._changed()
        state = self.partition_state()
        assert state is not None
        return state

    def mig_state(self) -> Optional[MigState]:
        """None for GPUs without MIG, and for lost GPUs (NVML cannot say). The same (frozen)
        object until the MIG state changes."""
        if self.hardware.mig is None or self._lost:
            return None
        state = self._derived.get("mig_state")
        if state is None:
            state = self._derived["mig_state"] = MigState(
                self._mig_current, self._mig_pending, self.gpu_instances()
            )
        return state

    def gpu_instances(self) -> Tuple[GpuInstance, ...]:
        if not self._mig_current:
            return ()
        gis = self._derived.get("gpu_instances")
        if gis is None:
            gis = self._derived["gpu_instances"] = tuple(
                self._gi_model(gi) for gi in sorted(self._gis.values(), key=lambda g: g.id)
            )
        return gis

    def gpu_instance(self, gi_id: int) -> Optional[GpuInstance]:
        gi = self._gis.get(gi_id)
        return self._gi_model(gi) if gi is not None else None

    def has_compute_instance(self, gi_id: int, ci_id: int) -> bool:
        gi = self._gis.get(gi_id)
        return self.mig_current and gi is not None and ci_id in gi.cis

    def gpu_instance_memory_bytes(self, gi_id: int) -> int:
        gi = self._gis.get(gi_id)
        return int(gi.profile.memory_mib) * MIB if gi is not None else 0

    def gpu_instance_compute_share(self, gi_id: int, ci_id: Optional[int] = None) -> float:
        """Share of the GPU's compute slices an instance (or one CI of it) holds."""
        key = ("share", gi_id, ci_id)
        share = self._derived.get(key)
        if share is None:
            share = self._derived[key] = self._compute_share(gi_id, ci_id)
        return share

    def _compute_share(self, gi_id: int, ci_id: Optional[int]) -> float:
        model = self.hardware.mig
        gi = self._gis.get(gi_id)
        if model is None or gi is None:
            return 0.0
        slices = gi.profile.compute_slices
        if ci_id is not None and ci_id in gi.cis:
            slices = gi.cis[ci_id].profile.slices
        return float(slices) / float(max(model.compute_slice_count, 1))

    def _gi_model(self, gi: _Gi) -> GpuInstance:
        p = gi.profile
        return GpuInstance(
            id=gi.id,
            profile_id=p.id,
            profile_name=p.name,
            start=gi.start,
            size=p.memory_slices,
            memory_total_bytes=int(p.memory_mib) * MIB,
            multiprocessor_count=int(p.multiprocessor_count),
            compute_instances=tuple(
                self._ci_model(gi, ci) for ci in sorted(gi.cis.values(), key=lambda c: c.id)
            ),
        )

    @staticmethod
    def _ci_model(gi: _Gi, ci: _Ci) -> ComputeInstance:
        return ComputeInstance(
            id=ci.id,
            profile_id=ci.profile.id,
            name=_ci_name(gi.profile, ci.profile),
            start=ci.start,
            size=ci.profile.slices,
            multiprocessor_count=int(ci.profile.multiprocessor_count),
            uuid=ci.uuid,
        )

    # ---- checks shared by the MIG calls ---------------------------------------------------
    def _where(self) -> str:
        return "GPU %d (%s)" % (self.index, self.pci_bus_id)

    def _alive(self) -> None:
        if self.lost:
            raise BackendError("GPU_IS_LOST", "%s has fallen off the bus" % self._where())

    def _require_mig_model(self) -> MigModel:
        self._alive()
        model = self.hardware.mig
        if model is None:
            raise BackendError(
                "NOT_SUPPORTED", "%s (%s) does not support MIG" % (self._where(), self.hardware.name)
            )
        return model

    def _require_mig_on(self) -> MigModel:
        model = self._require_mig_model()
        if not self.mig_current:
            state = " (enable is pending a GPU reset)" if self.mig_pending else ""
            raise BackendError("NOT_SUPPORTED", "MIG mode is disabled on %s%s" % (self._where(), state))
        return model

    def _profile(self, model: MigModel, profile_id: int) -> GpuInstanceProfile:
        try:
            profile = model.profile(profile_id)
        except (KeyError, ValueError, TypeError):
            raise BackendError(
                "INVALID_ARGUMENT", "%s has no GPU instance profile %r" % (self._where(), profile_id)
            ) from None
        need = int(profile.min_driver)
        if need and driver_major(self.driver_version) and driver_major(self.driver_version) < need:
            raise BackendError(
                "INVALID_ARGUMENT",
                "profile %s needs driver R%d+, this node runs %s" % (profile.name, need, self.driver_version),
            )
        return profile

    # ---- MIG mode -------------------------------------------------------------------------
    def set_mig_mode(self, enabled: bool, busy: bool) -> MigModeChange:
        model = self._require_mig_model()
        enabled = bool(enabled)
        if busy:
            raise BackendError(
                "IN_USE",
                "%s: in use by another client; stop the processes using the device first" % self._where(),
            )
        if not enabled and self._gis and self.mig_current:
            raise BackendError(
                "IN_USE",
                "%s: in use by another client; destroy its %d GPU instance(s) before disabling MIG"
                % (self._where(), len(self._gis)),
            )
        self.mig_pending = enabled
        if model.architecture != "ampere" and self.mig_current != enabled:
            # Hopper and later switch without a reset; nothing survives the switch.
            self.mig_current = enabled
            self._gis.clear()
        self._changed()
        return MigModeChange(self.mig_current, self.mig_pending)

    def reset(self, busy: bool) -> None:
        """`nvidia-smi --gpu-reset`: applies a pending MIG mode; MIG devices never survive it."""
        self._alive()
        if busy:
            raise BackendError("IN_USE", "%s: in use by another client; cannot reset" % self._where())
        self._gis.clear()
        if self.mig_capable:
            self.mig_current = self.mig_pending
        self._changed()

    # ---- GPU instances --------------------------------------------------------------------
    def placements(self) -> Tuple[Placement, ...]:
        """The GPU instances as the placement solver sees them."""
        return tuple(
            Placement(gi.profile.name, gi.profile.id, gi.start, gi.profile.memory_slices)
            for gi in sorted(self._gis.values(), key=lambda g: (g.start, g.id))
        )

    def create_gpu_instance(self, profile_id: int, start: Optional[int] = None) -> GpuInstance:
        """`nvmlDeviceCreateGpuInstance[WithPlacement]`: without `start`, the first start of the
        profile's driver order that fits (so `-cgi 19,19,14,9` fails where `9,19,14,19` works)."""
        model = self._require_mig_on()
        profile = self._profile(model, profile_id)
        if start is not None and (isinstance(start, bool) or start not in profile.placements):
            raise BackendError(
                "INVALID_ARGUMENT",
                "%s: profile %s cannot start at memory slice %r (allowed: %s)"
                % (self._where(), profile.name, start, ",".join(str(p) for p in profile.placements)),
            )
        existing = list(self.placements())
        candidates: Sequence[int] = (start,) if start is not None else tuple(profile.driver_order)
        reasons = []
        for candidate in candidates:
            new = Placement(profile.name, profile.id, candidate, profile.memory_slices)
            result = check_layout(model, [*existing, new])
            if result.ok:
                return self._gi_model(self._place(model, profile, candidate, None))
            reasons.append(result.reason)
        # A limit that holds wherever the instance goes (count, compute slices, engines) is the
        # better reason; the solver checks those first.
        anywhere = solve(model, [profile.id], fixed=existing)
        reason = anywhere.reason if not anywhere.ok else reasons[0]
        raise BackendError(
            "INSUFFICIENT_RESOURCES",
            "unable to create a GPU instance on %s using profile %d (%s): insufficient resources%s"
            % (self._where(), profile.id, profile.name, (" (%s)" % reason) if reason else ""),
        )

    def _place(self, model: MigModel, profile: GpuInstanceProfile, start: int, gi_id: Optional[int]) -> _Gi:
        if gi_id is None:
            gi_id = _tree_id(start, profile.memory_slices, model.memory_slice_count)
            if gi_id is None or gi_id in self._gis:
                gi_id = min(
                    i for i in range(len(self._gis) + 2 * model.memory_slice_count) if i not in self._gis
                )
        gi = _Gi(gi_id, profile, start)
        self._gis[gi_id] = gi
        self.serial += 1
        self._changed()
        return gi

    def destroy_gpu_instance(self, gi_id: int, busy: bool) -> None:
        self._require_mig_on()
        gi = self._gis.get(gi_id)
        if gi is None:
            raise BackendError("NOT_FOUND", "%s has no GPU instance %r" % (self._where(), gi_id))
        if busy or gi.cis:
            why = (
                "processes are running on it" if busy else "it still has %d compute instance(s)" % len(gi.cis)
            )
            raise BackendError(
                "IN_USE",
                "unable to destroy GPU instance ID %d from %s: in use by another client (%s)"
                % (gi_id, self._where(), why),
            )
        del self._gis[gi_id]
        self._changed()

    # ---- compute instances ----------------------------------------------------------------
    def _gi(self, gi_id: int) -> _Gi:
        self._require_mig_on()
        gi = self._gis.get(gi_id)
        if gi is None:
            raise BackendError("NOT_FOUND", "%s has no GPU instance %r" % (self._where(), gi_id))
        return gi

    def _compute_profile(self, gi: _Gi, profile_id: int) -> ComputeProfile:
        for cp in gi.profile.compute_profiles:
            if cp.id == profile_id:
                return cp
        raise BackendError(
            "INVALID_ARGUMENT",
            "GPU instance %d (%s) on %s has no compute instance profile %r (allowed: %s)"
            % (
                gi.id,
                gi.profile.name,
                self._where(),
                profile_id,
                ",".join(str(c.id) for c in gi.profile.compute_profiles),
            ),
        )

    def default_compute_profile(self, gi_id: int) -> int:
        gi = self._gi(gi_id)
        for cp in gi.profile.compute_profiles:
            if cp.default:
                return cp.id
        return max(gi.profile.compute_profiles, key=lambda c: c.slices).id

    def create_compute_instance(
        self, gi_id: int, profile_id: int, start: Optional[int] = None
    ) -> ComputeInstance:
        gi = self._gi(gi_id)
        cp = self._compute_profile(gi, profile_id)
        if start is not None and start not in cp.placements:
            raise BackendError(
                "INVALID_ARGUMENT",
                "compute instance profile %s cannot start at compute slice %r (allowed: %s)"
                % (_ci_name(gi.profile, cp), start, ",".join(str(p) for p in cp.placements)),
            )
        same = sum(1 for ci in gi.cis.values() if ci.profile.id == cp.id)
        used: Set[int] = set()
        for ci in gi.cis.values():
            used.update(range(ci.start, ci.start + ci.profile.slices))
        if same >= cp.max_count or len(used) + cp.slices > gi.profile.compute_slices:
            raise self._ci_insufficient(gi, cp)
        candidates: Sequence[int] = (start,) if start is not None else tuple(cp.placements)
        for candidate in candidates:
            span = range(candidate, candidate + cp.slices)
            if candidate + cp.slices <= gi.profile.compute_slices and not used.intersection(span):
                return self._ci_model(gi, self._place_ci(gi, cp, candidate, None, None))
        raise self._ci_insufficient(gi, cp)

    def _ci_insufficient(self, gi: _Gi, cp: ComputeProfile) -> BackendError:
        return BackendError(
            "INSUFFICIENT_RESOURCES",
            "unable to create a compute instance on GPU instance %d of %s using profile %d (%s): "
            "insufficient resources" % (gi.id, self._where(), cp.id, _ci_name(gi.profile, cp)),
        )

    def _place_ci(
        self, gi: _Gi, cp: ComputeProfile, start: int, ci_id: Optional[int], uuid: Optional[str]
    ) -> _Ci:
        if ci_id is None:
            ci_id = min(i for i in range(len(gi.cis) + 1) if i not in gi.cis)
        self.serial += 1
        if uuid is None:
            uuid = hashed_uuid(
                "MIG", self.uuid, gi.id, gi.start, gi.profile.id, ci_id, start, cp.id, self.serial
            )
        ci = _Ci(ci_id, cp, start, uuid)
        gi.cis[ci_id] = ci
        self._changed()
        return ci

    def destroy_compute_instance(self, gi_id: int, ci_id: int, busy: bool) -> None:
        gi = self._gi(gi_id)
        if ci_id not in gi.cis:
            raise BackendError(
                "NOT_FOUND",
                "GPU instance %d on %s has no compute instance %r" % (gi_id, self._where(), ci_id),
            )
        if busy:
            raise BackendError(
                "IN_USE",
                "unable to destroy compute instance ID %d of GPU instance %d on %s: in use by another client"
                % (ci_id, gi_id, self._where()),
            )
        del gi.cis[ci_id]
        self._changed()

    # ---- state export / import ------------------------------------------------------------
    def export_state(self) -> Dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "lost": self.lost,
            "mig_current": self.mig_current,
            "mig_pending": self.mig_pending,
            "serial": self.serial,
            **(
                {"partition": {"compute": self._compute_mode, "memory": self._memory_mode}}
                if self.partitioned
                else {}
            ),
            "gpu_instances": [
                {
                    "id": gi.id,
                    "profile_id": gi.profile.id,
                    "start": gi.start,
                    "compute_instances": [
                        {"id": ci.id, "profile_id": ci.profile.id, "start": ci.start, "uuid": ci.uuid}
                        for ci in sorted(gi.cis.values(), key=lambda c: c.id)
                    ],
                }
                for gi in sorted(self._gis.values(), key=lambda g: g.id)
            ],
        }

    def import_state(self, data: Mapping[str, Any]) -> None:
        """Restore an exported state; the layout is re-checked, so a bad state raises ValueError
        and leaves the device as it was."""
        saved = (self.lost, self.mig_current, self.mig_pending, self.serial, self._gis)
        modes = (self._compute_mode, self._memory_mode)
        try:
            self._import(data)
        except (BackendError, KeyError, TypeError, ValueError) as exc:
            self.lost, self.mig_current, self.mig_pending, self.serial, self._gis = saved
            self._compute_mode, self._memory_mode = modes
            raise ValueError("GPU %d state: %s" % (self.index, exc)) from None
        finally:
            self._changed()  # ids and UUIDs were rewritten in place

    def _import_partition(self, value: Any) -> None:
        part = self.hardware.partition
        if value is None:
            return
        if part is None or not isinstance(value, dict):
            raise ValueError("partition: only AMD GPUs with partition modes have one (an object)")
        compute, memory = value.get("compute"), value.get("memory")
        if compute not in part.compute or memory not in part.memory:
            raise ValueError("partition: %r/%r is not a mode pair %s takes" % (compute, memory, part.key))
        self._compute_mode, self._memory_mode = compute, memory

    def _import(self, data: Mapping[str, Any]) -> None:
        def flag(name: str) -> bool:
            value = data.get(name, False)
            if not isinstance(value, bool):
                raise ValueError("%s: expected true or false" % name)
            return value

        def number(item: Mapping[str, Any], name: str) -> int:
            value = item[name]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError("%s: expected an integer" % name)
            return value

        if data.get("uuid", self.uuid) != self.uuid:
            raise ValueError("uuid %r is not this GPU's (%s)" % (data.get("uuid"), self.uuid))
        self._import_partition(data.get("partition"))
        self.lost = flag("lost")
        self.mig_current = flag("mig_current") and self.mig_capable
        self.mig_pending = flag("mig_pending") and self.mig_capable
        self._gis = {}
        gis = data.get("gpu_instances", [])
        if not isinstance(gis, list):
            raise ValueError("gpu_instances: expected a list")
        if gis and not self.mig_current:
            raise ValueError("GPU instances on a GPU whose MIG mode is off")
        model = self.hardware.mig
        for item in gis:
            if model is None or not isinstance(item, dict):
                raise ValueError("gpu_instances: expected objects")
            start, gi_id = number(item, "start"), number(item, "id")
            if gi_id in self._gis or gi_id < 0:
                raise ValueError("GPU instance id %d twice or negative" % gi_id)
            # Re-check the placement with the same rules as a create, then take the saved id.
            made = self.create_gpu_instance(number(item, "profile_id"), start)
            gi = self._gis.pop(made.id)
            gi.id = gi_id
            self._gis[gi_id] = gi
            cis = item.get("compute_instances", [])
            if not isinstance(cis, list):
                raise ValueError("compute_instances: expected a list")
            for ci_item in cis:
                if not isinstance(ci_item, dict):
                    raise ValueError("compute_instances: expected objects")
                ci_id = number(ci_item, "id")
                if ci_id in gi.cis or ci_id < 0:
                    raise ValueError("compute instance %d twice in GPU instance %d" % (ci_id, gi_id))
                uuid = ci_item.get("uuid")
                if not isinstance(uuid, str) or not uuid:
                    raise ValueError("compute instance uuid: expected a string")
                made_ci = self.create_compute_instance(
                    gi_id, number(ci_item, "profile_id"), number(ci_item, "start")
                )
                ci = gi.cis.pop(made_ci.id)
                ci.id = ci_id
                ci.uuid = uuid
                gi.cis[ci_id] = ci
        serial = data.get("serial", 0)
        if isinstance(serial, bool) or not isinstance(serial, int) or serial < 0:
            raise ValueError("serial: expected a non-negative integer")
        self.serial = serial
