"""`gpuops rebalance`: a deterministic proposal that moves under-used silo GPUs into a pool, sets
the teams' guarantees from evidence and carves the pool's GPUs to enforce them.

The rules (docs/pools.md#rebalance), each one visible in the proposal's explanations:

1. **Moves.** A GPU in nobody's pool whose GPU-time p95 over the window is at most
   `idle_p95` (default 10%), and in its latest bucket too (work that just started stays where
   it is), observed for at least `min_coverage` of the window (a GPU with less stays, and a note
   says why), and not in MIG mode (re-carving it would stop its instances), moves into the
   pool. It keeps its owner. `Options(moves=False)` moves none; `join` and `leave` are moves by
   hand (a GPU given back to its silo gets its limiter lines cleared by a `pool:` entry that
   comes first in `carve:`, and is not moved back on the planner's own while that entry is
   there). Buckets a node could not read count for no team (accounting.py); the CLI refuses to
   propose on such evidence unless told to (`--allow-incomplete-history`), and the proposal's
   notes say which node has how many.
2. **Floors.** Every team's guarantee in the pool is at least the p95 of its GPU-time on the
   pool's GPUs (old members and moved ones) over the window, so that with the silo GPUs it keeps
   no team is guaranteed less than it uses. A guarantee the pool already gives is kept
   (the planner never takes away what a team was promised, unless that is the only way to fit
   the floors, and then it says so).
3. **Grants.** Whole GPUs left over go to *saturated* teams — those whose p95 use of their own
   silo is at least `saturated` (90%) of it — in proportion to their silo size, at most as many
   as each one's silo has (saturation shows that a team wants more, not how much more). What is
   left is guaranteed to nobody: borrowers use it (`borrowing`).
4. **Carving.** Guarantees are laid onto GPUs in units of 1% of a GPU: first where each team
   already works, then in order, where its memory cap fits next to the others' and the memory
   processes still hold there; no GPU gets more than 100%. A team is laid only on cards that hold
   its memory need, the teams with the fewest such cards first, then the largest p95 use; what
   finds no room there is left out of its guarantee, before grants are counted, and said. Under
   `policy: fixed-share` (shares are caps) each team's units are water-filled over the GPUs
   instead, so no GPU is one team's alone while others are guaranteed. Under `carving: mig`, a
   MIG-capable GPU is cut into instances of the smallest profile that holds the p95 of its teams' largest
   processes, as many for each team as cover its units (checked by the placement solver), and
   the rest of the GPU as spare instances for borrowers; a GPU where that does not fit keeps
   limiter shares, and so does one where processes still hold memory (MIG would stop them).

The same evidence and the planner's own output give no moves and no changes (property-tested).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuops.core.driver_memory import DriverMemory, Overhead, mib_text, overhead_for
from gpuops.core.mig.catalog import GpuInstanceProfile, MigModel, find_model
from gpuops.core.mig.placement import solve
from gpuops.core.units import format_bytes
from gpuops.spec.carve_entry import (
    CarveEntry,
    GpuSelect,
    LimiterSpec,
    LimiterTenantSpec,
    MigSpec,
    Select,
    entry_data,
)
from gpuops.spec.loader import fleet_from_data
from gpuops.spec.model import Fleet
from gpuops.spec.pools import Pool, pool_selects
from gpuops.spec.selectors import format_gpu_indices, parse_selector
from gpuops.tenancy.accounting import Evidence, GpuEvidence, p95

UNITS_PER_GPU = 100  # a guarantee is laid out in whole percent of a GPU
GIB = 1 << 30
MIB = 1 << 20
# A pool share is written in tenths of a percent: the limiter keeps a compute share in permille
# (native/src/config.c, share_permille), so a finer share would promise what nothing enforces.
SHARE_STEPS = 1000  # steps of a pool share (0.1% each)


def share_steps(units: int, capacity: int) -> int:
    """The fewest 0.1% steps of a `capacity`-GPU pool that give back at least `units`."""
    return -(-units * SHARE_STEPS // (capacity * UNITS_PER_GPU)) if capacity else 0


def steps_units(steps: int, capacity: int) -> int:
    """Units a share of `steps` tenths of a percent gives back, as fleet.yaml's loader reads it."""
    return steps * capacity * UNITS_PER_GPU // SHARE_STEPS


GpuKey = tuple[str, int]  # (node, index)


@dataclass(frozen=True)
class Options:
    pool: str = "shared"
    idle_p95: float = 0.10  # a GPU whose GPU-time p95 is at most this is under-used
    saturated: float = 0.90  # a team using at least this of its silo (p95) is saturated
    min_coverage: float = 0.5  # of the window's buckets a GPU must have data for, to be moved
    # False: the planner moves no GPU on its own (`--no-moves`); it re-guarantees and re-carves
    # the pool's GPUs, with `join` and `leave` applied.
    moves: bool = True
    join: tuple[GpuKey, ...] = ()  # GPUs moved into the pool by hand
    leave: tuple[GpuKey, ...] = ()  # GPUs returned to their owners' silos by hand
    # GPUs whose nodes have limiter lines (None: those fleet.yaml gives a limiter). A GPU of
    # `leave` among them, that nothing but the pool gives a limiter, gets its lines cleared; a
    # caller that knows the live tables (the Pool screen) says which.
    lined: frozenset[GpuKey] | None = None
    # What each GPU's node observed of its driver's memory (GpuInfo.driver_memory, from the live
    # state); a GPU not here takes its model's documented figures (core/driver_memory.py).
    driver_memory: Mapping[GpuKey, DriverMemory] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuRef:
    """A GPU known by index (and UUID, model where known): from evidence or a live inventory."""

    node: str
    index: int
    uuid: str = ""
    name: str = ""

    @property
    def key(self) -> GpuKey:
        return (self.node, self.index)


class MembershipError(ValueError):
    """A GPU cannot be taken out of a pool's member selections (one line for a person)."""


@dataclass(frozen=True)
class Move:
    node: str
    index: int
    owner: str | None
    p95_busy: float
    mean_busy: float
    coverage: float  # of the window's buckets with data; 0: no history
    by_hand: bool = False  # given in Options.join, not found idle by the planner
    held: str = ""  # who holds memory there now and how much ("robotics 6GiB (15%)"), "" for nobody

    def explain(self, pool: str = "") -> str:
        whose = f"{self.owner}'s silo" if self.owner else "nobody's"
        held = (
            f"; memory still held there by {self.held}: the memory caps on it fit into the rest"
            if self.held
            else ""
        )
        if not self.by_hand:
            return (
                f"{self.node}:{self.index} ({whose}) joins the pool: GPU-time p95 {self.p95_busy:.0%}, "
                f"mean {self.mean_busy:.0%} over {self.coverage:.0%} of the window{held}"
            )
        figures = (
            f": GPU-time p95 {self.p95_busy:.0%}, mean {self.mean_busy:.0%}"
            if self.coverage > 0
            else ": no history (not counted or carved until it has some)"
        )
        return f"{self.node}:{self.index} ({whose}) joins pool {pool}, moved by hand{figures}{held}"


@dataclass(frozen=True)
class Return:
    """A GPU given back to its owner's silo (Options.leave)."""

    node: str
    index: int
    owner: str | None
    cleared: bool  # its limiter lines are cleared (a `pool:` entry with `limiter: {enabled: false}`)
    keeps_mig: bool = False  # the pool carved it with MIG; nothing carves it any more

    def explain(self, pool: str) -> str:
        whose = f"{self.owner}'s silo" if self.owner else "no silo (nobody owns it)"
        line = f"{self.node}:{self.index} leaves pool {pool} for {whose}, moved by hand"
        if self.cleared:
            line += "; the pool's limiter lines are removed"
        if self.keeps_mig:
            line += "; it keeps its MIG layout (nothing in fleet.yaml carves it any more)"
        return line


@dataclass(frozen=True)
class Guarantee:
    team: str
    units: int  # in 1% of a GPU
    floor: int  # units its p95 use on the pool needs
    before: int  # units the pool guaranteed it before
    granted: int  # whole-GPU units granted as a saturated team
    memory: int | None  # bytes its work needs on one GPU (p95 of its largest process), None: unknown
    reason: str

    @property
    def gpus(self) -> float:
        return self.units / UNITS_PER_GPU


@dataclass(frozen=True)
class GpuCarving:
    node: str
    index: int
    name: str
    memory_total: int
    units: Mapping[str, int]  # team -> units of this GPU guaranteed to it
    kind: str  # "limiter" | "mig"
    profile: str | None = None  # mig: the instance profile
    slices: Mapping[str, int] = field(default_factory=dict)  # mig: instances per team
    spare: int = 0  # mig: instances left for borrowers
    note: str = ""
    memory: Mapping[str, int] = field(default_factory=dict)  # limiter: team -> memory cap, bytes
    held: int = 0  # limiter: bytes processes held there in the latest bucket
    # limiter: what the driver keeps of the card (its reserve, and each process's context, which
    # counts inside its team's cap); `memory_total` is then what is left to the caps
    overhead: Overhead | None = None

    def describe(self) -> str:
        shares = ", ".join(f"{t} {u}%" for t, u in sorted(self.units.items())) or "nobody guaranteed"
        if self.kind == "mig":
            per = ", ".join(f"{t} {n}" for t, n in sorted(self.slices.items()))
            count = sum(self.slices.values()) + self.spare
            return f"{self.node}:{self.index}: MIG {self.profile} x{count} ({per}; {self.spare} spare)"
        line = f"{self.node}:{self.index}: limiter shares {shares}" + (f" ({self.note})" if self.note else "")
        if self.held:
            caps = ", ".join(f"{t} {format_bytes(c)}" for t, c in sorted(self.memory.items()))
            line += f"; {format_bytes(self.held)} held there, memory caps {caps or 'none'} fit into the rest"
        return line


@dataclass(frozen=True)
class Proposal:
    pool: str
    window: str
    capacity: int  # GPUs in the pool after the moves
    moves: tuple[Move, ...]
    guarantees: tuple[Guarantee, ...]
    carvings: tuple[GpuCarving, ...]
    notes: tuple[str, ...] = ()
    infeasible: str = ""  # why there is no proposal; "" when there is one
    returns: tuple[Return, ...] = ()
    automatic: bool = True  # whether the planner looked for GPUs to move (Options.moves)
    known: tuple[GpuRef, ...] = ()  # every GPU of the evidence, to rewrite member selections
    steps: tuple[tuple[str, int], ...] = ()  # team -> its share in 0.1% steps, where not the fewest

    def guarantee(self, team: str) -> Guarantee | None:
        return next((g for g in self.guarantees if g.team == team), None)

    def share(self, team: str) -> float:
        """The team's share of the pool in percent, in the limiter's 0.1% steps: the planner's
        units are what such a share gives back (`_on_share_steps`), so this is exact."""
        g = self.guarantee(team)
        if g is None or self.capacity == 0:
            return 0.0
        steps = dict(self.steps).get(team, share_steps(g.units, self.capacity))
        return steps / (SHARE_STEPS // 100)

    def explain(self) -> list[str]:
        if self.infeasible:
            return [f"no proposal for pool {self.pool}: {self.infeasible}"]
        lines = [m.explain(self.pool) for m in self.moves] + [r.explain(self.pool) for r in self.returns]
        if not lines:
            lines.append(
                f"no GPU to move into pool {self.pool}"
                if self.automatic
                else f"no moves (none asked for): guarantees and carving of pool {self.pool}'s "
                f"{self.capacity} GPUs recomputed from the evidence"
            )
        elif not self.automatic:
            lines.append(f"no other moves (none asked for): pool {self.pool} has {self.capacity} GPUs")
        for g in self.guarantees:
            lines.append(
                f"{g.team}: guaranteed {g.gpus:g} GPUs of the pool ({self.share(g.team):g}%): {g.reason}"
            )
        lines.extend(c.describe() for c in self.carvings)
        lines.extend(_overhead_lines(self.carvings))
        lines.extend(self.notes)
        return lines


def _overhead_lines(carvings: Sequence[GpuCarving]) -> list[str]:
    """How much of the limiter-carved GPUs goes to the driver, one line per set of figures."""
    groups: dict[Overhead, list[GpuCarving]] = {}
    for c in carvings:
        if c.kind == "limiter" and c.overhead is not None:
            groups.setdefault(c.overhead, []).append(c)
    lines = []
    for over, cards in groups.items():
        names = ", ".join(f"{c.node}:{c.index}" for c in cards[:3])
        more = f" and {len(cards) - 3} more" if len(cards) > 3 else ""
        usable = {c.memory_total for c in cards}
        left = f" ({mib_text(next(iter(usable)))} left to the memory caps)" if len(usable) == 1 else ""
        lines.append(
            f"driver overhead on {names}{more}: {mib_text(over.reserved_bytes)} of each card reserved by the "
            f"driver ({over.reserved_source}){left}; each process's CUDA context, "
            f"{mib_text(over.context_bytes)} ({over.context_source}), counts inside its team's memory cap"
        )
    return lines


# ---- planning -------------------------------------------------------------------------------------


def _existing_units(pool: Pool | None, evidence: Evidence, name: str) -> dict[str, int]:
    if pool is None:
        return {}
    size = sum(1 for g in evidence.gpus if g.pool == name)
    return {t: math.floor(g.share * size + 1e-6) for t, g in pool.guarantees.items()}


def _is_team(team: str, fleet: Fleet) -> bool:
    return team in fleet.teams


def propose(fleet: Fleet, evidence: Evidence, options: Options | None = None) -> Proposal:
    """The proposal for pool `options.pool` (created when the fleet has none) from `evidence`."""
    opts = options or Options()
    name = opts.pool
    pool = fleet.pools.get(name)
    notes: list[str] = evidence.incomplete_lines()
    leave = set(opts.leave)
    join = set(opts.join)
    members = [g for g in evidence.gpus if g.pool == name and (g.node, g.index) not in leave]
    moves: list[Move] = []
    moved: list[GpuEvidence] = []
    by_key = {(g.node, g.index): g for g in evidence.gpus}
    for key in sorted(join - leave):
        g = by_key.get(key)
        if g is None:
            owner = fleet.gpu_owner(key[0], key[1]) if _in_fleet(fleet, key[0]) else None
            moves.append(Move(key[0], key[1], owner, 0.0, 0.0, 0.0, by_hand=True))
            continue
        if g.pool == name:
            continue
        if g.pool is not None:
            return _infeasible(
                name, evidence, f"{g.label()} is in pool {g.pool}: take it out of that pool first"
            )
        coverage = g.coverage()
        moves.append(
            Move(g.node, g.index, g.owner, g.p95_busy(), g.mean_busy(), coverage, True, _held_text(g))
        )
        moved.append(g)
    given_back = _given_back(fleet, name, evidence) if opts.moves else set()
    for g in evidence.gpus if opts.moves else ():
        if g.pool is not None or (g.node, g.index) in join | leave:
            continue
        if (g.node, g.index) in given_back:
            # The operator's decision stands until the entry that records it is deleted.
            notes.append(
                f"{g.label()} stays: it was given back to its silo by hand (a carve entry of pool "
                f"{name} clears its limiter lines; delete it to let the planner move the GPU)"
            )
            continue
        coverage = g.coverage()
        if coverage < opts.min_coverage:
            # Said, not skipped in silence (a node recording for a short while, or with unreadable
            # history, would otherwise lose its GPUs from the proposal without a word).
            notes.append(
                f"{g.label()} stays: its history covers {coverage:.0%} of the window "
                f"(at least {opts.min_coverage:.0%} needed to move a GPU)"
            )
            continue
        busy = g.p95_busy()
        if busy > opts.idle_p95 + 1e-12:
            continue
        latest = next((b for b, o in zip(reversed(g.busy), reversed(g.observed), strict=True) if o > 0), 0.0)
        if latest > opts.idle_p95 + 1e-12:
            notes.append(
                f"{g.label()} stays: idle over the window but {latest:.0%} busy in its latest bucket"
            )
            continue
        if g.mig:
            notes.append(f"{g.label()} stays: it is in MIG mode (moving it would re-carve its instances)")
            continue
        moves.append(Move(g.node, g.index, g.owner, busy, g.mean_busy(), coverage, held=_held_text(g)))
        moved.append(g)
    # The planner lays caps on what the driver leaves of each card (its reserve taken out); each
    # process's context counts inside its team's cap (the limiter charges it: docs/limiter.md).
    overheads = {
        (g.node, g.index): overhead_for(g.name, opts.driver_memory.get((g.node, g.index)))
        for g in members + moved
    }
    pool_gpus = [_usable(g, overheads[(g.node, g.index)]) for g in members + moved]
    capacity = len(pool_gpus)
    returns = _returns(fleet, evidence, name, leave, opts.lined)
    total_units = capacity * UNITS_PER_GPU

    # Floors: p95 of each team's GPU-time on the pool's GPUs.
    floors: dict[str, int] = {}
    unattributed = 0.0
    for team in evidence.teams():
        use = p95(
            [
                v
                for v, seen in zip(evidence.team_series(team, pool_gpus), evidence.observed(), strict=True)
                if seen
            ]
        )
        if use <= 0:
            continue
        if not _is_team(team, fleet):
            unattributed += use
            continue
        floors[team] = math.ceil(use * UNITS_PER_GPU - 1e-9)
    if unattributed > 0:
        notes.append(
            f"work of no team used {unattributed:.2f} GPUs (p95) of the pool: it gets no guarantee "
            "and runs as a borrower"
        )
    before = {t: u for t, u in _existing_units(pool, evidence, name).items() if _is_team(t, fleet)}
    units = {t: max(floors.get(t, 0), before.get(t, 0)) for t in set(floors) | set(before)}
    if sum(floors.values()) > total_units:
        return Proposal(
            name,
            evidence.window.text,
            capacity,
            tuple(moves),
            (),
            (),
            tuple(notes),
            infeasible=(
                f"the teams' p95 use of the pool's GPUs adds up to {sum(floors.values()) / 100:g} GPUs, "
                f"more than its {capacity}: no carving can guarantee all of it"
            ),
            returns=returns,
            automatic=opts.moves,
        )
    cut = _fit(units, floors, total_units)
    if cut:
        notes.append("guarantees above p95 use were cut to fit the pool: " + ", ".join(cut))

    saturated = _saturated(fleet, evidence, opts, {(g.node, g.index) for g in pool_gpus})
    memory_need = _memory_need(evidence, pool_gpus)
    team_memory = {t: memory_need.get(t) or _kept_memory(pool, t) for t in set(units) | set(saturated)}
    caps_need = {t: m for t, m in team_memory.items() if m}
    # What finds no room on the cards that hold a team's memory need is left out before the spare
    # capacity is counted: a grant then goes where it can run, and planning again (which reads the
    # cut guarantee back as what the pool gave before) finds no more spare than this did.
    asked = dict(units)
    _laid_out(pool_gpus, fleet, pool, units, caps_need, [], floors)
    left_out = {t: asked[t] - units.get(t, 0) for t in asked if asked[t] > units.get(t, 0)}

    # Grants: whole GPUs left over go to saturated teams.
    granted: dict[str, int] = {}
    spare_gpus = (total_units - sum(units.values())) // UNITS_PER_GPU
    # At most as many GPUs as its silo has, counting what the pool already guarantees it above
    # its use: a saturated team at most doubles its capacity (saturation says it wants more, not
    # how much more), and planning again on the proposal grants nothing more.
    room = {t: n - max(0, units.get(t, 0) - floors.get(t, 0)) // UNITS_PER_GPU for t, n in saturated.items()}
    room = {t: n for t, n in room.items() if n > 0}
    if spare_gpus > 0 and room:
        grant = _largest_remainder(room, min(spare_gpus, sum(room.values())))
        for team, k in grant.items():
            k = min(k, room[team])
            if k:
                granted[team] = k * UNITS_PER_GPU
                units[team] = units.get(team, 0) + k * UNITS_PER_GPU

    units, steps, stepped = _on_share_steps(units, floors, capacity)
    notes.extend(stepped)
    stepped_units = dict(units)
    ordered, laid = _laid_out(pool_gpus, fleet, pool, units, caps_need, notes, floors, left_out)
    for team in sorted(units):
        if units[team] != stepped_units[team]:  # cut to a step by _laid_out
            steps[team] = share_steps(units[team], capacity)
    guarantees = []
    for team in sorted(units):
        if units[team] <= 0:
            continue
        reason = _reason(team, floors.get(team, 0), before.get(team, 0), granted.get(team, 0), saturated)
        guarantees.append(
            Guarantee(
                team,
                units[team],
                floors.get(team, 0),
                before.get(team, 0),
                granted.get(team, 0),
                team_memory.get(team),
                reason,
            )
        )
    notes.extend(_donors(fleet, pool_gpus, units, floors, evidence.window.text))
    carvings = _carve(ordered, laid, pool, memory_need, notes, caps_need, overheads)
    return Proposal(
        name,
        evidence.window.text,
        capacity,
        tuple(moves),
        tuple(guarantees),
        carvings,
        tuple(notes),
        returns=returns,
        automatic=opts.moves,
        known=tuple(GpuRef(g.node, g.index, g.uuid, g.name) for g in evidence.gpus),
        steps=tuple(sorted((t, k) for t, k in steps.items() if units.get(t, 0) > 0)),
    )


def _usable(g: GpuEvidence, over: Overhead) -> GpuEvidence:
    """The GPU as the carving sees it: its memory is what the driver leaves of it."""
    if not g.memory_total:
        return g
    return dataclasses.replace(g, memory_total=over.usable(g.memory_total))


def _on_share_steps(
    units: Mapping[str, int], floors: Mapping[str, int], capacity: int
) -> tuple[dict[str, int], dict[str, int], list[str]]:
    """Each guarantee raised to what a share in the limiter's 0.1% steps gives back; while the
    shares pass 100%, the largest surplus above a floor gives back a step. Floors that fill the
    pool may not all be steps: then a floor's share is written one step under it (its units, laid
    per GPU in whole percent, stay), and a note says so. Returns units, steps and notes."""
    steps = {t: share_steps(u, capacity) for t, u in units.items() if u > 0}
    exact: dict[str, int] = {}
    notes: list[str] = []
    while sum(steps.values()) > SHARE_STEPS:
        above = [
            t for t in steps if t not in exact and steps_units(steps[t] - 1, capacity) >= floors.get(t, 0)
        ]
        if above:
            team = max(above, key=lambda t: (steps_units(steps[t], capacity) - floors.get(t, 0), t))
        else:
            team = max((t for t in steps if t not in exact), key=lambda t: (floors.get(t, 0), t))
            exact[team] = floors[team]
            notes.append(
                f"{team}'s share is written {(steps[team] - 1) / 10:g}%, a 0.1% step under its p95 use "
                f"({floors[team] / UNITS_PER_GPU:g} GPUs), for the shares to fit 100%; its GPUs' limiter "
                "lines give it all of that use"
            )
        steps[team] -= 1
    out = {t: exact.get(t, steps_units(k, capacity)) for t, k in steps.items() if k > 0 or t in exact}
    # On a pool of under 10 GPUs a step is less than a unit (1% of one GPU), so several step counts
    # give back the same units: each share is written as the fewest of them, which is what planning
    # again reads back from fleet.yaml and writes (a floor written a step under it excepted).
    steps = {t: k if t in exact else share_steps(out[t], capacity) for t, k in steps.items() if t in out}
    return out, steps, notes


def _down_to_step(units: int, capacity: int) -> int:
    """The most units at or below `units` that a share in 0.1% steps gives back."""
    if capacity == 0:
        return 0
    steps = (SHARE_STEPS * (units + 1) - 1) // (capacity * UNITS_PER_GPU)
    return steps_units(steps, capacity)


def _laid_out(
    gpus: Sequence[GpuEvidence],
    fleet: Fleet,
    pool: Pool | None,
    units: dict[str, int],
    need: Mapping[str, int],
    notes: list[str],
    floors: Mapping[str, int],
    left_out: Mapping[str, int] | None = None,
) -> tuple[list[GpuEvidence], dict[GpuKey, dict[str, int]]]:
    """The pool's GPUs in file order and each one's units per team. A team is laid only on cards
    that hold its memory need; what finds no room on them is left out of its guarantee (down to
    a 0.1% step, so the share stays exact) and the notes say so, with what was `left_out` of it
    before. `units` is cut in place."""
    order = {n.name: i for i, n in enumerate(fleet.nodes)}
    ordered = sorted(gpus, key=lambda g: (order.get(g.node, len(order)), g.node, g.index))
    capacity = len(ordered)
    asked = dict(units)
    # Who is laid first, and so who keeps the cards that hold more than one team's need: the
    # teams with the fewest such cards, then the largest p95 use of the pool. Both come from the
    # evidence alone, so planning again on the proposal (where a guarantee cut here is what the
    # pool gives "before") ranks the teams the same and cuts the same (the planner's fixed point).
    holds = {t: sum(1 for g in ordered if _holds(g, t, need)) for t in units}
    rank = sorted(units, key=lambda t: (holds[t], -floors.get(t, 0), -units[t], t))
    while True:
        laid: dict[GpuKey, dict[str, int]] = {(g.node, g.index): {} for g in ordered}
        if pool is not None and pool.policy == "fixed-share" and sum(1 for u in units.values() if u > 0) > 1:
            left = _spread(ordered, units, laid, need, rank)
        else:
            left = _pack(ordered, units, laid, need, rank)
        short = [t for t in rank if left.get(t, 0) > 0]
        if not short:
            break
        # One team at a time, first in rank: a cut leaves room (under a step) that teams after it
        # may take, as they will when planning again finds that guarantee already cut.
        team = short[0]
        units[team] = _down_to_step(units[team] - left[team], capacity)
    before = left_out or {}
    for team in sorted(set(asked) | set(before)):
        lost = before.get(team, 0) + asked.get(team, 0) - units.get(team, 0)
        if lost <= 0:
            continue
        fits = [g for g in ordered if _holds(g, team, need)]
        where = (
            f"fits on {len(fits)} of the pool's {capacity} cards ({_names(fits)}), which have no more room"
            if fits
            else f"fits on none of the pool's {capacity} cards"
        )
        below = (
            f", below its p95 use of the pool ({floors[team] / UNITS_PER_GPU:g} GPUs)"
            if units.get(team, 0) < floors.get(team, 0)
            else ""
        )
        notes.append(
            f"{team}: {lost / UNITS_PER_GPU:g} GPUs of its guarantee left out{below}: its memory need "
            f"({format_bytes(need[team])}) {where}; it is not placed where its work cannot run"
        )
    return ordered, laid


def _holds(g: GpuEvidence, team: str, need: Mapping[str, int]) -> bool:
    """Whether the card's whole memory holds the team's memory need (unknown sizes do)."""
    return not g.memory_total or need.get(team, 0) <= g.memory_total


def _names(gpus: Sequence[GpuEvidence]) -> str:
    shown = ", ".join(g.label() for g in gpus[:3])
    return shown + (f" and {len(gpus) - 3} more" if len(gpus) > 3 else "")


def _donors(
    fleet: Fleet,
    gpus: Sequence[GpuEvidence],
    units: Mapping[str, int],
    floors: Mapping[str, int],
    window: str,
) -> list[str]:
    """What each team that gives its own GPUs to the pool gets back: its guarantee there is its
    p95 use of the pool (never less while the pool has room for it, rule 2); said for every donor,
    so that a guarantee of nothing is a visible decision, not an omission."""
    given: dict[str, int] = {}
    for g in gpus:
        if g.owner is not None and _is_team(g.owner, fleet):
            given[g.owner] = given.get(g.owner, 0) + 1
    lines = []
    for team, count in sorted(given.items()):
        got = units.get(team, 0)
        if got > 0:
            lines.append(
                f"{team} gives {count} GPUs to the pool and is guaranteed {got / UNITS_PER_GPU:g} GPUs of it "
                f"(its p95 use of the pool over {window}: {floors.get(team, 0) / UNITS_PER_GPU:g} GPUs)"
            )
        else:
            lines.append(
                f"{team} gives {count} GPUs to the pool and is guaranteed none of it: its p95 use of "
                f"the pool over {window} is 0; it borrows idle pool time like any team, and once it "
                "uses the pool, planning again guarantees it that use"
            )
    return lines


def _infeasible(name: str, evidence: Evidence, why: str) -> Proposal:
    return Proposal(name, evidence.window.text, 0, (), (), (), infeasible=why)


def _in_fleet(fleet: Fleet, node: str) -> bool:
    return any(n.name == node for n in fleet.nodes)


def _returns(
    fleet: Fleet, evidence: Evidence, name: str, leave: set[GpuKey], lined: frozenset[GpuKey] | None
) -> tuple[Return, ...]:
    """The GPUs of `leave` that are in the pool, each with whether its limiter lines must be
    cleared: the pool gave it its limiter (or the nodes have lines, `lined`), and once the pool's
    entries are gone nothing else in fleet.yaml sets one (a silo GPU's own entry wins then)."""
    if not leave:
        return ()
    refs = {(g.node, g.index): g for g in evidence.gpus}
    rest = _without_pool_entries(fleet, name)
    out = []
    for node, index in sorted(leave):
        if not _in_fleet(fleet, node):
            continue
        g = refs.get((node, index))
        uuid, model = (g.uuid or None, g.name or None) if g is not None else (None, None)
        if fleet.pool_of(node, index, uuid, model) != name:
            continue
        before = fleet.desired_for(node, index, uuid, model)
        after = rest.desired_for(node, index, uuid, model)
        had_lines = before.limiter is not None if lined is None else (node, index) in lined
        out.append(
            Return(
                node,
                index,
                fleet.gpu_owner(node, index),
                cleared=had_lines and after.limiter is None,
                keeps_mig=before.mig is not None and after.mig is None,
            )
        )
    return tuple(out)


def _given_back(fleet: Fleet, name: str, evidence: Evidence) -> set[GpuKey]:
    """GPUs of the evidence that a reset entry of the pool selects (given back by hand)."""
    resets = [e for e in fleet.carve if _is_reset(e, name)]
    if not resets:
        return set()
    refs = [GpuRef(g.node, g.index, g.uuid, g.name) for g in evidence.gpus]
    return {r.key for e in resets for r in _picked(fleet, e.select, refs)[0]}


def _without_pool_entries(fleet: Fleet, name: str) -> Fleet:
    data = fleet.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data["version"] = fleet.version
    data["carve"] = [e for e in data.get("carve", []) if e.get("pool") != name]
    return fleet_from_data(data)


def _kept_memory(pool: Pool | None, team: str) -> int | None:
    if pool is None or team not in pool.guarantees:
        return None
    return pool.guarantees[team].memory


def _fit(units: dict[str, int], floors: Mapping[str, int], total: int) -> list[str]:
    """Cut guarantees above floors (largest surplus first) until they fit; what was cut."""
    cut = []
    while sum(units.values()) > total:
        team = max(units, key=lambda t: (units[t] - floors.get(t, 0), t))
        surplus = units[team] - floors.get(team, 0)
        take = min(surplus, sum(units.values()) - total)
        units[team] -= take
        cut.append(f"{team} -{take / UNITS_PER_GPU:g} GPU")
    return cut


def _saturated(
    fleet: Fleet, evidence: Evidence, opts: Options, pool_keys: set[tuple[str, int]]
) -> dict[str, int]:
    """Teams whose p95 use of their own silo (after the moves) is at least `saturated` of it:
    team -> silo size."""
    seen = evidence.observed()
    out = {}
    for team in fleet.teams:
        silo = [g for g in evidence.gpus if g.owner == team and (g.node, g.index) not in pool_keys]
        if not silo:
            continue
        use = p95([v for v, s in zip(evidence.team_series(team, silo), seen, strict=True) if s])
        if use >= opts.saturated * len(silo) - 1e-9:
            out[team] = len(silo)
    return out


def _largest_remainder(weights: Mapping[str, int], count: int) -> dict[str, int]:
    total = sum(weights.values())
    exact = {t: count * w / total for t, w in weights.items()}
    out = {t: math.floor(v) for t, v in exact.items()}
    left = count - sum(out.values())
    for t in sorted(exact, key=lambda t: (-(exact[t] - out[t]), -weights[t], t))[:left]:
        out[t] += 1
    return out


def _reason(team: str, floor: int, before: int, granted: int, saturated: Mapping[str, int]) -> str:
    parts = []
    if floor:
        parts.append(f"its p95 use of the pool's GPUs is {floor / 100:g} GPUs")
    if before > floor:
        parts.append(f"the pool guaranteed it {before / 100:g} GPUs before (kept)")
    if granted:
        parts.append(
            f"its own {saturated[team]} GPUs are saturated (p95): granted {granted // UNITS_PER_GPU} "
            "whole GPUs of the spare capacity"
        )
    return "; ".join(parts) or "kept"


def _memory_need(evidence: Evidence, gpus: Sequence[GpuEvidence]) -> dict[str, int]:
    """Per team, the p95 of its largest process on the pool's GPUs and its own GPUs: what one
    of its jobs needs on one GPU (rounded up to GiB)."""
    out: dict[str, int] = {}
    keys = {(g.node, g.index) for g in gpus}
    for g in evidence.gpus:
        for team, size in g.process_p95.items():
            if (g.node, g.index) in keys or g.owner == team:
                out[team] = max(out.get(team, 0), size)
    return {t: -(-v // GIB) * GIB for t, v in out.items() if v > 0}


# ---- carving --------------------------------------------------------------------------------------


def _carve(
    ordered: Sequence[GpuEvidence],
    laid: Mapping[GpuKey, Mapping[str, int]],
    pool: Pool | None,
    memory_need: Mapping[str, int],
    notes: list[str],
    caps_need: Mapping[str, int],
    overheads: Mapping[GpuKey, Overhead] | None = None,
) -> tuple[GpuCarving, ...]:
    """Each GPU's carving from the units laid on it. `memory_need`: the evidence's per-team need
    (MIG slice sizes); `caps_need`: the guarantees' memory (limiter caps); `overheads`: what the
    driver keeps of each card (said with its limiter carving)."""
    carving = pool.carving if pool is not None else "limiter"
    out = []
    for g in ordered:
        shares = laid[(g.node, g.index)]
        model = find_model(g.name) if g.name else None
        if carving == "mig" and model is not None:
            held = _held_text(g)
            mig = (
                f"processes still hold memory there ({held}); enabling MIG would stop them"
                if held and not g.mig
                else _mig_carving(g, model, shares, memory_need)
            )
            if isinstance(mig, GpuCarving):
                out.append(mig)
                continue
            notes.append(f"{g.label()} keeps limiter shares: {mig}")
        caps, short = _caps(g, shares, caps_need)
        for team in short:
            need = format_bytes(caps_need[team])
            if caps_need[team] > g.memory_total:  # no neighbour is to blame: the card is too small
                notes.append(
                    f"{g.label()}: {team}'s memory need ({need}) is more than the whole card "
                    f"({format_bytes(g.memory_total)} once the driver's reserve is taken out); its work "
                    "that needs more cannot run there"
                    + (
                        f"; its cap is {format_bytes(caps[team])}"
                        if team in caps and caps[team] < g.memory_total
                        else ""
                    )
                )
                continue
            notes.append(
                f"{g.label()}: {team}'s memory need ({need}) does not fit next to "
                f"what the others are capped at and what is held there; its cap is "
                f"{format_bytes(caps.get(team, g.memory_total))}"
            )
        out.append(
            GpuCarving(
                g.node,
                g.index,
                g.name,
                g.memory_total,
                dict(shares),
                "limiter",
                # a cap of the whole card (all the driver leaves of it, in the caps' steps) is none
                memory={t: c for t, c in caps.items() if c < _floor(g.memory_total, bool(g.memory_now))},
                held=sum(g.memory_now.values()),
                overhead=(overheads or {}).get((g.node, g.index)),
            )
        )
    return tuple(out)


def _lay(laid: dict[str, int], team: str, take: int, free: dict[GpuKey, int], key: GpuKey) -> None:
    laid[team] = laid.get(team, 0) + take
    free[key] -= take


def _pack(
    ordered: Sequence[GpuEvidence],
    units: Mapping[str, int],
    laid: dict[GpuKey, dict[str, int]],
    need: Mapping[str, int],
    first: Sequence[str],
) -> dict[str, int]:
    """Each team's units first where it already works (by its use there), then in order, on GPUs
    where its memory cap fits next to the others' and what is held; what fits nowhere is laid
    where compute is left (its cap is then cut, `_caps`). Only cards that hold a team's memory need
    take its units, the teams in `first` order (`_laid_out`). Returns the units left."""
    free = {(g.node, g.index): UNITS_PER_GPU for g in ordered}
    left = dict(units)
    holding = {t: [g for g in ordered if _holds(g, t, need)] for t in left}
    for team in first:
        for g in sorted(holding[team], key=lambda g: -max(g.teams.get(team, (0.0,)), default=0.0)):
            use = p95([v for v, o in zip(g.teams.get(team, ()), g.observed, strict=False) if o > 0])
            if use <= 0 or left[team] <= 0:
                continue
            key = (g.node, g.index)
            want = min(left[team], free[key], math.ceil(use * UNITS_PER_GPU - 1e-9))
            take = _fitting(g, laid[key], team, want, need)
            if take > 0:
                _lay(laid[key], team, take, free, key)
                left[team] -= take
    for fit in (True, False):
        for team in first:
            for g in holding[team]:
                key = (g.node, g.index)
                if left[team] <= 0:
                    break
                want = min(left[team], free[key])
                take = _fitting(g, laid[key], team, want, need) if fit else want
                if take > 0:
                    _lay(laid[key], team, take, free, key)
                    left[team] -= take
    return left


def _spread(
    ordered: Sequence[GpuEvidence],
    units: Mapping[str, int],
    laid: dict[GpuKey, dict[str, int]],
    need: Mapping[str, int],
    first: Sequence[str],
) -> dict[str, int]:
    """Water-fill for fixed-share, where a share is a cap even on an idle GPU: each team's units
    spread evenly over the pool's GPUs that hold its memory need (the remainder one unit each on
    the GPUs with the most room left, where it works first), so no GPU is one team's alone while
    other teams are guaranteed. Where every card holds every team, room stays level within one
    unit between GPUs, so everything fits; else what finds no room is returned (units left)."""
    free = {(g.node, g.index): UNITS_PER_GPU for g in ordered}
    rank = {(g.node, g.index): i for i, g in enumerate(ordered)}
    holding = {t: [g for g in ordered if _holds(g, t, need)] for t in units}
    left: dict[str, int] = {}
    for team in first:
        rest = max(0, units[team])
        works = {(g.node, g.index): max(g.teams.get(team, (0.0,)), default=0.0) for g in ordered}
        while rest > 0:
            room = [(g.node, g.index) for g in holding[team] if free[(g.node, g.index)] > 0]
            if not room:
                break
            base, extra = divmod(rest, len(room))
            for key in sorted(room, key=lambda k: (-free[k], -works[k], rank[k]))[:extra]:
                _lay(laid[key], team, 1, free, key)
                rest -= 1
            for key in sorted(room, key=lambda k: rank[k]):
                take = min(base, free[key])
                if take:
                    _lay(laid[key], team, take, free, key)
                    rest -= take
        left[team] = rest
    return left


def _caps(
    g: GpuEvidence, shares: Mapping[str, int], need: Mapping[str, int]
) -> tuple[dict[str, int], list[str]]:
    """Memory caps of the teams with a share on `g`, and the teams whose need had to be cut. A
    team's cap is its memory need, never below what it holds there plus its share of the memory
    nobody holds; all caps add up to at most what the other processes leave free (memory held
    by teams without a share there is taken as it is: running processes are not limited)."""
    if not g.memory_total:
        return {}, []
    held = dict(g.memory_now)
    if sum(held.values()) > g.memory_total:  # means over a bucket can add up to more than a card
        total = sum(held.values())
        held = {t: v * g.memory_total // total for t, v in held.items()}
    unheld = max(0, g.memory_total - sum(held.values()))
    limit = g.memory_total - sum(v for t, v in held.items() if shares.get(t, 0) <= 0)
    base = {
        t: _floor(held.get(t, 0) + unheld * u // UNITS_PER_GPU, bool(held))
        for t, u in shares.items()
        if u > 0
    }
    caps = {t: max(b, need.get(t, 0)) for t, b in base.items()}
    short: list[str] = []
    # Cut the largest needs back to their base until the caps fit (deterministic: by size, name).
    for team in sorted(caps, key=lambda t: (-(caps[t] - base[t]), t)):
        if sum(caps.values()) <= limit:
            break
        if caps[team] > base[team]:
            caps[team] = base[team]
            short.append(team)
    if not held:
        # Nothing is held: as before, a team without a known need gets no cap at all.
        caps = {t: c for t, c in caps.items() if need.get(t) or t in short}
    # A cap of nothing cannot be written (nor used): the whole card is held by others.
    return {t: c for t, c in caps.items() if c > 0}, sorted(short)


def _floor(size: int, near_held: bool) -> int:
    """Whole GiB where nothing is held and the cap is a GiB or more; else MiB (a GiB would waste
    memory next to what is held, or round a small share to nothing)."""
    step = GIB if not near_held and size >= GIB else MIB
    return size // step * step


def _fitting(g: GpuEvidence, laid: Mapping[str, int], team: str, want: int, need: Mapping[str, int]) -> int:
    """The most of `want` units `team` can get on `g` with every cap there fitting (0: none)."""
    if want <= 0 or not g.memory_total:
        return max(0, want)
    lo, hi = 0, want
    while lo < hi:  # the caps grow with the units: the largest take that fits
        mid = (lo + hi + 1) // 2
        _, short = _caps(g, {**laid, team: laid.get(team, 0) + mid}, need)
        if short:
            hi = mid - 1
        else:
            lo = mid
    return lo


def _held_text(g: GpuEvidence) -> str:
    """'robotics 6.0GiB (15%)': who holds memory on the GPU now, largest first."""
    parts = []
    for team, size in sorted(g.memory_now.items(), key=lambda tv: (-tv[1], tv[0])):
        share = f" ({size / g.memory_total:.0%})" if g.memory_total else ""
        parts.append(f"{team} {format_bytes(size)}{share}")
    return ", ".join(parts)


def _profile_for(model: MigModel, need: int) -> GpuInstanceProfile | None:
    fits = [
        p
        for p in model.profiles
        if not p.media_extensions
        and p.memory_mib * (1 << 20) >= need
        and p.compute_slices < model.compute_slice_count
    ]
    return min(fits, key=lambda p: (p.memory_mib, p.compute_slices, p.name)) if fits else None


def _mig_carving(
    g: GpuEvidence, model: MigModel, shares: Mapping[str, int], memory_need: Mapping[str, int]
) -> GpuCarving | str:
    need = max((memory_need.get(t, 0) for t in shares), default=0)
    profile = _profile_for(model, max(need, 1))
    if profile is None:
        return f"its teams' processes need {format_bytes(need)}, more than any MIG profile but the whole GPU"
    fraction = profile.compute_slices / model.compute_slice_count
    slices = {t: math.ceil(u / (UNITS_PER_GPU * fraction) - 1e-9) for t, u in shares.items() if u > 0}
    wanted = sum(slices.values())
    if wanted and not solve(model, {profile.name: wanted}).ok:
        return f"{wanted} x {profile.name} (to cover its shares) do not fit on {model.key}"
    spare = 0
    while spare < profile.max_count and solve(model, {profile.name: wanted + spare + 1}).ok:
        spare += 1
    return GpuCarving(
        g.node, g.index, g.name, g.memory_total, dict(shares), "mig", profile.name, slices, spare
    )


# ---- the proposed fleet.yaml ----------------------------------------------------------------------


def _size_text(size: int) -> str:
    return f"{-(-size // GIB)}GiB"


def _cap(size: int) -> int:
    """Whole GiB where it is, else whole MiB: a cap next to held memory rarely is a whole GiB."""
    return size if size % GIB == 0 else size // MIB * MIB


def _limiter(c: GpuCarving, pool: Pool | None, need: Mapping[str, int]) -> LimiterSpec:
    policy = pool.policy if pool is not None else "burst-share"
    borrowing = pool.borrowing if pool is not None else True
    tenants: dict[str, LimiterTenantSpec] = {}
    for team, u in sorted(c.units.items()):
        if team in c.memory:
            tenants[team] = LimiterTenantSpec.model_construct(compute=float(u), memory=_cap(c.memory[team]))
        else:
            tenants[team] = LimiterTenantSpec.model_construct(compute=float(u))
    if borrowing:
        tenants["*"] = LimiterTenantSpec.model_construct(policy="best-effort", klass="offline")
    return LimiterSpec.model_construct(policy=policy, tenants=tenants)


def _pool_entry(pool: str, node: str, indices: Sequence[int], **setting: Any) -> dict[str, Any]:
    """A carve entry of the pool for these GPUs of a node (typed, written by `entry_data`), `pool:`
    right after its `select:` as rebalance has always written it."""
    select = Select.model_construct(
        nodes=node, gpus=GpuSelect.model_construct(indices=format_gpu_indices(set(indices)))
    )
    data = entry_data(CarveEntry.model_construct(select=select, pool=pool, **setting))
    return {"select": data.pop("select"), "pool": data.pop("pool"), **data}


def proposed_fleet(fleet: Fleet, proposal: Proposal, known: Sequence[GpuRef] = ()) -> dict[str, Any]:
    """fleet.yaml's data with the proposal applied: the pool's members (moves added, returns taken
    out) and guarantees, and its carve entries (`pool: NAME`) rewritten; everything else as it
    was. `known`: GPUs besides the evidence's (live inventories) that a member selection taken
    apart may need. Raises MembershipError when a selection selects GPUs nobody knows."""
    data = fleet.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data["version"] = fleet.version
    name = proposal.pool
    pool = fleet.pools.get(name)
    if pool is None and not proposal.moves:  # no pool to make: not even an empty one
        return {"version": data.pop("version"), **data}
    pools = data.setdefault("pools", {})
    entry = pools.setdefault(name, {})
    selects = list(entry.get("gpus", []))
    refs = _known(proposal, known)
    leaving = {(r.node, r.index) for r in proposal.returns}
    if leaving and pool is not None:
        selects = without(fleet, name, selects, leaving, refs)
    by_node: dict[str, list[int]] = {}
    for m in proposal.moves:
        by_node.setdefault(m.node, []).append(m.index)
    for node, indices in by_node.items():
        selects.append({"nodes": node, "gpus": format_gpu_indices(set(indices))})
    entry["gpus"] = selects
    need = {g.team: g.memory for g in proposal.guarantees if g.memory}
    guarantees: dict[str, Any] = {}
    for g in proposal.guarantees:
        item: dict[str, Any] = {"share": f"{proposal.share(g.team):g}%"}
        if g.memory:
            item["memory"] = _size_text(g.memory)
        guarantees[g.team] = item
    entry["guarantees"] = guarantees
    members = {(c.node, c.index) for c in proposal.carvings} | {(m.node, m.index) for m in proposal.moves}
    written = data.get("carve", [])
    resets = _resets(fleet, name, written, members, refs)
    cleared = {(r.node, r.index) for r in proposal.returns if r.cleared}
    for node, indices in _by_node(cleared - _selected(fleet, resets, refs), [n.name for n in fleet.nodes]):
        resets.append(_reset_entry(name, node, indices))
    carve = [e for e in written if e.get("pool") != name]
    groups: dict[tuple[str, str], tuple[dict[str, Any], list[int]]] = {}
    for c in proposal.carvings:
        setting: dict[str, Any]
        if c.kind == "mig":
            count = sum(c.slices.values()) + c.spare
            setting = {"mig": MigSpec.model_construct(enabled=True, profiles={c.profile: count})}
        else:
            setting = {"limiter": _limiter(c, pool, need)}
        key = (c.node, repr({k: entry_data(v) for k, v in setting.items()}))
        groups.setdefault(key, (setting, []))[1].append(c.index)
    for (node, _), (setting, indices) in groups.items():
        carve.append(_pool_entry(name, node, indices, **setting))
    # Resets come first: any later entry that sets the GPU's limiter (its owner's own, or the
    # pool's when it joins again) wins over them.
    data["carve"] = resets + carve
    return {"version": data.pop("version"), **data}


# ---- membership and the limiter lines of GPUs given back -------------------------------------------


def _known(proposal: Proposal, known: Sequence[GpuRef]) -> list[GpuRef]:
    seen = {r.key: r for r in proposal.known}
    for r in known:
        seen.setdefault(r.key, r)
    return list(seen.values())


def _by_node(keys: set[GpuKey], order: Sequence[str]) -> list[tuple[str, list[int]]]:
    groups: dict[str, list[int]] = {}
    for node, index in keys:
        groups.setdefault(node, []).append(index)
    rank = {n: i for i, n in enumerate(order)}
    return sorted(groups.items(), key=lambda kv: (rank.get(kv[0], len(rank)), kv[0]))


def _reset_entry(pool: str, node: str, indices: Sequence[int]) -> dict[str, Any]:
    return _pool_entry(pool, node, indices, limiter=LimiterSpec.model_construct(enabled=False))


def _is_reset(entry: CarveEntry, pool: str) -> bool:
    """An entry this pool wrote for GPUs it gave back: their limiter lines cleared, nothing else."""
    return (
        entry.pool == pool
        and entry.limiter is not None
        and not entry.limiter.enabled
        and entry.mig is None
        and entry.mps is None
    )


def _picked(fleet: Fleet, select: Any, refs: Sequence[GpuRef]) -> tuple[list[GpuRef], list[str]]:
    """The known GPUs a selection selects, and the selected nodes none of whose GPUs is known."""
    by_node: dict[str, list[GpuRef]] = {}
    for ref in refs:
        by_node.setdefault(ref.node, []).append(ref)
    matcher = parse_selector(select.nodes)
    picked: list[GpuRef] = []
    unknown: list[str] = []
    for node in fleet.nodes:
        if not matcher.matches(node.name, node.labels):
            continue
        mine = by_node.get(node.name, [])
        if not mine:
            unknown.append(node.name)
        picked += [r for r in mine if pool_selects(select, node, r.index, r.uuid or None, r.name or None)]
    return picked, unknown


def _selected(fleet: Fleet, entries: Sequence[dict[str, Any]], refs: Sequence[GpuRef]) -> set[GpuKey]:
    out: set[GpuKey] = set()
    for e in entries:
        select = CarveEntry.model_validate(e).select
        out |= {r.key for r in _picked(fleet, select, refs)[0]}
    return out


def _resets(
    fleet: Fleet, pool: str, written: Sequence[dict[str, Any]], members: set[GpuKey], refs: Sequence[GpuRef]
) -> list[dict[str, Any]]:
    """The pool's reset entries that stay: as written where they select no member of the new pool,
    else as explicit entries of the other GPUs they select (a GPU back in the pool gets the pool's
    limiter lines again)."""
    out: list[dict[str, Any]] = []
    for model, data in zip(fleet.carve, written, strict=True):
        if not _is_reset(model, pool):
            continue
        picked, _ = _picked(fleet, model.select, refs)
        keep = {r.key for r in picked if r.key not in members}
        if len(keep) == len(picked):
            out.append(data)
            continue
        for node, indices in _by_node(keep, [n.name for n in fleet.nodes]):
            out.append(_reset_entry(pool, node, indices))
    return out


def without(
    fleet: Fleet, pool: str, selects: list[Any], leave: set[GpuKey], known: Sequence[GpuRef]
) -> list[Any]:
    """The pool's member selections (`selects`: the data of `fleet.pools[pool].gpus`, in order)
    with the GPUs of `leave` taken out: a selection that selects none of them stays as written;
    one that does is replaced by explicit selections of the other GPUs it selects (there is no
    way to write "these nodes but not that GPU"). Raises MembershipError when that needs GPUs
    nobody knows (a selected node with no history and no live data)."""
    entry = fleet.pools[pool]
    out: list[Any] = []
    for sel, data in zip(entry.gpus, selects, strict=True):
        picked, unknown = _picked(fleet, sel, known)
        if not any(r.key in leave for r in picked):
            out.append(data)
            continue
        if unknown:
            raise MembershipError(
                f"cannot take GPUs out of pool {pool}: its selection {_show(data)} also selects "
                f"{unknown[0]}, whose GPUs are not known (no history, no live data); edit fleet.yaml"
            )
        keep = {r.key for r in picked if r.key not in leave}
        for node_name, indices in _by_node(keep, [n.name for n in fleet.nodes]):
            out.append({"nodes": node_name, "gpus": format_gpu_indices(set(indices))})
    return out


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_show(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


__all__ = [
    "GpuCarving",
    "GpuKey",
    "GpuRef",
    "Guarantee",
    "MembershipError",
    "Move",
    "Options",
    "Proposal",
    "Return",
    "propose",
    "proposed_fleet",
    "without",
]
