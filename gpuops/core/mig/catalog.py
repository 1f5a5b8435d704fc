"""The MIG profile catalog: every GPU instance profile of every MIG-capable model gpuops knows.

Figures follow `reference/mig-mps.md` section 2 (`nvidia-smi mig -lgip` transcripts and the MIG
User Guide). Where that reference gives no figure, the value comes from other public `-lgip`
transcripts or from the pattern of the observed models; such profiles carry `inferred=True`
and list what is inferred in `inferred_fields` (see docs/mig.md).

Two ids exist for a GPU instance profile: `enum` is the `NVML_GPU_INSTANCE_PROFILE_*` value passed
to `nvmlDeviceGetGpuInstanceProfileInfo`, `id` is the returned `info.id` that `nvidia-smi` shows and
create/placement/capacity calls take. Placements count memory slices.

Pure data and lookups: no I/O, valid Python 3.8.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Tuple, Union

__all__ = [
    "MODELS",
    "NON_MIG_PCI_DEVICES",
    "ComputeProfile",
    "Engines",
    "GpuInstanceProfile",
    "MigModel",
    "UnknownProfileError",
    "find_model",
    "model_for_gpu",
    "model_for_pci_device_id",
    "normalize_model_name",
]

NVIDIA_VENDOR_ID = 0x10DE

# NVML_GPU_INSTANCE_PROFILE_* values.
GI_PROFILE_1_SLICE = 0
GI_PROFILE_2_SLICE = 1
GI_PROFILE_3_SLICE = 2
GI_PROFILE_4_SLICE = 3
GI_PROFILE_7_SLICE = 4
GI_PROFILE_8_SLICE = 5
GI_PROFILE_6_SLICE = 6
GI_PROFILE_1_SLICE_REV1 = 7
GI_PROFILE_2_SLICE_REV1 = 8
GI_PROFILE_1_SLICE_REV2 = 9
# Blackwell's media/graphics variants (RTX PRO 6000): +gfx, -me (no media engines), +me.all.
GI_PROFILE_1_SLICE_GFX = 10
GI_PROFILE_2_SLICE_GFX = 11
GI_PROFILE_4_SLICE_GFX = 12
GI_PROFILE_1_SLICE_NO_ME = 13
GI_PROFILE_2_SLICE_NO_ME = 14
GI_PROFILE_1_SLICE_ALL_ME = 15
GI_PROFILE_2_SLICE_ALL_ME = 16

# NVML_COMPUTE_INSTANCE_PROFILE_* values, by compute-slice count.
CI_PROFILE_ID_BY_SLICES: Dict[int, int] = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}

MIN_DRIVER_MEDIA_EXTENSIONS = 470
MIN_DRIVER_REV2 = 525


@dataclass(frozen=True)
class Engines:
    """Hardware engines of an instance: video decoders (NVDEC), copy engines, JPEG decoders, OFA."""

    decoders: int
    copy_engines: int
    jpeg: int
    ofa: int

    def __str__(self) -> str:
        return "%d/%d/%d/%d" % (self.decoders, self.copy_engines, self.jpeg, self.ofa)


@dataclass(frozen=True)
class ComputeProfile:
    """A compute-instance profile inside a GPU instance profile (`nvidia-smi mig -lcip`).

    Counts and which profiles exist per GI size are from the reference; compute-slice placements
    and the SM counts of the non-default profiles are inferred (see docs/mig.md).
    """

    id: int  # NVML_COMPUTE_INSTANCE_PROFILE_*: 1c=0, 2c=1, 3c=2, 4c=3, 7c=4
    slices: int  # compute slices: 1, 2, 3, 4, 7
    max_count: int  # how many fit in the GI
    placements: Tuple[int, ...]  # compute-slice starts inside the GI
    multiprocessor_count: int
    default: bool  # the full CI created by `-cgi ... -C`
    name: str  # "1c.3g.20gb"; the default one's name is the GI name


@dataclass(frozen=True)
class GpuInstanceProfile:
    """A GPU instance profile (`nvidia-smi mig -lgip`, `nvmlDeviceGetGpuInstanceProfileInfo`)."""

    enum: int  # NVML_GPU_INSTANCE_PROFILE_* value
    id: int  # info.id: what nvidia-smi shows and create calls take
    name: str  # "1g.5gb", "1g.5gb+me"
    compute_slices: int  # the "Ng" number
    memory_slices: int  # placement size in memory slices
    memory_mib: int  # NVML memorySizeMB
    multiprocessor_count: int
    engines: Engines
    max_count: int
    placements: Tuple[int, ...]  # allowed starts (memory slices)
    driver_order: Tuple[int, ...]  # starts the driver tries, in order, when no placement is given
    compute_profiles: Tuple[ComputeProfile, ...]
    min_driver: int = 0  # R-number, e.g. 525 for A100 1g.10gb
    inferred: bool = False  # True where some figure is not observed in the reference
    inferred_fields: Tuple[str, ...] = ()  # which: memory_mib, multiprocessor_count, engines, ...
    # Other names the same profile has on this model under other drivers (GB200: 3g.95gb was
    # 3g.93gb's name before R575); looked up like the name, never shown.
    aliases: Tuple[str, ...] = ()

    @property
    def media_extensions(self) -> bool:
        """+me and +me.all own media engines beyond the slice's share; -me owns none."""
        return self.name.endswith(("+me", "+me.all"))

    @property
    def default_compute_profile(self) -> ComputeProfile:
        for cp in self.compute_profiles:
            if cp.default:
                return cp
        raise LookupError("profile %s has no default compute profile" % self.name)  # pragma: no cover

    def compute_profile(self, name_or_id: Union[str, int]) -> ComputeProfile:
        """A compute profile by CI profile id (0..4), name ("1c.3g.20gb") or short name ("1c")."""
        if isinstance(name_or_id, int) and not isinstance(name_or_id, bool):
            for cp in self.compute_profiles:
                if cp.id == name_or_id:
                    return cp
        else:
            text = str(name_or_id).strip().lower()
            if text.startswith("mig "):
                text = text[4:].strip()
            for cp in self.compute_profiles:
                short = "%dc" % cp.slices
                if text in (cp.name.lower(), short) or (text.isdigit() and int(text) == cp.id):
                    return cp
        valid = ", ".join("%s (%d)" % (cp.name, cp.id) for cp in self.compute_profiles)
        raise UnknownProfileError(
            "unknown compute profile %r for %s; valid: %s" % (name_or_id, self.name, valid)
        )

    def covers(self, start: int) -> Tuple[int, ...]:
        """The memory slices an instance of this profile placed at `start` occupies."""
        return tuple(range(start, start + self.memory_slices))


class UnknownProfileError(KeyError):
    """A profile name or id that the model does not have; the message lists the valid ones."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class MigModel:
    """A MIG-capable GPU model and its GPU instance profiles."""

    key: str  # "A100-SXM4-40GB", "A100-80GB", "H100-80GB", "H100-PCIE-80GB", "H200-141GB", "A30-24GB"
    aliases: Tuple[str, ...]  # accepted user spellings
    nvml_names: Tuple[str, ...]  # NVML device names, e.g. "NVIDIA A100-SXM4-40GB"
    pci_device_ids: Tuple[int, ...]  # (device << 16) | 0x10DE
    architecture: str  # "ampere" | "hopper"
    memory_slice_count: int
    compute_slice_count: int
    memory_total_mib: int
    multiprocessor_count: int
    profiles: Tuple[GpuInstanceProfile, ...]

    def profile(self, name_or_id: Union[str, int]) -> GpuInstanceProfile:
        """A profile by name ("3g.20gb", case-insensitive, "MIG " prefix optional) or info.id.

        A string of digits is taken as an id ("19"). Raises UnknownProfileError (a KeyError)
        whose message lists the valid profiles.
        """
        found = self._lookup(name_or_id)
        if found is None:
            raise UnknownProfileError(
                "unknown profile %r for %s; valid: %s" % (name_or_id, self.key, self.profile_list())
            )
        return found

    def find_profile(self, name_or_id: Union[str, int]) -> Optional[GpuInstanceProfile]:
        """Like `profile`, but None when there is no such profile."""
        return self._lookup(name_or_id)

    def _lookup(self, name_or_id: Union[str, int]) -> Optional[GpuInstanceProfile]:
        if isinstance(name_or_id, bool):
            return None
        if isinstance(name_or_id, int):
            return self._by_id(name_or_id)
        text = str(name_or_id).strip().lower()
        if text.startswith("mig "):
            text = text[4:].strip()
        if text.isdigit():
            return self._by_id(int(text))
        for p in self.profiles:
            if p.name.lower() == text:
                return p
        for p in self.profiles:
            if text in (a.lower() for a in p.aliases):
                return p
        return None

    def _by_id(self, profile_id: int) -> Optional[GpuInstanceProfile]:
        for p in self.profiles:
            if p.id == profile_id:
                return p
        return None

    def profile_by_enum(self, enum: int) -> Optional[GpuInstanceProfile]:
        for p in self.profiles:
            if p.enum == enum:
                return p
        return None

    def profile_list(self) -> str:
        """ "1g.5gb (19), 1g.5gb+me (20), ..." for messages."""
        return ", ".join("%s (%d)" % (p.name, p.id) for p in self.profiles)

    @property
    def full_profile(self) -> GpuInstanceProfile:
        """The profile that takes the whole GPU (7g on 8-slice GPUs, 4g on A30)."""
        return max(self.profiles, key=lambda p: (p.memory_slices, p.compute_slices))

    @property
    def engines(self) -> Engines:
        """The GPU's engines that instances can own: those of the whole-GPU instance."""
        return self.full_profile.engines

    @property
    def names(self) -> Tuple[str, ...]:
        """Every spelling `find_model` accepts for this model (key, aliases, NVML names)."""
        return (self.key, *self.aliases, *self.nvml_names)


# --------------------------------------------------------------------------------------------
# Compute instance profiles: which CI sizes each GI size allows (reference table), with counts.
# (ci slices, max count, compute-slice placements); the last row of each GI size is the default.
_CI_TABLE: Dict[int, Tuple[Tuple[int, int, Tuple[int, ...]], ...]] = {
    1: ((1, 1, (0,)),),
    2: ((1, 2, (0, 1)), (2, 1, (0,))),
    3: ((1, 3, (0, 1, 2)), (2, 1, (0,)), (3, 1, (0,))),
    4: ((1, 4, (0, 1, 2, 3)), (2, 2, (0, 2)), (4, 1, (0,))),
    7: ((1, 7, tuple(range(7))), (2, 3, (0, 2, 4)), (3, 2, (0, 4)), (4, 1, (0,)), (7, 1, (0,))),
}


def _compute_profiles(
    gi_name: str, gi_slices: int, gi_sms: int, base_sms: Dict[int, int]
) -> Tuple[ComputeProfile, ...]:
    """CI profiles of one GI profile.

    `base_sms` maps a slice count to the SMs of the model's plain Ng profile: a c-slice CI has the
    SMs of the plain cg GI (A100: 14 per slice; H100: 16, 32, 60, 64), and never so many that
    `max_count` of them exceed the GI; without a plain cg profile, GI SMs * c / g. 1-slice GIs
    (1g, 1g+me, 1g.10gb-style) have only their full 1c CI.
    """
    rows = _CI_TABLE[gi_slices]
    out: List[ComputeProfile] = []
    last = len(rows) - 1
    for i, (slices, count, placements) in enumerate(rows):
        default = i == last
        if default:
            sms = gi_sms
            name = gi_name
        else:
            sms = min(base_sms.get(slices, gi_sms * slices // gi_slices), gi_sms // count)
            name = "%dc.%s" % (slices, gi_name)
        out.append(
            ComputeProfile(
                id=CI_PROFILE_ID_BY_SLICES[slices],
                slices=slices,
                max_count=count,
                placements=placements,
                multiprocessor_count=sms,
                default=default,
                name=name,
            )
        )
    return tuple(out)


@dataclass(frozen=True)
class _Row:
    """One line of a model's profile table, before compute profiles are attached."""

    enum: int
    id: int
    name: str
    compute_slices: int
    memory_slices: int
    memory_mib: int
    sms: int
    engines: Engines
    max_count: int
    placements: Tuple[int, ...]
    driver_order: Tuple[int, ...]
    min_driver: int
    inferred_fields: Tuple[str, ...]
    aliases: Tuple[str, ...] = ()


def _build_profiles(rows: Iterable[_Row]) -> Tuple[GpuInstanceProfile, ...]:
    rows = tuple(rows)
    plain_enums = (GI_PROFILE_1_SLICE, GI_PROFILE_2_SLICE, GI_PROFILE_3_SLICE, GI_PROFILE_4_SLICE)
    base_sms: Dict[int, int] = {r.compute_slices: r.sms for r in rows if r.enum in plain_enums}
    out: List[GpuInstanceProfile] = []
    for r in rows:
        out.append(
            GpuInstanceProfile(
                enum=r.enum,
                id=r.id,
                name=r.name,
                compute_slices=r.compute_slices,
                memory_slices=r.memory_slices,
                memory_mib=r.memory_mib,
                multiprocessor_count=r.sms,
                engines=r.engines,
                max_count=r.max_count,
                placements=r.placements,
                driver_order=r.driver_order,
                compute_profiles=_compute_profiles(r.name, r.compute_slices, r.sms, base_sms),
                min_driver=r.min_driver,
                inferred=bool(r.inferred_fields),
                inferred_fields=r.inferred_fields,
                aliases=r.aliases,
            )
        )
    return tuple(out)


# --------------------------------------------------------------------------------------------
# 8-memory-slice / 7-compute-slice GPUs (A100, H100, H200): shared shape of the table.
#
# Driver order (no placement given): 1g lands in 6, 4, 5, 0, 1, 2, 3 [obs]. The other orders are
# inferred so that `-cgi 19,19,14,9` fails and `-cgi 9,19,14,19` works, as observed: 3g tries 4
# then 0 (a first 3g.20gb lands at 4:4), 2g tries 4, 2, 0; 1g.10gb-style tries 6, 4, 2, 0.
_ORDER_1G = (6, 4, 5, 0, 1, 2, 3)
_ORDER_1G_REV2 = (6, 4, 2, 0)
_ORDER_2G = (4, 2, 0)
_ORDER_3G = (4, 0)

# (enum, id, compute slices, memory slices, max, placements, driver order, driver order inferred)
_SHAPE_8: Tuple[Tuple[int, int, int, int, int, Tuple[int, ...], Tuple[int, ...], bool], ...] = (
    (GI_PROFILE_1_SLICE, 19, 1, 1, 7, (0, 1, 2, 3, 4, 5, 6), _ORDER_1G, False),
    (GI_PROFILE_1_SLICE_REV1, 20, 1, 1, 1, (0, 1, 2, 3, 4, 5, 6), _ORDER_1G, True),
    (GI_PROFILE_1_SLICE_REV2, 15, 1, 2, 4, (0, 2, 4, 6), _ORDER_1G_REV2, True),
    (GI_PROFILE_2_SLICE, 14, 2, 2, 3, (0, 2, 4), _ORDER_2G, True),
    (GI_PROFILE_3_SLICE, 9, 3, 4, 2, (0, 4), _ORDER_3G, True),
    (GI_PROFILE_4_SLICE, 5, 4, 4, 1, (0,), (0,), False),
    (GI_PROFILE_7_SLICE, 0, 7, 8, 1, (0,), (0,), False),
)


def _rows_8(
    names: Tuple[str, str, str, str, str, str, str],
    memory_mib: Tuple[int, int, int, int, int, int, int],
    sms: Tuple[int, int, int, int, int, int, int],
    engines: Tuple[Engines, Engines, Engines, Engines, Engines, Engines, Engines],
    rev2_min_driver: int,
    inferred: Tuple[str, ...],
    row_inferred: Optional[Tuple[Tuple[str, ...], ...]] = None,
    aliases: Optional[Tuple[Tuple[str, ...], ...]] = None,
) -> Tuple[_Row, ...]:
    """Rows of an 8-slice model in the order of `_SHAPE_8`: 1g, 1g+me, 1g.Xgb (REV2), 2g, 3g, 4g, 7g.

    `inferred` applies to every row, `row_inferred` adds fields per row (transcripts that show
    only some rows); `aliases` gives per row the names other drivers use."""
    out: List[_Row] = []
    for i, (enum, pid, cs, ms, mx, placements, order, order_inferred) in enumerate(_SHAPE_8):
        extra = row_inferred[i] if row_inferred else ()
        fields = tuple(f for f in inferred if f not in extra) + tuple(extra)
        fields += ("driver_order",) if order_inferred else ()
        min_driver = 0
        if enum == GI_PROFILE_1_SLICE_REV1:
            min_driver = MIN_DRIVER_MEDIA_EXTENSIONS
        elif enum == GI_PROFILE_1_SLICE_REV2:
            min_driver = rev2_min_driver
        out.append(
            _Row(
                enum=enum,
                id=pid,
                name=names[i],
                compute_slices=cs,
                memory_slices=ms,
                memory_mib=memory_mib[i],
                sms=sms[i],
                engines=engines[i],
                max_count=mx,
                placements=placements,
                driver_order=order,
                min_driver=min_driver,
                inferred_fields=fields,
                aliases=aliases[i] if aliases else (),
            )
        )
    return tuple(out)


def _gib(printed: float) -> int:
    """NVML's memorySizeMB for the GiB `nvidia-smi mig -lgip` prints: the 32 MiB multiple that
    prints so (21.62 -> 22144 MiB, i.e. 21.625)."""
    return round(printed * 1024 / 32) * 32


def _e(decoders: int, copy_engines: int, jpeg: int, ofa: int) -> Engines:
    return Engines(decoders=decoders, copy_engines=copy_engines, jpeg=jpeg, ofa=ofa)


_DATA = ("memory_mib", "multiprocessor_count", "engines")

# A100 engines [obs on A100-40GB]: DEC/CE/JPG/OFA.
_A100_ENGINES = (
    _e(0, 1, 0, 0),
    _e(1, 1, 1, 1),
    _e(1, 1, 0, 0),
    _e(1, 2, 0, 0),
    _e(2, 3, 0, 0),
    _e(2, 4, 0, 0),
    _e(5, 7, 1, 1),
)
# H100 engines [obs on H100-80GB SXM; the same on the H100 PCIe and H200 transcripts].
_HOPPER_ENGINES = (
    _e(1, 1, 1, 0),
    _e(1, 1, 1, 1),
    _e(1, 1, 1, 0),
    _e(2, 2, 2, 0),
    _e(3, 3, 3, 0),
    _e(4, 4, 4, 0),
    _e(7, 8, 7, 1),
)

_A100_40GB = MigModel(
    key="A100-SXM4-40GB",
    aliases=("A100-40GB", "A100-PCIE-40GB", "A100-SXM-40GB"),
    nvml_names=("NVIDIA A100-SXM4-40GB", "NVIDIA A100-PCIE-40GB"),
    # 20B1 A100 PCIe 40GB variant, 20F6 A800 40GB PCIe: same profile names in NVIDIA's configs
    pci_device_ids=(0x20B010DE, 0x20F110DE, 0x20B110DE, 0x20F610DE),
    architecture="ampere",
    memory_slice_count=8,
    compute_slice_count=7,
    memory_total_mib=40960,
    multiprocessor_count=108,
    profiles=_build_profiles(
        _rows_8(
            names=("1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"),
            memory_mib=(4864, 4864, 9856, 9856, 19968, 19968, 40192),
            sms=(14, 14, 14, 28, 42, 56, 98),
            engines=_A100_ENGINES,
            rev2_min_driver=MIN_DRIVER_REV2,
            inferred=(),
        )
    ),
)

_A100_80GB = MigModel(
    key="A100-80GB",
    aliases=("A100-SXM4-80GB", "A100-PCIE-80GB", "A100-80GB-PCIE", "A100-SXM-80GB"),
    nvml_names=("NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe"),
    pci_device_ids=(0x20B210DE, 0x20B510DE, 0x20F310DE, 0x20F510DE),  # + A800-SXM4-80GB, A800 80GB PCIe
    architecture="ampere",
    memory_slice_count=8,
    compute_slice_count=7,
    memory_total_mib=81920,
    multiprocessor_count=108,
    profiles=_build_profiles(
        _rows_8(
            names=("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            memory_mib=(9728, 9728, 19968, 19968, 40192, 40192, 80896),
            sms=(14, 14, 14, 28, 42, 56, 98),
            engines=_A100_ENGINES,  # not in the reference: the A100-40GB figures [inf]
            rev2_min_driver=MIN_DRIVER_REV2,
            inferred=("engines",),
        )
    ),
)

_H100_80GB = MigModel(
    key="H100-80GB",
    aliases=("H100-SXM5-80GB", "H100-SXM-80GB", "H100-SXM", "H100-80GB-HBM3"),
    nvml_names=("NVIDIA H100 80GB HBM3",),
    pci_device_ids=(0x233010DE, 0x232410DE),  # + H800 (SXM, 132 SMs)
    architecture="hopper",
    memory_slice_count=8,
    compute_slice_count=7,
    memory_total_mib=81559,
    multiprocessor_count=132,
    profiles=_build_profiles(
        _rows_8(
            names=("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            memory_mib=(9984, 9984, 20096, 20096, 40448, 40448, 81152),
            sms=(16, 16, 26, 32, 60, 64, 132),
            engines=_HOPPER_ENGINES,
            rev2_min_driver=0,
            inferred=(),
        )
    ),
)

# H100 PCIe is a 114-SM part. The reference has no figures for it: memory, SMs and engines are
# from a public `nvidia-smi mig -lgip` transcript (driver 570.169); placements are [inf].
_H100_PCIE = MigModel(
    key="H100-PCIE-80GB",
    aliases=("H100-PCIE", "H100-80GB-PCIE"),
    nvml_names=("NVIDIA H100 PCIe",),
    pci_device_ids=(0x233110DE, 0x232210DE),  # + H800 PCIe (114 SMs) [inf: same table]
    architecture="hopper",
    memory_slice_count=8,
    compute_slice_count=7,
    memory_total_mib=81559,
    multiprocessor_count=114,
    profiles=_build_profiles(
        _rows_8(
            names=("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"),
            memory_mib=(9984, 9984, 20096, 20096, 40448, 40448, 81152),
            sms=(14, 14, 14, 30, 46, 62, 114),
            engines=_HOPPER_ENGINES,
            rev2_min_driver=0,
            inferred=("memory_mib", "multiprocessor_count", "engines", "placements"),
        )
    ),
)

# H200 141GB (SXM and NVL share profiles in mig-parted). The reference gives names only: memory,
# SMs and engines are from a public `-lgip` transcript (mig-parted issue #120); placements [inf].
_H200 = MigModel(
    key="H200-141GB",
    aliases=("H200", "H200-NVL", "H200-SXM-141GB", "H200-NVL-141GB"),
    nvml_names=("NVIDIA H200", "NVIDIA H200 NVL"),
    pci_device_ids=(0x233510DE, 0x233B10DE),
    architecture="hopper",
    memory_slice_count=8,
    compute_slice_count=7,
    memory_total_mib=143771,
    multiprocessor_count=132,
    profiles=_build_profiles(
        _rows_8(
            names=("1g.18gb", "1g.18gb+me", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb"),
            memory_mib=(16384, 16384, 33024, 33024, 71168, 71168, 143104),
            sms=(16, 16, 26, 32, 60, 64, 132),
            engines=_HOPPER_ENGINES,
            rev2_min_driver=0,
            inferred=("memory_mib", "multiprocessor_count", "engines", "placements"),
        )
    ),
)

# A30-24GB: 4 memory slices, 4 compute slices [obs]. Engines are from the MIG User Guide's A30
# table, not the reference [inf]. 1g tries the upper pair first (2, 3, 0, 1), 2g tries 2 then 0,
# by analogy with the A100 [inf]. Memory: GiB x 1024 rounded to the 32 MiB granule (5.81 -> 5952).
_RowTuple = Tuple[int, int, str, int, int, int, int, Engines, int, Tuple[int, ...], Tuple[int, ...], int]
_A30_ROWS: Tuple[_RowTuple, ...] = (
    # enum, id, name, compute slices, memory slices, MiB, SMs, engines, max, placements, order, driver
    (GI_PROFILE_1_SLICE, 14, "1g.6gb", 1, 1, 5952, 14, _e(0, 1, 0, 0), 4, (0, 1, 2, 3), (2, 3, 0, 1), 0),
    (GI_PROFILE_1_SLICE_REV1, 21, "1g.6gb+me", 1, 1, 5952, 14, _e(1, 1, 1, 1), 1, (0, 1, 2, 3), (2, 3, 0, 1),
     MIN_DRIVER_MEDIA_EXTENSIONS),
    (GI_PROFILE_2_SLICE, 5, "2g.12gb", 2, 2, 11968, 28, _e(2, 2, 0, 0), 2, (0, 2), (2, 0), 0),
    (GI_PROFILE_2_SLICE_REV1, 6, "2g.12gb+me", 2, 2, 11968, 28, _e(2, 2, 1, 1), 1, (0, 2), (2, 0),
     MIN_DRIVER_REV2),
    (GI_PROFILE_4_SLICE, 0, "4g.24gb", 4, 4, 24000, 56, _e(4, 4, 1, 1), 1, (0,), (0,), 0),
)  # fmt: skip

_A30 = MigModel(
    key="A30-24GB",
    aliases=("A30", "A30-PCIE-24GB"),
    nvml_names=("NVIDIA A30",),
    pci_device_ids=(0x20B710DE,),
    architecture="ampere",
    memory_slice_count=4,
    compute_slice_count=4,
    memory_total_mib=24576,
    multiprocessor_count=56,
    profiles=_build_profiles(
        _Row(
            enum=enum,
            id=pid,
            name=name,
            compute_slices=cs,
            memory_slices=ms,
            memory_mib=mib,
            sms=sms,
            engines=engines,
            max_count=mx,
            placements=placements,
            driver_order=order,
            min_driver=min_driver,
            inferred_fields=("engines", "driver_order") if len(placements) > 1 else ("engines",),
        )
        for enum, pid, name, cs, ms, mib, sms, engines, mx, placements, order, min_driver in _A30_ROWS
    ),
)

# ---- models NVIDIA's mig-parted configs name (mig-parted examples, the GPU operator's ConfigMap).
# Each figure is from the `nvidia-smi mig -lgip` transcript cited, or listed in inferred_fields.
# Placements and driver orders are those of the H100 [inf]. Sizes belong to a model, never to a
# profile name: 1g.18gb is 16.00 GiB on the H200 and 17.50 GiB on the GH200 144G.
_HOPPER_OBSERVED_4 = ((), (), (), (), _DATA, _DATA, _DATA)  # rows 1g .. 2g shown, 3g .. 7g not

# H100 NVL 94GB and H800 NVL: gpu-operator PR #900 / mig-parted PR #101 (1g.12gb 10.75 GiB 16 SMs,
# 1g.24gb 21.62 GiB 26 SMs, 2g.24gb 32 SMs; 3g.47gb 46.38 GiB in the PR #101 review). 4g and 7g
# sizes and the 3g+ SMs and engines follow the H100 SXM [inf].
_H100_NVL = MigModel(
    key="H100-NVL-94GB",
    aliases=("H100-NVL", "H800-NVL", "H800-NVL-94GB"),
    nvml_names=("NVIDIA H100 NVL", "NVIDIA H800 NVL"),
    pci_device_ids=(0x232110DE, 0x233A10DE),
    architecture="hopper",
    memory_slice_count=8,
    compute_slice_count=7,
    memory_total_mib=95830,
    multiprocessor_count=132,
    profiles=_build_profiles(
        _rows_8(
            names=("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb"),
            memory_mib=(
                _gib(10.75),
                _gib(10.75),
                _gib(21.62),
                _gib(21.62),
                _gib(46.38),
                _gib(46.38),
                _gib(93.00),
            ),
            sms=(16, 16, 26, 32, 60, 64, 132),
            engines=_HOPPER_ENGINES,
            rev2_min_driver=0,
            inferred=("placements",),
            row_inferred=((), (), (), (), ("multiprocessor_count", "engines"), _DATA, _DATA),
        )
    ),
)

# GH200 144G HBM3e: mig-parted PR #139 (1g.18gb 17.50 GiB 16 SMs, 1g.36gb 35.25 GiB 26 SMs,
# 2g.36gb 32 SMs); 3g/4g/7g [inf] as the H100 SXM's proportions.
_GH200_144 = MigModel(
    key="GH200-144GB",
    aliases=("GH200-144G", "GH200-144G-HBM3E"),
    nvml_names=("NVIDIA GH200 144G HBM3e",),
    pci_device_ids=(0x234810DE,),
    architecture="hopper",
    memory_slice_count=8,
    compute_slice_count=7,
    memory_total_mib=146831,
    multiprocessor_count=132,
    profiles=_build_profiles(
        _rows_8(
            names=("1g.18gb", "1g.18gb+me", "1g.36gb", "2g.36gb", "3g.72gb", "4g.72gb", "7g.144gb"),
            memory_mib=(
                _gib(17.50),
                _gib(17.50),
                _gib(35.25),
                _gib(35.25),
                _gib(70.75),
                _gib(70.75),
                _gib(141.75),
            ),
            sms=(16, 16, 26, 32, 60, 64, 132),
            engines=_HOPPER_ENGINES,
            rev2_min_driver=0,
            inferred=("placements",),
            row_inferred=_HOPPER_OBSERVED_4,
        )
    ),
)


def _hopper_96(
    key: str,
    aliases: Tuple[str, ...],
    nvml: str,
    pci: int,
    arch: str,
    sms: Tuple[int, ...],
    engines: Tuple[Engines, ...],
    total_sms: int,
) -> MigModel:
    """The 96 GB parts NVIDIA's configs group (1g.12gb .. 7g.96gb): no public transcript, so every
    figure is [inf]: sizes the H100 SXM's x 1.2, SMs and engines those of their architecture."""
    return MigModel(
        key=key,
        aliases=aliases,
        nvml_names=(nvml,),
        pci_device_ids=(pci,),
        architecture=arch,
        memory_slice_count=8,
        compute_slice_count=7,
        memory_total_mib=97871,
        multiprocessor_count=total_sms,
        profiles=_build_profiles(
            _rows_8(
                names=("1g.12gb", "1g.12gb+me", "1g.24gb", "2g.24gb", "3g.48gb", "4g.48gb", "7g.96gb"),
                memory_mib=(
                    _gib(11.75),
                    _gib(11.75),
                    _gib(23.62),
                    _gib(23.62),
                    _gib(47.50),
                    _gib(47.50),
                    _gib(95.25),
                ),
                sms=sms,  # type: ignore[arg-type]
                engines=engines,  # type: ignore[arg-type]
                rev2_min_driver=0,
                inferred=(*_DATA, "placements"),
            )
        ),
    )


_H100_96 = _hopper_96(
    "H100-96GB",
    ("H100-SXM-96GB",),
    "NVIDIA H100 96GB HBM3",
    0x233D10DE,
    "hopper",
    (16, 16, 26, 32, 60, 64, 132),
    _HOPPER_ENGINES,
    132,
)
_GH200_96 = _hopper_96(
    "GH200-96GB",
    ("GH200", "GH200-480GB"),
    "NVIDIA GH200 480GB",
    0x234210DE,
    "hopper",
    (16, 16, 26, 32, 60, 64, 132),
    _HOPPER_ENGINES,
    132,
)
_H20 = _hopper_96(
    "H20-96GB",
    ("H20",),
    "NVIDIA H20",
    0x232910DE,
    "hopper",
    (10, 10, 10, 22, 32, 44, 78),
    _HOPPER_ENGINES,
    78,
)
_PG506_96 = _hopper_96(
    "PG506-96GB",
    ("PG506",),
    "NVIDIA PG506-96GB",
    0x20B610DE,
    "ampere",
    (14, 14, 14, 28, 42, 56, 98),
    _A100_ENGINES,
    108,
)

# Blackwell engines [obs on B200, PR #166: 1g 1/2/1/0, +me 1/2/1/1, 1g.45gb 1/2/1/0, 2g 2/4/2/0];
# 3g, 4g, 7g [inf] by the Hopper pattern with two copy engines per slice.
_BLACKWELL_ENGINES = (
    _e(1, 2, 1, 0),
    _e(1, 2, 1, 1),
    _e(1, 2, 1, 0),
    _e(2, 4, 2, 0),
    _e(3, 6, 3, 0),
    _e(4, 8, 4, 0),
    _e(7, 16, 7, 1),
)

# B200: mig-parted PR #166 (Jan 2025) shows 1g.23gb at 22.00 GiB, PR #187 (Mar 2025, another
# driver) at 20.50 GiB; both show 18 SMs, 1g.45gb/2g.45gb 44.25 GiB with 30/36 SMs. The catalog
# keeps 22.00 (the GB200 transcript of mig-parted issue #227 agrees). 3g/4g/7g [inf].
_B200 = MigModel(
    key="B200",
    aliases=("B200-180GB", "B200-SXM-180GB"),
    nvml_names=("NVIDIA B200",),
    pci_device_ids=(0x290110DE,),
    architecture="blackwell",
    memory_slice_count=8,
    compute_slice_count=7,
    memory_total_mib=183359,
    multiprocessor_count=148,
    profiles=_build_profiles(
        _rows_8(
            names=("1g.23gb", "1g.23gb+me", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb"),
            memory_mib=(
                _gib(22.00),
                _gib(22.00),
                _gib(44.25),
                _gib(44.25),
                _gib(88.75),
                _gib(88.75),
                _gib(177.75),
            ),
            sms=(18, 18, 30, 36, 66, 72, 144),
            engines=_BLACKWELL_ENGINES,
            rev2_min_driver=0,
            inferred=("placements",),
            row_inferred=_HOPPER_OBSERVED_4,
        )
    ),
)

# GB200: mig-parted issue #227 (1g.23gb 22.00 GiB 18 SMs, 1g.47gb/2g.47gb 45.50 GiB, 32/38 SMs).
# Earlier drivers (gpu-operator PR #1303) named the 1-slice profiles 1g.24gb (20.00 GiB) and, by
# NVIDIA's configs, the larger ones 3g.95gb, 4g.95gb, 7g.189gb: kept as aliases. 3g/4g/7g [inf].
_GB200 = MigModel(
    key="GB200",
    aliases=("GB200-186GB", "GB200-HGX"),
    nvml_names=("NVIDIA GB200",),
    pci_device_ids=(0x294110DE,),
    architecture="blackwell",
    memory_slice_count=8,
    compute_slice_count=7,
    memory_total_mib=189471,
    multiprocessor_count=152,
    profiles=_build_profiles(
        _rows_8(
            names=("1g.23gb", "1g.23gb+me", "1g.47gb", "2g.47gb", "3g.93gb", "4g.93gb", "7g.186gb"),
            memory_mib=(
                _gib(22.00),
                _gib(22.00),
                _gib(45.50),
                _gib(45.50),
                _gib(91.25),
                _gib(91.25),
                _gib(182.75),
            ),
            sms=(18, 18, 32, 38, 72, 76, 152),
            engines=_BLACKWELL_ENGINES,
            rev2_min_driver=0,
            inferred=("placements",),
            row_inferred=_HOPPER_OBSERVED_4,
            aliases=(("1g.24gb",), ("1g.24gb+me",), (), (), ("3g.95gb",), ("4g.95gb",), ("7g.189gb",)),
        )
    ),
)


def _blackwell_ultra(
    key: str,
    aliases: Tuple[str, ...],
    nvml: str,
    pci: int,
    names: Tuple[str, ...],
    gib: Tuple[float, ...],
    total_mib: int,
) -> MigModel:
    """B300 and GB300: names from NVIDIA's configs; no public transcript, every figure [inf]
    (sizes from the names, SMs and engines the B200's)."""
    return MigModel(
        key=key,
        aliases=aliases,
        nvml_names=(nvml,),
        pci_device_ids=(pci,),
        architecture="blackwell",
        memory_slice_count=8,
        compute_slice_count=7,
        memory_total_mib=total_mib,
        multiprocessor_count=148,
        profiles=_build_profiles(
            _rows_8(
                names=names,  # type: ignore[arg-type]
                memory_mib=tuple(_gib(g) for g in gib),  # type: ignore[arg-type]
                sms=(18, 18, 30, 36, 66, 72, 144),
                engines=_BLACKWELL_ENGINES,
                rev2_min_driver=0,
                inferred=(*_DATA, "placements"),
            )
        ),
    )


_B300 = _blackwell_ultra(
    "B300",
    ("B300-288GB", "B300-SXM6"),
    "NVIDIA B300 SXM6 AC",
    0x318210DE,
    ("1g.34gb", "1g.34gb+me", "1g.67gb", "2g.67gb", "3g.135gb", "4g.135gb", "7g.269gb"),
    (33.00, 33.00, 66.25, 66.25, 133.00, 133.00, 266.25),
    275040,
)
_GB300 = _blackwell_ultra(
    "GB300",
    ("GB300-288GB",),
    "NVIDIA GB300",
    0x31C210DE,
    ("1g.35gb", "1g.35gb+me", "1g.70gb", "2g.70gb", "3g.139gb", "4g.139gb", "7g.278gb"),
    (34.25, 34.25, 68.75, 68.75, 137.75, 137.75, 275.75),
    284208,
)

# RTX PRO 6000 Blackwell Server Edition: 4 memory and 4 compute slices. Observed (bigstack-oss/
# cubecos issue #312, driver 580): 1g.24gb id 14, +me id 21, +gfx id 47, +me.all id 65, 23.12 GiB,
# 46 SMs; engines 1g DEC 1 CE 1 JPG 1 OFA 0, +me OFA 1, +me.all 4 decoders. The ids of the 2g/4g
# profiles follow the A30's (same shape); those of +gfx/-me/+me.all beyond 1g, every 2g/4g
# size, SM count and engine figure are [inf]. -me owns no media engine, +me.all all of them.
_MEDIA_ALL = _e(4, 1, 4, 1)
_RTX_ROWS: Tuple[Tuple[int, int, str, int, int, float, int, Engines, int, Tuple[str, ...]], ...] = (
    # enum, id, name, compute = memory slices, MiB from GiB, SMs, engines, max, inferred fields
    (GI_PROFILE_1_SLICE, 14, "1g.24gb", 1, 1, 23.12, 46, _e(1, 1, 1, 0), 4, ()),
    (GI_PROFILE_1_SLICE_REV1, 21, "1g.24gb+me", 1, 1, 23.12, 46, _e(1, 1, 1, 1), 1, ()),
    (GI_PROFILE_1_SLICE_GFX, 47, "1g.24gb+gfx", 1, 1, 23.12, 46, _e(1, 1, 1, 0), 4, ()),
    (GI_PROFILE_1_SLICE_ALL_ME, 65, "1g.24gb+me.all", 1, 1, 23.12, 46, _MEDIA_ALL, 1, ("engines",)),
    (GI_PROFILE_1_SLICE_NO_ME, 67, "1g.24gb-me", 1, 1, 23.12, 46, _e(0, 1, 0, 0), 4, ("id", "engines")),
    (GI_PROFILE_2_SLICE, 5, "2g.48gb", 2, 2, 46.38, 92, _e(2, 2, 2, 0), 2, ("id", *_DATA)),
    (GI_PROFILE_2_SLICE_GFX, 48, "2g.48gb+gfx", 2, 2, 46.38, 92, _e(2, 2, 2, 0), 2, ("id", *_DATA)),
    (GI_PROFILE_2_SLICE_ALL_ME, 66, "2g.48gb+me.all", 2, 2, 46.38, 92, _e(4, 2, 4, 1), 1, ("id", *_DATA)),
    (GI_PROFILE_2_SLICE_NO_ME, 68, "2g.48gb-me", 2, 2, 46.38, 92, _e(0, 2, 0, 0), 2, ("id", *_DATA)),
    (GI_PROFILE_4_SLICE, 0, "4g.96gb", 4, 4, 93.00, 184, _e(4, 4, 4, 1), 1, ("id", *_DATA)),
    (GI_PROFILE_4_SLICE_GFX, 49, "4g.96gb+gfx", 4, 4, 93.00, 184, _e(4, 4, 4, 1), 1, ("id", *_DATA)),
)  # fmt: skip
_RTX_PLACEMENTS = {1: ((0, 1, 2, 3), (2, 3, 0, 1)), 2: ((0, 2), (2, 0)), 4: ((0,), (0,))}

_RTX_PRO_6000 = MigModel(
    key="RTX-PRO-6000-96GB",
    aliases=("RTX-PRO-6000", "RTX-PRO-6000-BLACKWELL", "RTX-PRO-6000-Blackwell-Server-Edition"),
    nvml_names=("NVIDIA RTX PRO 6000 Blackwell Server Edition",),
    pci_device_ids=(0x2BB510DE,),
    architecture="blackwell",
    memory_slice_count=4,
    compute_slice_count=4,
    memory_total_mib=97887,
    multiprocessor_count=188,
    profiles=_build_profiles(
        _Row(
            enum=enum,
            id=pid,
            name=name,
            compute_slices=slices,
            memory_slices=mem_slices,
            memory_mib=_gib(gib),
            sms=sms,
            engines=engines,
            max_count=mx,
            placements=_RTX_PLACEMENTS[mem_slices][0],
            driver_order=_RTX_PLACEMENTS[mem_slices][1],
            min_driver=0,
            inferred_fields=fields + ("placements",) + (("driver_order",) if mem_slices < 4 else ()),
        )
        for enum, pid, name, slices, mem_slices, gib, sms, engines, mx, fields in _RTX_ROWS
    ),
)

MODELS: Dict[str, MigModel] = {
    m.key: m
    for m in (
        _A100_40GB,
        _A100_80GB,
        _H100_80GB,
        _H100_PCIE,
        _H200,
        _A30,
        _H100_NVL,
        _H100_96,
        _GH200_96,
        _GH200_144,
        _H20,
        _PG506_96,
        _B200,
        _GB200,
        _B300,
        _GB300,
        _RTX_PRO_6000,
    )
}

# NVIDIA GPUs without MIG that NVIDIA's mig-parted configs or common fleets name: a device-filter
# of only these selects nothing MIG can change (the DGX Station's display GPU, 1FB0, is in
# mig-parted's DGX Station example).
NON_MIG_PCI_DEVICES: Dict[int, str] = {
    0x1FB0: "DGX Display (T1000-class)",
    0x26B9: "L40S",
    0x2230: "RTX A6000",
    0x2236: "A10",
    0x1EB8: "T4",
    0x1DB5: "V100-SXM2-32GB",
}

_NAME_SEPARATORS = re.compile(r"[\s_]+")


def normalize_model_name(text: str) -> str:
    """Case-folded, "NVIDIA " prefix dropped, runs of spaces/underscores as one "-"."""
    t = text.strip().lower()
    if t.startswith("nvidia"):
        t = t[len("nvidia") :].lstrip(" _-")
    return _NAME_SEPARATORS.sub("-", t).strip("-")


def _index() -> Dict[str, MigModel]:
    out: Dict[str, MigModel] = {}
    for m in MODELS.values():
        for n in m.names:
            out.setdefault(normalize_model_name(n), m)
    return out


_BY_NAME = _index()


def find_model(text: str) -> Optional[MigModel]:
    """A model by key, alias or NVML name (case-insensitive, "NVIDIA " prefix optional)."""
    return _BY_NAME.get(normalize_model_name(text))


def model_for_pci_device_id(device_id: int) -> Optional[MigModel]:
    """A model by PCI id: the full 0x20B010DE form or the bare device id 0x20B0."""
    if device_id < 0:
        return None
    if device_id <= 0xFFFF:
        device_id = (device_id << 16) | NVIDIA_VENDOR_ID
    for m in MODELS.values():
        if device_id in m.pci_device_ids:
            return m
    return None


def model_for_gpu(name: str, pci_device_id: Optional[int] = None) -> Optional[MigModel]:
    """The model of a GPU as NVML reports it: by PCI device id first, then by name."""
    if pci_device_id is not None:
        m = model_for_pci_device_id(pci_device_id)
        if m is not None:
            return m
    return find_model(name)
