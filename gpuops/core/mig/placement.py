"""MIG placement: will these GPU instances fit on this GPU, and where?

`solve` places a multiset of GPU instance profiles on one GPU (memory-slice placements from the
catalog), around instances already pinned with `fixed`; `check_layout` validates explicit
placements. Both answer with a `PlacementResult` whose `reason` is one true, specific sentence
when the answer is no.

Rules checked (the same in both functions):
- each instance starts at one of its profile's allowed starts and takes `memory_slices` slices;
- no two instances share a memory slice;
- at most `max_count` instances of a profile (e.g. one `+me` profile);
- the compute slices of all instances fit the GPU's (7 on A100/H100/H200, 4 on A30);
- the engines of all instances (decoders, copy engines, JPEG, OFA) fit the GPU's, which are those
  of the whole-GPU instance: on the A30, 1g.6gb+me and 2g.12gb+me both need the single OFA.

The search is canonical: profiles are placed largest first (memory slices, compute slices, then
name), each at its lowest free allowed start, backtracking on failure, with memoisation of failed
(instance index, occupied slices) states. So the answer depends only on the multiset asked for,
never on the order it was listed in. Pure: no I/O, valid Python 3.8.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Mapping, Optional, Sequence, Set, Tuple, Union

from gpuops.core.mig.catalog import GpuInstanceProfile, MigModel

__all__ = [
    "Placement",
    "PlacementResult",
    "available_starts",
    "check_layout",
    "driver_start",
    "slice_map",
    "solve",
    "solve_keeping",
]

ProfileRef = Union[str, int]
Wanted = Union[Mapping[ProfileRef, int], Sequence[ProfileRef]]


@dataclass(frozen=True)
class Placement:
    """One GPU instance: memory-slice range [start, start + size)."""

    profile: str
    profile_id: int
    start: int
    size: int

    @property
    def end(self) -> int:
        """One past the last memory slice."""
        return self.start + self.size

    @property
    def slices(self) -> Tuple[int, ...]:
        return tuple(range(self.start, self.end))

    def __str__(self) -> str:
        return "%s@%d" % (self.profile, self.start)


@dataclass(frozen=True)
class PlacementResult:
    ok: bool
    placements: Tuple[Placement, ...]  # sorted by start; empty when not ok
    reason: str  # "" when ok

    def __bool__(self) -> bool:
        return self.ok


def _fail(reason: str) -> PlacementResult:
    return PlacementResult(ok=False, placements=(), reason=reason)


def _mask(start: int, size: int) -> int:
    return ((1 << size) - 1) << start


def _starts(profile: GpuInstanceProfile) -> str:
    word = "start" if len(profile.placements) == 1 else "starts"
    return "allowed %s %s" % (word, ", ".join(str(s) for s in profile.placements))


def _slice_range(start: int, end: int) -> str:
    return "memory slice %d" % start if end - start == 1 else "memory slices %d-%d" % (start, end - 1)


def _listing(items: Sequence[object]) -> str:
    return ", ".join(str(i) for i in items)


def _make(profile: GpuInstanceProfile, start: int) -> Placement:
    return Placement(profile=profile.name, profile_id=profile.id, start=start, size=profile.memory_slices)


def _canonical(placements: Sequence[Placement]) -> Tuple[Placement, ...]:
    return tuple(sorted(placements, key=lambda p: (p.start, -p.size, p.profile)))


def _order_key(profile: GpuInstanceProfile) -> Tuple[int, int, str]:
    """Largest first: memory slices, then compute slices, then name."""
    return (-profile.memory_slices, -profile.compute_slices, profile.name)


# ------------------------------------------------------------------------------------------
# Reading what the caller asked for.


def _resolve_wanted(model: MigModel, wanted: Wanted) -> Tuple[List[GpuInstanceProfile], str]:
    out: List[GpuInstanceProfile] = []
    pairs: List[Tuple[object, object]]
    if isinstance(wanted, Mapping):
        pairs = list(wanted.items())
    elif isinstance(wanted, (str, int)):
        pairs = [(wanted, 1)]
    else:
        pairs = [(ref, 1) for ref in wanted]
    for ref, count in pairs:
        if isinstance(count, bool) or not isinstance(count, int):
            return [], "count of %s must be a whole number, not %r" % (ref, count)
        if count < 0:
            return [], "count of %s must not be negative (got %d)" % (ref, count)
        if isinstance(ref, bool) or not isinstance(ref, (str, int)):
            return [], "a profile is a name or an id, not %r" % (ref,)
        profile = model.find_profile(ref)
        if profile is None:
            return [], "unknown profile %r for %s; valid: %s" % (ref, model.key, model.profile_list())
        out.extend([profile] * count)
    return out, ""


def _resolve_placement(model: MigModel, p: Placement) -> Tuple[Optional[GpuInstanceProfile], str]:
    profile = model.find_profile(p.profile) if p.profile else model.find_profile(p.profile_id)
    if profile is None:
        ref = p.profile if p.profile else str(p.profile_id)
        return None, "unknown profile %r for %s; valid: %s" % (ref, model.key, model.profile_list())
    if p.profile and p.profile_id != profile.id:
        other = model.find_profile(p.profile_id)
        what = other.name if other is not None else "no %s profile" % model.key
        return None, "%s@%d: profile id %d is %s, not %s" % (
            profile.name,
            p.start,
            p.profile_id,
            what,
            profile.name,
        )
    if p.size != profile.memory_slices:
        return None, "%s@%d: size %d, but %s takes %d memory slice%s" % (
            profile.name,
            p.start,
            p.size,
            profile.name,
            profile.memory_slices,
            "" if profile.memory_slices == 1 else "s",
        )
    if p.start not in profile.placements:
        return None, "%s cannot start at memory slice %d (%s)" % (profile.name, p.start, _starts(profile))
    return profile, ""


def _layout_reason(model: MigModel, pinned: Sequence[Tuple[GpuInstanceProfile, int]]) -> str:
    """Why pinned instances cannot coexist, checking placements and overlaps only."""
    ordered = sorted(pinned, key=lambda ps: (ps[1], -ps[0].memory_slices, ps[0].name))
    for i, (a, sa) in enumerate(ordered):
        for b, sb in ordered[i + 1 :]:
            lo, hi = max(sa, sb), min(sa + a.memory_slices, sb + b.memory_slices)
            if lo < hi:
                return "%s@%d overlaps %s@%d (%s)" % (a.name, sa, b.name, sb, _slice_range(lo, hi))
    return ""


# ------------------------------------------------------------------------------------------
# Totals: counts, memory slices, compute slices, engines.

_ENGINE_FIELDS = (
    ("decoders", "decoder"),
    ("copy_engines", "copy engine"),
    ("jpeg", "JPEG engine"),
    ("ofa", "OFA engine"),
)


def _breakdown(profiles: Sequence[GpuInstanceProfile], value: Mapping[str, int]) -> str:
    counts: Dict[str, int] = {}
    for p in profiles:
        counts[p.name] = counts.get(p.name, 0) + 1
    parts = []
    for p in sorted({p.name: p for p in profiles}.values(), key=_order_key):
        v = value[p.name]
        if v == 0:
            continue
        n = counts[p.name]
        parts.append("%s: %d" % (p.name, v) if n == 1 else "%s x%d: %d" % (p.name, n, n * v))
    return ", ".join(parts)


def _totals_reason(model: MigModel, profiles: Sequence[GpuInstanceProfile], pinned: Mapping[str, int]) -> str:
    counts: Dict[str, int] = {}
    for p in profiles:
        counts[p.name] = counts.get(p.name, 0) + 1
    for p in sorted({p.name: p for p in profiles}.values(), key=_order_key):
        n = counts[p.name]
        if n > p.max_count:
            already = pinned.get(p.name, 0)
            extra = ", %d of them already placed" % already if already else ""
            return "%s: at most %d per GPU (asked for %d%s)" % (p.name, p.max_count, n, extra)
    memory = sum(p.memory_slices for p in profiles)
    if memory > model.memory_slice_count:
        return "needs %d memory slices (%s), the GPU has %d" % (
            memory,
            _breakdown(profiles, {p.name: p.memory_slices for p in profiles}),
            model.memory_slice_count,
        )
    compute = sum(p.compute_slices for p in profiles)
    if compute > model.compute_slice_count:
        return "needs %d compute slices (%s), the GPU has %d" % (
            compute,
            _breakdown(profiles, {p.name: p.compute_slices for p in profiles}),
            model.compute_slice_count,
        )
    gpu = model.engines
    for attr, label in _ENGINE_FIELDS:
        need = sum(getattr(p.engines, attr) for p in profiles)
        have = int(getattr(gpu, attr))
        if need > have:
            return "needs %d %ss (%s), the GPU has %d" % (
                need,
                label,
                _breakdown(profiles, {p.name: int(getattr(p.engines, attr)) for p in profiles}),
                have,
            )
    return ""


# ------------------------------------------------------------------------------------------
# The search.


def _search(order: Sequence[GpuInstanceProfile], mask0: int) -> Optional[Tuple[int, ...]]:
    """Starts for `order` (same order) that fit around occupied slices `mask0`, or None."""
    failed: Set[Tuple[int, int]] = set()
    starts: List[int] = []

    def place(i: int, mask: int) -> bool:
        if i == len(order):
            return True
        if (i, mask) in failed:
            return False
        profile = order[i]
        for s in profile.placements:
            bits = _mask(s, profile.memory_slices)
            if mask & bits:
                continue
            starts.append(s)
            if place(i + 1, mask | bits):
                return True
            starts.pop()
        failed.add((i, mask))
        return False

    return tuple(starts) if place(0, mask0) else None


def _explain(
    order: Sequence[GpuInstanceProfile],
    pinned: Sequence[Tuple[GpuInstanceProfile, int]],
    mask0: int,
) -> str:
    """One true sentence on why `order` does not fit around `pinned` (totals already fit)."""
    k = 0
    best: Tuple[int, ...] = ()
    while k < len(order):
        found = _search(order[: k + 1], mask0)
        if found is None:
            break
        best = found
        k += 1
    stuck = order[k]
    pins = [str(_make(p, s)) for p, s in pinned]
    mine = [str(_make(p, s)) for p, s in zip(order[:k], best)]
    if k == 0:
        if not pins:  # pragma: no cover - totals fit, so one instance fits an empty GPU
            return "no free placement for %s (%s)" % (stuck.name, _starts(stuck))
        return "no free placement for %s (%s) once %s %s placed" % (
            stuck.name,
            _starts(stuck),
            _listing(pins),
            "is" if len(pins) == 1 else "are",
        )
    around = " around %s" % _listing(pins) if pins else ""
    return "no arrangement of %s fits%s: e.g. once %s %s placed%s, %s (%s) has no free start" % (
        _grouped(order[: k + 1]),
        around,
        _listing(mine),
        "is" if len(mine) == 1 else "are",
        " too" if pins else "",
        stuck.name,
        _starts(stuck),
    )


def _grouped(profiles: Sequence[GpuInstanceProfile]) -> str:
    """Profile names in canonical order, repeats as a count: 3g.20gb, 2g.10gb x2."""
    counts: Dict[str, int] = {}
    for p in profiles:
        counts[p.name] = counts.get(p.name, 0) + 1
    uniq = sorted({p.name: p for p in profiles}.values(), key=_order_key)
    return ", ".join(p.name if counts[p.name] == 1 else "%s x%d" % (p.name, counts[p.name]) for p in uniq)


def _resolve_fixed(
    model: MigModel, fixed: Sequence[Placement]
) -> Tuple[List[Tuple[GpuInstanceProfile, int]], str]:
    pinned: List[Tuple[GpuInstanceProfile, int]] = []
    for p in fixed:
        if not isinstance(p, Placement):
            return [], "a fixed placement must be a Placement, not %r" % (p,)
        profile, reason = _resolve_placement(model, p)
        if profile is None:
            return [], reason
        pinned.append((profile, p.start))
    reason = _layout_reason(model, pinned)
    return (pinned, "") if not reason else ([], reason)


def _pinned_counts(pinned: Sequence[Tuple[GpuInstanceProfile, int]]) -> Dict[str, int]:
    out: Dict[str, int] = {}
    for p, _ in pinned:
        out[p.name] = out.get(p.name, 0) + 1
    return out


def solve(model: MigModel, wanted: Wanted, fixed: Sequence[Placement] = ()) -> PlacementResult:
    """Place `wanted` GPU instances on an empty GPU, or around the instances pinned in `fixed`.

    `wanted` is a list of profile names or ids, or a mapping profile -> count; it lists the
    instances to add (the pinned ones are not counted in it). The result lists every instance,
    pinned and new, sorted by start; it depends only on the multiset asked for.
    """
    items, reason = _resolve_wanted(model, wanted)
    if reason:
        return _fail(reason)
    pinned, reason = _resolve_fixed(model, fixed)
    if reason:
        return _fail(reason)
    reason = _totals_reason(model, [p for p, _ in pinned] + items, _pinned_counts(pinned))
    if reason:
        return _fail(reason)
    mask0 = 0
    for p, s in pinned:
        mask0 |= _mask(s, p.memory_slices)
    order = sorted(items, key=_order_key)
    starts = _search(order, mask0)
    if starts is None:
        return _fail(_explain(order, pinned, mask0))
    placements = [_make(p, s) for p, s in pinned] + [_make(p, s) for p, s in zip(order, starts)]
    return PlacementResult(ok=True, placements=_canonical(placements), reason="")


def solve_keeping(
    model: MigModel, wanted: Wanted, live: Sequence[Placement], processes: Sequence[int] = ()
) -> PlacementResult:
    """Place `wanted` (the whole layout, as `solve` does on an empty GPU) keeping where they are
    the live instances whose loss would stop the most processes (`processes[i]` run on
    `live[i]`), then the most live instances, so the plan stops the fewest processes and removes
    the fewest instances any valid layout can.

    Exact: the subsets of `live` are tried best first (at most 2^7: a GPU holds at most seven
    instances), each pinned and the rest placed by `solve`; the first that fits wins, the lowest
    indices among equals. A live instance is only a candidate where its profile is wanted; the
    caller leaves out those that cannot stay as they are (another compute split)."""
    items, reason = _resolve_wanted(model, wanted)
    if reason:
        return _fail(reason)
    reason = _totals_reason(model, items, {})
    if reason:
        return _fail(reason)
    counts: Dict[int, int] = {}
    for p in items:
        counts[p.id] = counts.get(p.id, 0) + 1
    weights = [max(0, int(n)) for n in processes] + [0] * (len(live) - len(processes))
    candidates = [i for i, p in enumerate(live) if counts.get(p.profile_id, 0) > 0]
    subsets = []
    for bits in range(1 << len(candidates)):
        chosen = tuple(candidates[j] for j in range(len(candidates)) if bits >> j & 1)
        subsets.append((-sum(weights[i] for i in chosen), -len(chosen), chosen))
    for _, _, chosen in sorted(subsets):
        left = dict(counts)
        for i in chosen:
            left[live[i].profile_id] -= 1
        if any(n < 0 for n in left.values()):
            continue
        rest: Dict[ProfileRef, int] = {pid: n for pid, n in left.items() if n}
        result = solve(model, rest, fixed=[live[i] for i in chosen])
        if result.ok:
            return result
    return solve(model, wanted)


def check_layout(model: MigModel, placements: Sequence[Placement]) -> PlacementResult:
    """Validate explicit placements: allowed starts and sizes, overlaps, max counts, compute
    slices and engines. When ok, `placements` are returned with canonical names, sorted by start."""
    pinned, reason = _resolve_fixed(model, placements)
    if reason:
        return _fail(reason)
    reason = _totals_reason(model, [p for p, _ in pinned], {})
    if reason:
        return _fail(reason)
    return PlacementResult(ok=True, placements=_canonical([_make(p, s) for p, s in pinned]), reason="")


def slice_map(model: MigModel, placements: Sequence[Placement]) -> Tuple[Optional[int], ...]:
    """For each memory slice, the index in `placements` of the instance on it, or None."""
    out: List[Optional[int]] = [None] * model.memory_slice_count
    for i, p in enumerate(placements):
        for s in range(p.start, min(p.end, model.memory_slice_count)):
            out[s] = i
    return tuple(out)


def available_starts(model: MigModel, existing: Sequence[Placement], profile: ProfileRef) -> Tuple[int, ...]:
    """Allowed starts at which one more `profile` instance could be created next to `existing`
    (all limits checked), in the profile's `placements` order. Empty for an unknown profile."""
    gi = model.find_profile(profile)
    if gi is None:
        return ()
    return tuple(s for s in gi.placements if check_layout(model, [*existing, _make(gi, s)]).ok)


def driver_start(model: MigModel, existing: Sequence[Placement], profile: ProfileRef) -> Optional[int]:
    """Where the driver puts a new `profile` instance when no placement is given: the first start
    of the profile's `driver_order` that is free (None: INSUFFICIENT_RESOURCES)."""
    gi = model.find_profile(profile)
    if gi is None:
        return None
    free = set(available_starts(model, existing, gi.id))
    for s in gi.driver_order:
        if s in free:
            return s
    return None
