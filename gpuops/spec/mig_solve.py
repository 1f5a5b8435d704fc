"""A `mig:` entry's layout solved for one GPU model: the GPU instances placed (by the catalog's
solver, or the entry's explicit placements checked) and the compute instances placed inside each.

`SolvedLayout` is the solver's answer, with the names, the placements and, when it does not fit,
the reason and where in the entry it lies; `SolvedLayout.layout()` is the one MIG layout type
(`gpuops.core.mig.layout.MigLayout`) that plans aim for and nodes apply.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuops.core.mig.catalog import (
    ComputeProfile,
    GpuInstanceProfile,
    MigModel,
    UnknownProfileError,
    find_model,
)
from gpuops.core.mig.layout import InstanceSpec, MigLayout
from gpuops.core.mig.placement import Placement, PlacementResult, check_layout, solve
from gpuops.spec.carve_entry import CI_LEVEL_RE, CarveEntry, MigSpec
from gpuops.spec.desired import DesiredMig, desired_mig
from gpuops.spec.errors import show


@dataclass(frozen=True)
class SolvedInstance:
    """One GPU instance of a solved layout and the compute instances to create in it."""

    placement: Placement
    compute: tuple[ComputeProfile, ...]  # the CIs, largest first
    compute_starts: tuple[int, ...]  # their compute-slice starts inside the GI, same order

    def spec(self) -> InstanceSpec:
        """This instance in the core layout: its CI profile ids in placement order."""
        ordered = sorted(zip(self.compute_starts, self.compute, strict=True), key=lambda pair: pair[0])
        return InstanceSpec(
            self.placement.profile_id, self.placement.start, tuple(cp.id for _, cp in ordered)
        )


@dataclass(frozen=True)
class SolvedLayout:
    """A `mig:` entry solved on one model, as `PlacementResult`: ok, placements (sorted by start),
    reason (one sentence when not ok); plus the compute instances of each GPU instance.

    `path` is where in the mig: entry the reason lies (("profiles",), ("compute", "3g.40gb"),
    ...) and `at_key` whether it is that key rather than its value. `enabled` False: the entry
    turns MIG off; `keeps_instances`: it sets the mode only (no instances solved)."""

    ok: bool
    placements: tuple[Placement, ...]
    reason: str
    instances: tuple[SolvedInstance, ...] = ()
    model: str = ""
    path: tuple[str | int, ...] = ()
    at_key: bool = False
    enabled: bool = True
    keeps_instances: bool = False

    def __bool__(self) -> bool:
        return self.ok

    @property
    def result(self) -> PlacementResult:
        return PlacementResult(self.ok, self.placements, self.reason)

    def layout(self) -> MigLayout:
        """The core layout this solution makes (what a plan aims for and the node applies).
        Raises ValueError when it is not ok, or for a mode-only entry, whose instances are the
        live ones (the plan keeps them)."""
        if not self.ok:
            raise ValueError(self.reason)
        if not self.enabled:
            return MigLayout(False)
        if self.keeps_instances:
            raise ValueError("a mode-only mig: keeps the live instances; the live layout decides")
        return MigLayout(True, tuple(inst.spec() for inst in self.instances)).normalized()


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


def solve_layout(mig: DesiredMig | MigSpec | CarveEntry, model: MigModel | str) -> SolvedLayout:
    """The layout `mig` asks for on `model` (a MigModel or any name `find_model` reads): the GPU
    instances placed by the solver (or the explicit placements checked), each with its compute
    instances. Not ok: `reason` is the solver's sentence, `path` where in mig: it lies.

    MIG off, or mode only (`keeps_instances`): ok with no instances."""
    found = model if isinstance(model, MigModel) else find_model(model)
    if found is None:
        return SolvedLayout(
            False, (), f"{show(str(model))} is not a MIG model gpuops knows (see gpuops mig models)"
        )
    m = found
    d = _as_desired(mig)
    if not d.enabled or d.keeps_instances:
        return SolvedLayout(True, (), "", model=m.key, enabled=d.enabled, keeps_instances=d.keeps_instances)
    if d.placements is not None:
        pins: list[Placement] = []
        for i, (name, start) in enumerate(d.placements):
            gi = m.find_profile(name)
            if gi is None:
                return SolvedLayout(False, (), _unknown_profile(name, m), model=m.key, path=("placements", i))
            pins.append(Placement(gi.name, gi.id, start, gi.memory_slices))
        result = check_layout(m, pins)
        where: tuple[str | int, ...] = ("placements",)
    else:
        for name, _ in d.profiles or ():
            if m.find_profile(name) is None:
                return SolvedLayout(
                    False, (), _unknown_profile(name, m), model=m.key, path=("profiles", name), at_key=True
                )
        result = solve(m, dict(d.profiles or ()))
        where = ("profiles",)
    if not result.ok:
        return SolvedLayout(False, (), result.reason, model=m.key, path=where)
    instances: list[SolvedInstance] = []
    for p in result.placements:
        gi = m.profile(p.profile)
        split = d.compute_split(gi.name)
        if split is None:
            instances.append(SolvedInstance(p, (gi.default_compute_profile,), (0,)))
            continue
        placed = place_compute_instances(gi, split)
        if isinstance(placed, str):
            return SolvedLayout(False, (), placed, model=m.key, path=("compute", gi.name))
        instances.append(SolvedInstance(p, placed[0], placed[1]))
    return SolvedLayout(True, result.placements, "", tuple(instances), model=m.key)


def _unknown_profile(name: str, model: MigModel) -> str:
    return f"unknown profile {show(name)} for {model.key}; valid: {', '.join(p.name for p in model.profiles)}"


def mig_check_args(d: DesiredMig) -> str:
    """The profiles of `d` as `gpuops mig check MODEL ...` takes them, for hints."""
    if d.placements is not None:
        return " ".join(f"{n}:{s}" for n, s in d.placements)
    return " ".join(n for n, c in d.profiles or () for _ in range(c))


__all__ = ["SolvedInstance", "SolvedLayout", "mig_check_args", "place_compute_instances", "solve_layout"]
