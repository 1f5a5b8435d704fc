"""The rules of `carve:` and its resolved view per GPU, for the plan stage.

Load time (`check_carve`, one of `checks.CHECKS`): every rule that the file alone decides, with
the MIG layouts checked against the models the file names (`gpus: {model: ...}` or a node's
model label) or, where it names none, against every catalog model. Combinations on one GPU
(MPS with the limiter, the limiter on a MIG GPU, MPS limits over an instance's memory) are
checked where the file makes them certain: the GPU is selected by index or by every GPU of a
node, and no later entry might override the outcome.

Plan time (`desired_for`, called through `Fleet.desired_for`): the entries that apply to one
live GPU, resolved (later entries win per kind), with the MIG layout solved for the live model
and the same combination rules, now certain; what is wrong comes back as located `SpecIssue`s
in `DesiredGpu.problems`, never as an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from gpuops.core.mig.catalog import (
    MODELS,
    ComputeProfile,
    GpuInstanceProfile,
    MigModel,
    UnknownProfileError,
    find_model,
    normalize_model_name,
)
from gpuops.core.mig.placement import Placement, PlacementResult, check_layout, solve
from gpuops.core.tenant_table import TenantSpec
from gpuops.core.units import format_bytes
from gpuops.spec.desired import (
    ALL_TENANTS,
    CI_LEVEL_RE,
    DEFAULT_MPS_LOG_DIRECTORY,
    DEFAULT_MPS_PIPE_DIRECTORY,
    KINDS,
    MAX_TENANTS,
    MIB,
    PROFILE_MODELS,
    CarveEntry,
    GpuSelect,
    LimiterSpec,
    LimiterTenantSpec,
    MigSpec,
    MpsSpec,
    Select,
    format_exact_bytes,
    format_share,
    parse_placement,
)
from gpuops.spec.errors import DataPath, SpecIssue, format_path, show
from gpuops.spec.selectors import Selector, parse_gpu_indices, parse_selector
from gpuops.spec.source import Document
from gpuops.spec.types import closest

if TYPE_CHECKING:
    from gpuops.spec.model import Fleet, Node

MODEL_LABELS = ("nvidia.com/gpu.product", "gpu-model", "model")
"""Node labels that say the model of a node's GPUs, first found wins (GPU feature discovery's
nvidia.com/gpu.product, or a label of your own)."""


# ==== MIG layouts ===============================================================================


@dataclass(frozen=True)
class MigInstance:
    """One GPU instance of a desired layout and the compute instances to create in it."""

    placement: Placement
    compute: tuple[ComputeProfile, ...]  # the CIs, largest first
    compute_starts: tuple[int, ...]  # their compute-slice starts inside the GI, same order


@dataclass(frozen=True)
class MigLayout:
    """A desired MIG layout on one model, as `PlacementResult`: ok, placements (sorted by start),
    reason (one sentence when not ok); plus the compute instances of each GPU instance.

    `path` is where in the mig: entry the reason lies (("profiles",), ("compute", "3g.40gb"),
    ...) and `at_key` whether it is that key rather than its value."""

    ok: bool
    placements: tuple[Placement, ...]
    reason: str
    instances: tuple[MigInstance, ...] = ()
    model: str = ""
    path: tuple[str | int, ...] = ()
    at_key: bool = False

    def __bool__(self) -> bool:
        return self.ok

    @property
    def result(self) -> PlacementResult:
        return PlacementResult(self.ok, self.placements, self.reason)


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


def _ci_key(name: str) -> str:
    return name.split(".", 1)[0] if CI_LEVEL_RE.match(name) else name


def place_compute_instances(
    gi: GpuInstanceProfile, names: Sequence[str]
) -> tuple[tuple[ComputeProfile, ...], tuple[int, ...]] | str:
    """The compute instances `names` inside one `gi`, placed; or why they do not fit."""
    profiles: list[ComputeProfile] = []
    for name in names:
        full = CI_LEVEL_RE.match(name)
        if full and full.group(2) != gi.name:
            return f"{name} is not a compute profile of {gi.name} (write {full.group(1)}c)"
        try:
            profiles.append(gi.compute_profile(_ci_key(name)))
        except UnknownProfileError:
            valid = ", ".join(f"{cp.slices}c" for cp in gi.compute_profiles)
            return f"{gi.name} has no {name} compute instance (valid: {valid})"
    if not profiles:
        return f"no compute instances listed for {gi.name}"
    counts: dict[int, int] = {}
    for cp in profiles:
        counts[cp.slices] = counts.get(cp.slices, 0) + 1
    for cp in sorted({cp.slices: cp for cp in profiles}.values(), key=lambda c: -c.slices):
        if counts[cp.slices] > cp.max_count:
            return (
                f"{gi.name}: at most {cp.max_count} {cp.slices}c compute instance"
                f"{'' if cp.max_count == 1 else 's'} (asked for {counts[cp.slices]})"
            )
    order = sorted(profiles, key=lambda c: -c.slices)
    listing = ", ".join(f"{cp.slices}c" for cp in order)
    total = sum(cp.slices for cp in order)
    if total > gi.compute_slices:
        return f"{listing} need {total} compute slices, a {gi.name} has {gi.compute_slices}"
    starts: list[int] = []

    def place(i: int, mask: int) -> bool:
        if i == len(order):
            return True
        cp = order[i]
        for s in cp.placements:
            bits = ((1 << cp.slices) - 1) << s
            if mask & bits or s + cp.slices > gi.compute_slices:
                continue
            starts.append(s)
            if place(i + 1, mask | bits):
                return True
            starts.pop()
        return False

    if not place(0, 0):
        return (
            f"{listing} have no arrangement inside a {gi.name} (allowed compute-slice starts differ by size)"
        )
    return tuple(order), tuple(starts)


def _as_desired(mig: DesiredMig | MigSpec | CarveEntry) -> DesiredMig:
    if isinstance(mig, DesiredMig):
        return mig
    if isinstance(mig, CarveEntry):
        if mig.mig is None:
            raise ValueError("the carve entry has no mig:")
        return desired_mig(mig.mig)
    return desired_mig(mig)


def mig_layout_for_model(mig: DesiredMig | MigSpec | CarveEntry, model: MigModel | str) -> MigLayout:
    """The layout `mig` asks for on `model` (a MigModel or any name `find_model` reads): the GPU
    instances placed by the solver (or the explicit placements checked), each with its compute
    instances. Not ok: `reason` is the solver's sentence, `path` where in mig: it lies.

    MIG off, or mode only (`keeps_instances`): ok with no instances."""
    found = model if isinstance(model, MigModel) else find_model(model)
    if found is None:
        return MigLayout(
            False, (), f"{show(str(model))} is not a MIG model gpuops knows (see gpuops mig models)"
        )
    m = found
    d = _as_desired(mig)
    if not d.enabled or d.keeps_instances:
        return MigLayout(True, (), "", model=m.key)
    if d.placements is not None:
        pins: list[Placement] = []
        for i, (name, start) in enumerate(d.placements):
            gi = m.find_profile(name)
            if gi is None:
                return MigLayout(False, (), _unknown_profile(name, m), model=m.key, path=("placements", i))
            pins.append(Placement(gi.name, gi.id, start, gi.memory_slices))
        result = check_layout(m, pins)
        where: tuple[str | int, ...] = ("placements",)
    else:
        for name, _ in d.profiles or ():
            if m.find_profile(name) is None:
                return MigLayout(
                    False, (), _unknown_profile(name, m), model=m.key, path=("profiles", name), at_key=True
                )
        result = solve(m, dict(d.profiles or ()))
        where = ("profiles",)
    if not result.ok:
        return MigLayout(False, (), result.reason, model=m.key, path=where)
    instances: list[MigInstance] = []
    for p in result.placements:
        gi = m.profile(p.profile)
        split = d.compute_split(gi.name)
        if split is None:
            instances.append(MigInstance(p, (gi.default_compute_profile,), (0,)))
            continue
        placed = place_compute_instances(gi, split)
        if isinstance(placed, str):
            return MigLayout(False, (), placed, model=m.key, path=("compute", gi.name))
        instances.append(MigInstance(p, placed[0], placed[1]))
    return MigLayout(True, result.placements, "", tuple(instances), model=m.key)


def _unknown_profile(name: str, model: MigModel) -> str:
    return f"unknown profile {show(name)} for {model.key}; valid: {', '.join(p.name for p in model.profiles)}"


def _check_args(d: DesiredMig) -> str:
    if d.placements is not None:
        return " ".join(f"{n}:{s}" for n, s in d.placements)
    return " ".join(n for n, c in d.profiles or () for _ in range(c))


# ==== the other kinds, resolved ===================================================================


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
class DesiredTenant:
    """One tenant's line in the limiter table (fields as gpuops.core.tenant_table.TenantSpec)."""

    name: str  # a team, or * for tenants without a line
    memory: int | None  # bytes; None = no cap
    compute: float | None  # percent; None = no share
    policy: str  # fixed-share | burst-share | best-effort (resolved)
    klass: str  # online | offline


@dataclass(frozen=True)
class DesiredLimiter:
    """The limiter tenant lines wanted for a GPU. Not enabled: no lines for it."""

    enabled: bool
    tenants: tuple[DesiredTenant, ...]
    entry: int
    location: str

    def tenant_specs(self, gpus: Sequence[str] = ()) -> tuple[TenantSpec, ...]:
        """The lines for gpuops.node.limiter.write_table, for the GPUs `gpus` (indices or UUIDs)."""
        if not self.enabled:
            return ()
        return tuple(
            TenantSpec(
                name=t.name,
                memory=t.memory,
                compute=t.compute,
                policy=t.policy,
                klass=t.klass,
                gpus=tuple(gpus),
            )
            for t in self.tenants
        )


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
            DesiredTenant(k, v.memory, v.compute, effective_policy(spec, v), v.klass)
            for k, v in spec.tenants.items()
        ),
        entry=entry,
        location=location or f"carve[{entry}]",
    )


@dataclass(frozen=True)
class DesiredGpu:
    """What fleet.yaml wants on one GPU. None = not specified: leave it as it is.

    `mig_layout`: the MIG layout solved for the GPU's model (when MIG is wanted on, with
    instances, and the model is known). `problems`: located errors of the file for this GPU
    (a layout that does not fit the live model, MPS with the limiter, ...); the plan should
    refuse the GPU while there are any."""

    node: str
    index: int
    uuid: str | None
    model: str | None  # catalog key, or the model as given
    mig: DesiredMig | None = None
    mps: DesiredMps | None = None
    limiter: DesiredLimiter | None = None
    mig_layout: MigLayout | None = None
    problems: tuple[SpecIssue, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def empty(self) -> bool:
        return self.mig is None and self.mps is None and self.limiter is None

    def mps_per_instance(self, live_mig_mode: bool | None = None) -> bool | None:
        """Whether MPS daemons go per MIG instance: MIG on after the change. None: unknown."""
        if self.mig is not None:
            return self.mig.enabled
        return live_mig_mode


# ==== matching GPUs ===============================================================================

NO, MAYBE, YES = 0, 1, 2


@dataclass(frozen=True)
class GpuView:
    """A GPU as far as it is known: at plan time everything (live), at load time the node, the
    index when an entry names it (None: a GPU that no entry names by index) and the model its
    node's labels say."""

    node: Node
    index: int | None
    uuid: str | None
    model: str | None  # catalog key or model text; None: unknown
    live: bool
    memory: int | None = None  # bytes, when known
    mig_mode: bool | None = None  # live MIG mode, when known

    @property
    def mig_model(self) -> MigModel | None:
        return find_model(self.model) if self.model else None

    @property
    def mig_capable(self) -> bool | None:
        """True/False when known; None at load time for a model label outside the catalog."""
        if self.mig_model is not None:
            return True
        return False if self.live and self.model is not None else None

    @property
    def mig_doubtful(self) -> bool:
        """Load time: the node's label names a model outside the MIG catalog (a GPU without MIG,
        or one gpuops does not know): whether an entry by node or model applies is left to plan."""
        return not self.live and self.model is not None and self.mig_model is None

    @property
    def memory_total(self) -> int | None:
        if self.memory is not None:
            return self.memory
        m = self.mig_model
        return m.memory_total_mib * MIB if m is not None else None

    def describe(self) -> str:
        return (
            f"{self.node.name} GPU {self.index}"
            if self.index is not None
            else f"the GPUs of {self.node.name}"
        )


def same_model(a: str, b: str) -> bool:
    """Whether two model names are the same GPU model (catalog spellings, NVML names, labels)."""
    ma, mb = find_model(a), find_model(b)
    if ma is not None or mb is not None:
        return ma is mb
    return normalize_model_name(a) == normalize_model_name(b)


def node_model(node: Node) -> tuple[str | None, str]:
    """The model a node's labels say (catalog key when it is one), and the label's key."""
    for key in MODEL_LABELS:
        value = node.labels.get(key)
        if value:
            found = find_model(value)
            return (found.key if found is not None else value), key
    return None, ""


class _Selectors:
    """Parsed selectors of the entries, and which entries select which node, cached."""

    def __init__(self, entries: Sequence[CarveEntry]) -> None:
        self.nodes: list[Selector] = []
        self.indices: list[frozenset[int] | None] = []
        for entry in entries:
            self.nodes.append(parse_selector(entry.select.nodes))
            gpus = entry.select.gpus
            self.indices.append(
                parse_gpu_indices(gpus.indices) if gpus is not None and gpus.indices is not None else None
            )
        self._hits: dict[str, tuple[Node, list[bool]]] = {}

    def selects(self, i: int, node: Node) -> bool:
        """Whether entry i's node selector selects `node`."""
        cached = self._hits.get(node.name)
        if cached is None or cached[0] is not node:
            cached = (node, [sel.matches(node.name, node.labels) for sel in self.nodes])
            self._hits[node.name] = cached
        return cached[1][i]


def selectors_for(fleet: Fleet) -> _Selectors:
    """The fleet's parsed carve selectors, kept on the fleet while its carve list is the same."""
    key = (id(fleet.carve), len(fleet.carve))
    cached = fleet._carve_selectors
    if isinstance(cached, tuple) and cached[0] == key and isinstance(cached[1], _Selectors):
        return cached[1]
    sel = _Selectors(fleet.carve)
    fleet._carve_selectors = (key, sel)
    return sel


def _explicit(gpus: GpuSelect | None) -> bool:
    return gpus is not None and (gpus.indices is not None or gpus.uuids is not None)


def _match(entry: CarveEntry, i: int, sel: _Selectors, gpu: GpuView) -> int:
    """Whether entry i selects the GPU: YES, NO, or MAYBE (not known before plan time)."""
    if not sel.selects(i, gpu.node):
        return NO
    gpus = entry.select.gpus
    if gpus is None:
        return YES
    result = YES
    indices = sel.indices[i]
    if indices is not None and (gpu.index is None or gpu.index not in indices):
        return NO
    if gpus.uuids is not None:
        if gpu.live:
            if gpu.uuid is None or gpu.uuid.lower() not in {u.lower() for u in gpus.uuids}:
                return NO
        else:
            result = MAYBE
    if gpus.model is not None:
        if gpu.model is None:
            result = MAYBE
        elif not any(same_model(m, gpu.model) for m in gpus.model):
            return NO
    return result


def _match_kind(entry: CarveEntry, i: int, sel: _Selectors, gpu: GpuView, kind: str) -> int:
    m = _match(entry, i, sel, gpu)
    # mig: on a GPU without MIG, an entry selecting by node or model skips it (as mig-parted
    # skips such GPUs under devices: all); one naming it by index or UUID is an error (below).
    if kind == "mig" and m != NO:
        if gpu.mig_capable is False:
            return NO
        if gpu.mig_doubtful and not _explicit(entry.select.gpus):
            return MAYBE
    return m


@dataclass(frozen=True)
class Winner:
    entry: int | None  # the entry that decides this kind for the GPU; None: no entry does
    certain: bool  # False: a later entry may still select the GPU (known at plan time)


def resolve(entries: Sequence[CarveEntry], sel: _Selectors, gpu: GpuView) -> dict[str, Winner]:
    out: dict[str, Winner] = {}
    for kind in KINDS:
        last: int | None = None
        maybe_after = False
        for i, entry in enumerate(entries):
            if getattr(entry, kind) is None:
                continue
            m = _match_kind(entry, i, sel, gpu, kind)
            if m == YES:
                last, maybe_after = i, False
            elif m == MAYBE:
                maybe_after = True
        out[kind] = Winner(last, not maybe_after)
    return out


# ==== rules on one GPU ============================================================================


class Emit(Protocol):
    def __call__(self, path: DataPath, message: str, hint: str = "", *, at_key: bool = False) -> None: ...


@dataclass
class _Grouped:
    """Rules on one GPU fire for many GPUs alike: one line per place and message, naming the first
    GPU and how many more."""

    found: dict[tuple[DataPath, str, str, bool], list[str]] = field(default_factory=dict)

    def add(self, path: DataPath, message: str, hint: str, at_key: bool, where: str) -> None:
        places = self.found.setdefault((path, message, hint, at_key), [])
        if where not in places:
            places.append(where)

    def flush(self, emit: Emit) -> None:
        for (path, message, hint, at_key), places in self.found.items():
            more = len(places) - 1
            on = places[0] + (f" and {more} more GPU{'s' if more > 1 else ''}" if more else "")
            emit(path, f"{message}, on {on}", hint, at_key=at_key)


def _instance_memory(name: str, model: MigModel | None) -> int | None:
    """Memory of a GPU instance profile: on the model; model unknown: the most any model has."""
    if model is not None:
        gi = model.find_profile(name)
        return gi.memory_mib * MIB if gi is not None else None
    sizes = [gi.memory_mib for key in PROFILE_MODELS.get(name, ()) if (gi := MODELS[key].find_profile(name))]
    return max(sizes) * MIB if sizes else None


def _mps_bound(entries: Sequence[CarveEntry], gpu: GpuView, mig: Winner) -> tuple[int, str] | None:
    """The memory one MPS client can have at most on the GPU: the smallest MIG instance wanted
    on it, else the GPU's memory; None when not known."""
    if mig.entry is not None and mig.certain:
        spec = entries[mig.entry].mig
        if spec is not None and spec.enabled:
            d = desired_mig(spec)
            names = list(d.profile_counts())
            if names:
                sizes = [(mem, n) for n in names if (mem := _instance_memory(n, gpu.mig_model)) is not None]
                if sizes:
                    mem, name = min(sizes)
                    where = f"carve[{mig.entry}]"
                    return mem, f"the {format_bytes(mem, 2)} of a {name} instance (MIG from {where})"
                return None
            if d.profiles is not None or d.placements is not None:
                return None  # no instances: no daemons
    total = gpu.memory_total
    if total is None:
        return None
    what = gpu.model or "GPU"
    return total, f"the {format_bytes(total, 2)} of the {what}"


def gpu_rules(
    entries: Sequence[CarveEntry], winners: Mapping[str, Winner], gpu: GpuView, add: Callable[..., None]
) -> None:
    """The rules on one GPU's combination of kinds; `add(path, message, hint, at_key)`."""
    mig_w, mps_w, lim_w = winners["mig"], winners["mps"], winners["limiter"]
    mig = entries[mig_w.entry].mig if mig_w.entry is not None and mig_w.certain else None
    mps = entries[mps_w.entry].mps if mps_w.entry is not None and mps_w.certain else None
    lim = entries[lim_w.entry].limiter if lim_w.entry is not None and lim_w.certain else None
    mig_on = (mig is not None and mig.enabled) or (
        mig_w.entry is None and mig_w.certain and gpu.mig_mode is True
    )
    lim_on = lim is not None and lim.enabled and bool(lim.tenants)
    mps_on = mps is not None and mps.enabled

    if mps is not None and mps_on and mps_w.entry is not None:
        bound = _mps_bound(entries, gpu, mig_w)
        if bound is not None:
            limit, what = bound
            base: DataPath = ("carve", mps_w.entry, "mps")
            if mps.pinned_memory_limit is not None and mps.pinned_memory_limit > limit:
                add(
                    (*base, "pinned_memory_limit"),
                    f"{format_exact_bytes(mps.pinned_memory_limit)} is more than {what}",
                    "the limit applies to each client of each MPS daemon (one per GPU or MIG instance)",
                    False,
                )
            for name, tenant in mps.per_tenant.items():
                if tenant.pinned_memory_limit is not None and tenant.pinned_memory_limit > limit:
                    add(
                        (*base, "per_tenant", name, "pinned_memory_limit"),
                        f"{format_exact_bytes(tenant.pinned_memory_limit)} is more than {what}",
                        "the limit applies to each client of each MPS daemon (one per GPU or MIG instance)",
                        False,
                    )

    if lim is not None and lim_on and lim_w.entry is not None:
        if mig_on:
            if mig_w.entry is not None and mig_w.entry > lim_w.entry:
                path: DataPath = ("carve", mig_w.entry, "mig")
                message = f"MIG on a GPU that carve[{lim_w.entry}] gives to the limiter"
            else:
                path = ("carve", lim_w.entry, "limiter")
                source = f"carve[{mig_w.entry}]" if mig_w.entry is not None else "its live MIG mode"
                message = f"the limiter cannot share a GPU in MIG mode (MIG from {source})"
            add(
                path,
                message,
                "MIG instances already split memory and compute; share an instance with MPS instead",
                True,
            )
        if mps_on and mps_w.entry is not None:
            later, earlier = max(lim_w.entry, mps_w.entry), min(lim_w.entry, mps_w.entry)
            kind = "limiter" if later == lim_w.entry else "mps"
            other = "MPS" if kind == "limiter" else "the limiter"
            add(
                ("carve", later, kind),
                f"{'the limiter' if kind == 'limiter' else 'MPS'} and {other} (from carve[{earlier}]) "
                "on the same GPU",
                "use one per GPU: the limiter hands the GPU to one tenant at a time, "
                "which serializes MPS clients",
                True,
            )
        total = gpu.memory_total
        if total is not None:
            for name, lt in lim.tenants.items():
                if lt.memory is not None and lt.memory > total:
                    add(
                        ("carve", lim_w.entry, "limiter", "tenants", name, "memory"),
                        f"{format_exact_bytes(lt.memory)} is more than the {format_bytes(total, 2)} "
                        f"of the {gpu.model or 'GPU'}",
                        "a memory cap is per GPU",
                        False,
                    )


# ==== load time ====================================================================================


class CheckReport(Protocol):
    """What `checks.CheckContext` offers the carve checks."""

    kept: dict[DataPath, list[int]]

    def report(self, path: DataPath, message: str, hint: str = "", *, at_key: bool = False) -> None: ...

    def written(self, path: DataPath) -> bool: ...

    def ref(self, path: DataPath, *, at_key: bool = False) -> str: ...


def check_carve(fleet: Fleet, ctx: CheckReport) -> None:
    """Every load-time rule of carve: (see the module docstring and docs/fleet-yaml.md)."""
    entries = fleet.carve
    if not entries:
        return
    for i, entry in enumerate(entries):
        _check_entry(fleet, ctx, i, entry)
    _check_duplicates(entries, ctx)
    sel = _Selectors(entries)
    grouped = _Grouped()
    for node in fleet.nodes:
        label_model, _ = node_model(node)
        indices: set[int] = set()
        for i in range(len(entries)):
            found = sel.indices[i]
            if found is not None and sel.selects(i, node):
                indices |= found
        for index in [*sorted(indices), None]:
            gpu = GpuView(node, index, None, label_model, live=False)
            winners = resolve(entries, sel, gpu)
            gpu_rules(
                entries,
                winners,
                gpu,
                lambda path, message, hint, at_key, where=gpu.describe(): grouped.add(
                    path, message, hint, at_key, where
                ),
            )
    grouped.flush(ctx.report)


def _check_entry(fleet: Fleet, ctx: CheckReport, i: int, entry: CarveEntry) -> None:
    here: DataPath = ("carve", i)
    if all(getattr(entry, kind) is None and not ctx.written((*here, kind)) for kind in KINDS):
        ctx.report(here, "an entry needs mig:, mps: or limiter:", "say what the selected GPUs should have")
    selected = _check_select(fleet, ctx, i, entry.select)
    if entry.mig is not None:
        _check_mig(ctx, i, entry, selected)
    if entry.mps is not None:
        _check_mps(fleet, ctx, i, entry.mps)
    if entry.limiter is not None:
        _check_limiter(fleet, ctx, i, entry.limiter)


def _check_select(fleet: Fleet, ctx: CheckReport, i: int, select: Select) -> list[Node]:
    selector = parse_selector(select.nodes)
    nodes = [n for n in fleet.nodes if selector.matches(n.name, n.labels)]
    path: DataPath = ("carve", i, "select", "nodes")
    if not ctx.written(path):
        path = ("carve", i, "select")
    if not nodes and ("nodes",) not in ctx.kept:
        names = [n.name for n in fleet.nodes]
        guess = "".join(closest(t, names) for t in selector.names[:1])
        listing = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        ctx.report(
            path,
            f"selects no node (selector {show(select.nodes)})",
            guess or (f"nodes: {listing}" if names else "nodes: is empty"),
        )
    gpus = select.gpus
    if gpus is not None and gpus.model is not None and nodes:
        labelled = [(n, node_model(n)) for n in nodes]
        if all(m is not None for _, (m, _) in labelled) and not any(
            same_model(want, m) for want in gpus.model for _, (m, _) in labelled if m is not None
        ):
            node, (model, key) = labelled[0]
            ctx.report(
                ("carve", i, "select", "gpus"),
                f"selects no GPU: the selected nodes are labelled as other models "
                f"({node.name}: {key}={show(node.labels.get(key, model))})",
                "fix the model, the node selector or the nodes' labels",
            )
    return nodes


def _mig_candidates(entry: CarveEntry, nodes: Sequence[Node]) -> tuple[dict[str, str], bool]:
    """Catalog models the entry's MIG layout must fit (key -> why), and whether GPUs of unknown
    model may be selected too."""
    gpus = entry.select.gpus
    models: dict[str, str] = {}
    if gpus is not None and gpus.model is not None:
        for name in gpus.model:
            found = find_model(name)
            if found is not None:
                models.setdefault(found.key, f"the entry selects {found.key} GPUs")
        return models, False
    unknown = False
    for node in nodes:
        model, key = node_model(node)
        found = find_model(model) if model else None
        if found is None:
            unknown = True
        else:
            models.setdefault(found.key, f"{node.name} is an {found.key} by its label {key}")
    return models, unknown or not nodes


def _given(spec: object, key: str, ctx: CheckReport, path: DataPath) -> bool:
    """Whether a setting is given: written in the file, or set (a fleet built in code)."""
    value = getattr(spec, key)
    return ctx.written(path) or (value is not None and value != {} and value != [])


def _check_mig(ctx: CheckReport, i: int, entry: CarveEntry, nodes: Sequence[Node]) -> None:
    spec = entry.mig
    assert spec is not None
    base: DataPath = ("carve", i, "mig")
    instances = spec.profiles is not None or spec.placements is not None
    if not spec.enabled:
        for key in ("profiles", "placements", "compute"):
            if _given(spec, key, ctx, (*base, key)):
                ctx.report(
                    (*base, key),
                    f"{key} with MIG disabled",
                    "a GPU with MIG off has no instances: remove it, or set enabled: true",
                    at_key=True,
                )
        return
    if spec.profiles is not None and spec.placements is not None:
        ctx.report(
            (*base, "placements"),
            "profiles and placements both given",
            "give counts (profiles:) and let the solver place them, or explicit placements, not both",
            at_key=True,
        )
        return
    d = desired_mig(spec, i)
    if spec.compute and not instances:
        ctx.report(
            (*base, "compute"),
            "compute splits without instances",
            "list the GPU instances under profiles: or placements:",
            at_key=True,
        )
    wanted = d.profile_counts()
    for name in spec.compute:
        if name not in wanted:
            ctx.report(
                (*base, "compute", name),
                f"no {name} instance in this layout",
                f"instances: {', '.join(wanted)}" if wanted else "",
                at_key=True,
            )
    gpus = entry.select.gpus
    if gpus is not None and gpus.model is not None:
        for j, name in enumerate(gpus.model):
            if find_model(name) is None:
                ctx.report(
                    ("carve", i, "select", "gpus", "model", j)
                    if len(gpus.model) > 1
                    else ("carve", i, "select", "gpus"),
                    f"{show(name)} has no MIG in gpuops' catalog",
                    f"MIG models: {', '.join(MODELS)}",
                )
    pruned = [n for n, split in spec.compute.items() if not split and ctx.written((*base, "compute", n, 0))]
    if not instances or pruned:
        return  # (a compute split with a bad item: that item's error says it)
    models, unknown = _mig_candidates(entry, nodes)
    for key, why in models.items():
        layout = mig_layout_for_model(d, MODELS[key])
        if not layout.ok:
            hint = f"{why}; try: gpuops mig check {key} {_check_args(d)}".rstrip()
            ctx.report((*base, *layout.path), layout.reason, hint, at_key=layout.at_key)
    if unknown:
        _check_mig_any_model(ctx, base, d)


def _check_mig_any_model(ctx: CheckReport, base: DataPath, d: DesiredMig) -> None:
    """Model not known before plan time: the layout must fit some catalog model."""
    names = list(d.profile_counts())
    having = [m for m in MODELS.values() if all(m.find_profile(n) is not None for n in names)]
    if not having:
        owners = "; ".join(f"{n}: {', '.join(PROFILE_MODELS.get(n, ()))}" for n in names)
        path = (*base, "profiles") if d.profiles is not None else (*base, "placements")
        ctx.report(path, f"no MIG model has all of {', '.join(names)}", owners)
        return
    layouts = [mig_layout_for_model(d, m) for m in having]
    if any(layout.ok for layout in layouts):
        return
    first = layouts[0]
    models = ", ".join(m.key for m in having)
    ctx.report(
        (*base, *first.path),
        f"{first.reason} (on {first.model})",
        f"fits no model with these profiles ({models}); try: gpuops mig check {first.model} {_check_args(d)}",
        at_key=first.at_key,
    )


def _team_hint(team: str, fleet: Fleet) -> str:
    teams = list(fleet.teams)
    return closest(team, teams) or (
        f"define it under teams: (teams: {', '.join(teams)})" if teams else "define it under teams:"
    )


def _check_mps(fleet: Fleet, ctx: CheckReport, i: int, spec: MpsSpec) -> None:
    base: DataPath = ("carve", i, "mps")
    if not spec.enabled:
        for key in ("active_thread_percentage", "pinned_memory_limit", "per_tenant"):
            if _given(spec, key, ctx, (*base, key)):
                ctx.report(
                    (*base, key),
                    f"{key} with MPS disabled",
                    "remove it, or set enabled: true",
                    at_key=True,
                )
        return
    for name in spec.per_tenant:
        if name not in fleet.teams:
            ctx.report(
                (*base, "per_tenant", name),
                f"no team named {show(name)}",
                _team_hint(name, fleet),
                at_key=True,
            )


def _check_limiter(fleet: Fleet, ctx: CheckReport, i: int, spec: LimiterSpec) -> None:
    base: DataPath = ("carve", i, "limiter")
    if not spec.enabled:
        for key in ("policy", "tenants"):
            if _given(spec, key, ctx, (*base, key)):
                ctx.report(
                    (*base, key),
                    f"{key} with the limiter disabled",
                    "remove it, or set enabled: true",
                    at_key=True,
                )
        return
    if len(spec.tenants) > MAX_TENANTS:
        ctx.report(
            (*base, "tenants"),
            f"{len(spec.tenants)} tenants; the limiter holds at most {MAX_TENANTS} per GPU",
            at_key=True,
        )
    shares: list[tuple[str, float, str]] = []
    for name, tenant in spec.tenants.items():
        path: DataPath = (*base, "tenants", name)
        if name != ALL_TENANTS and name not in fleet.teams:
            ctx.report(path, f"no team named {show(name)}", _team_hint(name, fleet), at_key=True)
        policy = effective_policy(spec, tenant)
        if policy == "best-effort" and tenant.compute is not None:
            ctx.report(
                (*path, "compute"),
                f"a compute share under best-effort ({format_share(tenant.compute)})",
                "best-effort tenants get what the others leave: remove compute, "
                "or use burst-share for a guarantee",
            )
        elif policy != "best-effort":
            if tenant.compute is None:
                ctx.report(
                    path,
                    f"{policy} needs a compute share",
                    "add compute: (e.g. 30%), or policy: best-effort for a memory cap only",
                    at_key=True,
                )
            else:
                shares.append((name, tenant.compute, policy))
    total = sum(share for _, share, _ in shares)
    if total > 100 + 1e-9:
        policies = {policy for _, _, policy in shares}
        what = "guarantees" if policies == {"burst-share"} else "shares"
        parts = ", ".join(
            f"{name} {format_share(share)}" + (f" {policy}" if len(policies) > 1 else "")
            for name, share, policy in shares
        )
        if policies == {"fixed-share"}:
            hint = "under fixed-share each share is a cap on the GPU's time: together at most 100%"
        elif policies == {"burst-share"}:
            hint = "burst-share guarantees cannot promise more than the whole GPU"
        else:
            hint = "caps (fixed-share) and guarantees (burst-share) together must fit in 100%"
        ctx.report(
            (*base, "tenants"),
            f"compute {what} add up to {format_share(round(total, 6))}, over 100% ({parts})",
            hint,
            at_key=True,
        )


def _select_key(select: Select) -> tuple[object, ...]:
    s = parse_selector(select.nodes)
    gpus = select.gpus
    key: tuple[object, ...] = (frozenset(s.names), frozenset(str(t) for t in s.labels))
    if gpus is None or (gpus.indices is None and gpus.uuids is None and gpus.model is None):
        return (*key, None)
    return (
        *key,
        parse_gpu_indices(gpus.indices) if gpus.indices is not None else None,
        frozenset(u.lower() for u in gpus.uuids) if gpus.uuids is not None else None,
        frozenset(_model_key(m) for m in gpus.model) if gpus.model is not None else None,
    )


def _model_key(name: str) -> str:
    found = find_model(name)
    return found.key if found is not None else normalize_model_name(name)


def _check_duplicates(entries: Sequence[CarveEntry], ctx: CheckReport) -> None:
    first: dict[tuple[str, tuple[object, ...]], int] = {}
    for i, entry in enumerate(entries):
        key = _select_key(entry.select)
        for kind in KINDS:
            if getattr(entry, kind) is None:
                continue
            seen = first.get((kind, key))
            if seen is None:
                first[(kind, key)] = i
                continue
            ctx.report(
                ("carve", i, "select"),
                f"duplicate selector: {ctx.ref(('carve', seen))} already sets {kind} for the same GPUs",
                "merge the two entries; a later entry overrides an earlier one only where selections overlap",
                at_key=True,
            )


# ==== plan time ====================================================================================


def desired_for(
    fleet: Fleet,
    doc: Document,
    node: Node,
    gpu_index: int,
    gpu_uuid: str | None,
    gpu_model: str | MigModel | None,
    *,
    mig_mode: bool | None = None,
    memory_total: int | None = None,
) -> DesiredGpu:
    """See `Fleet.desired_for`."""
    model = gpu_model.key if isinstance(gpu_model, MigModel) else gpu_model
    found = find_model(model) if model else None
    if found is not None:
        model = found.key
    gpu = GpuView(node, gpu_index, gpu_uuid, model, live=True, memory=memory_total, mig_mode=mig_mode)
    entries = fleet.carve
    if not entries:
        return DesiredGpu(node.name, gpu_index, gpu_uuid, model)
    sel = selectors_for(fleet)
    issues: list[SpecIssue] = []

    def emit(path: DataPath, message: str, hint: str = "", *, at_key: bool = False) -> None:
        issues.append(doc.issue(path, f"{message}, on {gpu.describe()}", hint, at_key=at_key))

    winners = resolve(entries, sel, gpu)
    gpu_rules(
        entries, winners, gpu, lambda path, message, hint, at_key: emit(path, message, hint, at_key=at_key)
    )

    def where(i: int) -> str:
        return entry_location(doc, i)

    # mig: an entry naming a GPU without MIG by index or UUID
    if gpu.mig_capable is False:
        for i, entry in enumerate(entries):
            if (
                entry.mig is not None
                and entry.mig.enabled
                and _explicit(entry.select.gpus)
                and _match(entry, i, sel, gpu) == YES
            ):
                emit(
                    ("carve", i, "select", "gpus"),
                    f"MIG on a GPU without MIG ({model}, not in gpuops' MIG catalog)",
                    "select MIG-capable GPUs only; by node or model, GPUs without MIG are skipped",
                )
    mig = mps = limiter = None
    layout: MigLayout | None = None
    w = winners["mig"].entry
    if w is not None and (spec := entries[w].mig) is not None:
        mig = desired_mig(spec, w, where(w))
        if found is not None and mig.enabled and not mig.keeps_instances:
            layout = mig_layout_for_model(mig, found)
            if not layout.ok:
                hint = f"{gpu.describe()} is an {model}; try: gpuops mig check {model} {_check_args(mig)}"
                issues.append(
                    doc.issue(("carve", w, "mig", *layout.path), layout.reason, hint, at_key=layout.at_key)
                )
    w = winners["mps"].entry
    if w is not None and (mps_spec := entries[w].mps) is not None:
        mps = desired_mps(mps_spec, w, where(w))
    w = winners["limiter"].entry
    if w is not None and (lim_spec := entries[w].limiter) is not None:
        limiter = desired_limiter(lim_spec, w, where(w))
    unique = tuple(sorted(set(issues), key=SpecIssue.sort_key))
    return DesiredGpu(node.name, gpu_index, gpu_uuid, model, mig, mps, limiter, layout, unique)


def entry_location(doc: Document, i: int) -> str:
    """'fleet.yaml:30:5': where carve entry i is written ('carve[i]' when not known)."""
    line, column = doc.position(("carve", i), at_key=True)
    return f"{doc.file}:{line}:{column}" if line else format_path(("carve", i))


__all__ = [
    "MODEL_LABELS",
    "DesiredGpu",
    "DesiredLimiter",
    "DesiredMig",
    "DesiredMps",
    "DesiredMpsTenant",
    "DesiredTenant",
    "MigInstance",
    "MigLayout",
    "check_carve",
    "desired_limiter",
    "desired_mig",
    "desired_mps",
    "effective_policy",
    "mig_layout_for_model",
    "node_model",
    "same_model",
]
