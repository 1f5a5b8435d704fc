"""A change to a pool, from evidence to applied: the fleet's silos and a pool over a window of
history, a change to the pool (GPUs moved in or out by hand, or the planner's proposal) as a new
fleet.yaml, its plan, and applying it. The Pool screen (tui/screens/pool.py) shows and drives it.

The Pool screen's model, as the feed (views/feed.py) is the live screens': the screen imports
only this (and the other view models), never tenancy/ or plan/ (import-linter's `tui` contract).
Nothing here draws or knows Textual; the screen runs each step in a worker. Every step that reads
nodes is a coroutine; the computing parts (evidence, the planner, YAML) run in a thread so that a
big fleet does not stall the screen. An expected failure is a `PoolError` with one line for a
person (a node that cannot be read is not a failure: it is listed in `PoolView.missing`).

The steps, as `gpuops tenants`, `rebalance`, `plan` and `apply` do them:

1. `PoolSource.load(window, pool)`: fleet.yaml, every node's history over the window
   (`read_histories`) and live state (`read_fleet`: MIG layout, limiter table), evidence per GPU
   and the per-team figures of the silos and the pool (`PoolView`).
2. `draft_moves(view, current, join, leave)` or `draft_planner(view, current)`: the new fleet.yaml
   data (`Draft`) from the planner (`propose` + `proposed_fleet`). Moves by hand are the
   planner's `Options(moves=False, join=..., leave=...)`: it moves nothing on its own, rewrites
   the members, recomputes the guarantees and the carve entries marked `pool: NAME`, and clears
   the limiter lines of a GPU given back (`Options.lined`: those fleet.yaml as read or the node
   gives lines) when nothing else in fleet.yaml sets its limiter.
3. `PoolSource.review(draft)`: the new file's text and its plan against the live nodes (what
   `gpuops plan` prints).
4. `PoolSource.apply(review)`: fleet.yaml rewritten (atomically, the old one kept as
   `fleet.yaml.bak-<time>`), then the reviewed plan applied per node (`apply_fleet`), each node's
   result listed.
"""

from __future__ import annotations

import asyncio
import stat
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from gpuops.core.atomic_file import atomic_write
from gpuops.core.driver_memory import DriverMemory
from gpuops.core.history import History
from gpuops.core.model import Gpu
from gpuops.core.units import format_bytes, format_percent
from gpuops.fleet.source import FleetSnapshot
from gpuops.fleet.targets import node_targets
from gpuops.plan.apply import CHANGED, PARTIAL, UNCHANGED, NodeResult, apply_fleet
from gpuops.plan.diff import make_plan
from gpuops.plan.live import NodeLive, read_fleet
from gpuops.plan.model import Plan, digest
from gpuops.plan.render import plan_lines
from gpuops.spec import Fleet, dump_fleet, fleet_from_data, load_fleet, parse_fleet
from gpuops.spec.edit import EditError, set_pool
from gpuops.spec.errors import SpecError
from gpuops.tenancy.accounting import (
    Evidence,
    TeamSide,
    Window,
    WindowError,
    gather_evidence,
    parse_window,
    repool,
    team_sides,
    weighted_mean,
)
from gpuops.tenancy.attribution import UNATTRIBUTED
from gpuops.tenancy.gather import no_history, read_histories
from gpuops.tenancy.ownership import UNOWNED
from gpuops.tenancy.rebalance import (
    GpuKey,
    GpuRef,
    MembershipError,
    Options,
    Proposal,
    propose,
    proposed_fleet,
)

WINDOWS = ("1h", "24h", "7d")
DEFAULT_WINDOW = "24h"
DEFAULT_POOL = "shared"
APPLY_PARALLEL = 10


class PoolError(Exception):
    """An expected failure of a step; the message is one line for a person."""


def key_text(key: GpuKey) -> str:
    return f"{key[0]}:{key[1]}"


def parse_key(text: str) -> GpuKey:
    node, _, index = text.rpartition(":")
    return node, int(index)


# ---- what the Pool screen shows-----------------------------------------------------------------------


@dataclass(frozen=True)
class PoolGpu:
    """One GPU over the window: where it is (silo or pool), how busy, who used it."""

    node: str
    index: int
    name: str
    uuid: str
    owner: str | None
    pool: str | None
    p95: float  # of its busy fraction per bucket
    mean: float
    coverage: float  # of the window's buckets with data
    users: tuple[tuple[str, float], ...]  # (team, mean GPU-time), largest first
    mig: bool

    @property
    def key(self) -> GpuKey:
        return (self.node, self.index)

    @property
    def label(self) -> str:
        return key_text(self.key)


@dataclass(frozen=True)
class PoolView:
    """fleet.yaml, the evidence over a window and the live state, for one pool."""

    file: Path
    data: bytes  # fleet.yaml as read (its digest guards the rewrite)
    fleet: Fleet
    pool: str
    window: Window
    read_at: float
    histories: Mapping[str, History | str]
    evidence: Evidence
    lives: Mapping[str, NodeLive]
    teams: tuple[TeamSide, ...]
    gpus: tuple[PoolGpu, ...]
    missing: Mapping[str, str]  # node -> why its history or live state is not here

    @property
    def pools(self) -> tuple[str, ...]:
        names = list(self.fleet.pools)
        return tuple(names if self.pool in names else [*names, self.pool])

    @property
    def members(self) -> int:
        return sum(1 for g in self.gpus if g.pool == self.pool)

    @property
    def driver_memory(self) -> dict[GpuKey, DriverMemory]:
        """What each GPU's node observed of its driver's memory (the planner lays caps on what the
        driver leaves of a card, and says how much goes to it)."""
        return live_driver_memory(self.lives.values())

    def carving(self, key: GpuKey) -> str:
        """What the node has on this GPU now: its MIG instances and limiter tenant lines."""
        live = self.lives.get(key[0])
        if live is None or not live.ok:
            return ""
        gpu = next((g for g in live.gpus if g.info.index == key[1]), None)
        return carving_text(live, gpu) if gpu is not None else ""


@dataclass(frozen=True)
class Draft:
    """A change to the pool, not yet reviewed or applied: the new fleet.yaml data."""

    view: PoolView
    kind: str  # "moves" (by hand) or "planner"
    data: dict[str, Any]
    fleet: Fleet
    proposal: Proposal
    explanation: tuple[str, ...]
    joined: tuple[GpuKey, ...]  # GPUs that enter the pool, against the file on disk
    left: tuple[GpuKey, ...]  # GPUs that leave it
    where: Mapping[GpuKey, str | None]  # each GPU's pool after the change
    teams: tuple[TeamSide, ...]  # the figures with the new members and guarantees
    changed: bool  # whether fleet.yaml changes at all


@dataclass(frozen=True)
class Review:
    """A draft with its fleet.yaml text and its plan against the live nodes."""

    draft: Draft
    text: str
    plan: Plan
    lines: tuple[str, ...]  # rich markup, as `gpuops plan` prints them
    preserved: bool  # the text keeps the file's comments and layout (else: written anew)

    @property
    def todo(self) -> dict[str, Any]:
        return {n.name: n for n in self.plan.nodes if n.changes or n.failed}


@dataclass(frozen=True)
class Applied:
    review: Review
    backup: Path | None
    results: tuple[NodeResult, ...]
    lines: tuple[str, ...] = field(default=())  # rich markup

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def changed(self) -> bool:
        """Whether anything changed: fleet.yaml rewritten, or a node that did something."""
        return self.backup is not None or any(r.status in (CHANGED, PARTIAL) or r.done for r in self.results)


# ---- figures ----------------------------------------------------------------------------------------


def pool_gpus(evidence: Evidence) -> tuple[PoolGpu, ...]:
    out = []
    for g in evidence.gpus:
        users = sorted(
            ((team, weighted_mean(series, g.observed)) for team, series in g.teams.items()),
            key=lambda tu: (-tu[1], tu[0]),
        )
        out.append(
            PoolGpu(
                node=g.node,
                index=g.index,
                name=g.name,
                uuid=g.uuid,
                owner=g.owner,
                pool=g.pool,
                p95=g.p95_busy(),
                mean=g.mean_busy(),
                coverage=g.coverage(),
                users=tuple((t, v) for t, v in users if v >= 0.005),
                mig=g.mig,
            )
        )
    return tuple(out)


def team_order(team: str) -> tuple[bool, str]:
    """Teams by name, the unowned and the unattributed last."""
    return (team in (UNOWNED, UNATTRIBUTED), team)


def total_side(rows: Sequence[TeamSide]) -> TeamSide:
    """The teams' figures added up (the 'all teams' line); percentiles do not add up: p95 is 0."""
    return TeamSide(
        team="all teams",
        silo_gpus=sum(r.silo_gpus for r in rows),
        silo_used=sum(r.silo_used for r in rows),
        silo_idle=sum(r.silo_idle for r in rows),
        pool_gpus=sum(r.pool_gpus for r in rows),
        guaranteed=sum(r.guaranteed for r in rows),
        pool_used=sum(r.pool_used for r in rows),
        pool_idle=sum(r.pool_idle for r in rows),
        borrowed=sum(r.borrowed for r in rows),
        p95=0.0,
    )


def known_gpus(snapshot: FleetSnapshot) -> list[GpuRef]:
    """Every GPU the live view knows (its nodes' inventories), for a move of GPUs that the window's
    evidence and the nodes' live state may not list."""
    refs = []
    for node in snapshot.nodes:
        for gpu in node.inventory.gpus if node.inventory is not None else ():
            refs.append(GpuRef(node.name, gpu.info.index, gpu.info.uuid, gpu.info.name))
    return refs


def live_driver_memory(lives: Iterable[NodeLive]) -> dict[GpuKey, DriverMemory]:
    """(node, GPU index) -> what the node observed of the GPU's driver memory, where it did."""
    return {
        (live.name, gpu.info.index): gpu.info.driver_memory
        for live in lives
        if live.ok
        for gpu in live.gpus
        if gpu.info.driver_memory is not None
    }


def carving_text(live: NodeLive, gpu: Gpu) -> str:
    """'limiter vision 100%, * best-effort' / 'MIG 3g.40gb, 1g.10gb x2' / 'MIG off'."""
    parts = []
    if gpu.mig is not None and gpu.mig.current:
        counts: dict[str, int] = {}
        for gi in gpu.mig.gpu_instances:
            counts[gi.profile_name] = counts.get(gi.profile_name, 0) + 1
        shown = ", ".join(f"{p} x{c}" if c > 1 else p for p, c in sorted(counts.items()))
        parts.append(f"MIG {shown or 'on, no instances'}")
    if live.limiter is not None:
        lines = sorted(live.lines_of(gpu), key=lambda t: (t.name == "*", t.name))
        if lines:
            terms = []
            for line in lines:
                what = format_percent(line.compute) if line.compute is not None else line.effective_policy()
                if line.memory is not None:
                    what += f" {format_bytes(line.memory)}"
                terms.append(f"{line.name} {what}")
            parts.append("limiter " + ", ".join(terms))
    return " · ".join(parts)


# ---- fleet.yaml data ----------------------------------------------------------------------------------


def _load_data(data: dict[str, Any], view: PoolView) -> Fleet:
    try:
        return fleet_from_data(data, str(view.file), base_dir=view.file.parent)
    except SpecError as exc:  # our own output must load; say so plainly if not
        raise PoolError(f"the new fleet.yaml does not load (a bug): {str(exc).splitlines()[0]}") from None


def _refs(view: PoolView, known: Sequence[GpuRef]) -> list[GpuRef]:
    """Every GPU known, from the evidence and from the live inventories, once each."""
    seen: dict[GpuKey, GpuRef] = {}
    for g in view.evidence.gpus:
        seen[(g.node, g.index)] = GpuRef(g.node, g.index, g.uuid, g.name)
    for live in view.lives.values():
        for gpu in live.gpus:
            seen.setdefault(
                (live.name, gpu.info.index), GpuRef(live.name, gpu.info.index, gpu.info.uuid, gpu.info.name)
            )
    for ref in known:
        seen.setdefault((ref.node, ref.index), ref)
    return list(seen.values())


def _lined(view: PoolView, keys: Sequence[GpuKey], refs: Sequence[GpuRef]) -> frozenset[GpuKey]:
    """Of `keys`, the GPUs whose limiter lines are on the nodes: fleet.yaml as read gives them a
    limiter, or their node reports lines for them. A GPU that joined in the change under review
    and leaves again never got any."""
    by_key = {r.key: r for r in refs}
    out = set()
    for key in keys:
        ref = by_key.get(key, GpuRef(*key))
        on_disk = view.fleet.desired_for(key[0], key[1], ref.uuid or None, ref.name or None)
        live = view.lives.get(key[0])
        gpu = next((g for g in live.gpus if g.info.index == key[1]), None) if live is not None else None
        has_lines = bool(
            gpu is not None
            and live is not None
            and live.limiter
            and any(x.applies_to(gpu.info.index, gpu.info.uuid) for x in live.limiter)
        )
        if on_disk.limiter is not None or has_lines:
            out.add(key)
    return frozenset(out)


def _finish(
    view: PoolView,
    kind: str,
    data: dict[str, Any],
    proposal: Proposal,
    explanation: Sequence[str],
) -> Draft:
    fleet = _load_data(data, view)
    evidence = repool(view.evidence, fleet)
    where = {(g.node, g.index): g.pool for g in evidence.gpus}
    before = {g.key: g.pool for g in view.gpus}
    pool = view.pool
    joined = tuple(k for k, p in where.items() if p == pool and before.get(k) != pool)
    left = tuple(k for k, p in where.items() if p != pool and before.get(k) == pool)
    return Draft(
        view=view,
        kind=kind,
        data=data,
        fleet=fleet,
        proposal=proposal,
        explanation=tuple(explanation),
        joined=joined,
        left=left,
        where=where,
        teams=team_sides(evidence, fleet, pool),
        changed=dump_fleet(fleet) != dump_fleet(view.fleet),
    )


def draft_moves(
    view: PoolView,
    current: Draft | None,
    join: Iterable[GpuKey] = (),
    leave: Iterable[GpuKey] = (),
    known: Sequence[GpuRef] = (),
) -> Draft:
    """GPUs moved into the pool (`join`) or back to their owners' silos (`leave`) by hand, on top
    of the change under review (`current`), with guarantees and carving recomputed by the
    planner (which moves nothing else on its own)."""
    pool = view.pool
    base = current.fleet if current is not None else view.fleet
    evidence = repool(view.evidence, base)
    where = {(g.node, g.index): g.pool for g in evidence.gpus}
    join, leave = sorted(set(join)), sorted(set(leave))
    for key in join:
        other = where.get(key)
        if other is not None and other != pool:
            raise PoolError(f"{key_text(key)} is in pool {other}: take it out of that pool first")
    add = [k for k in join if where.get(k) is None]
    out = [k for k in leave if where.get(k) == pool]
    if not add and not out:
        if join:
            raise PoolError(f"{_few(join)} {'is' if len(join) == 1 else 'are'} in pool {pool} already")
        if leave:
            raise PoolError(f"{_few(leave)} {'is' if len(leave) == 1 else 'are'} not in pool {pool}")
        raise PoolError("no GPU to move: mark GPUs with space first")
    refs = _refs(view, known)
    options = Options(
        pool=pool,
        moves=False,
        join=tuple(add),
        leave=tuple(out),
        lined=_lined(view, out, refs),
        driver_memory=view.driver_memory,
    )
    proposal = propose(base, evidence, options)
    if proposal.infeasible:
        raise PoolError(proposal.explain()[0])
    try:
        new = proposed_fleet(base, proposal, refs)
    except MembershipError as exc:
        raise PoolError(str(exc)) from None
    return _finish(view, "moves", new, proposal, _on_top(current) + tuple(proposal.explain()))


def draft_planner(view: PoolView, current: Draft | None = None) -> Draft:
    """The planner's proposal for the pool (on top of the change under review, if any)."""
    base = current.fleet if current is not None else view.fleet
    proposal = propose(
        base, repool(view.evidence, base), Options(pool=view.pool, driver_memory=view.driver_memory)
    )
    if proposal.infeasible:
        raise PoolError(proposal.explain()[0])
    explanation = _on_top(current) + tuple(proposal.explain())
    return _finish(view, "planner", proposed_fleet(base, proposal), proposal, explanation)


def _on_top(current: Draft | None) -> tuple[str, ...]:
    """A first line saying what the change is made on top of (the change under review)."""
    if current is None or not (current.joined or current.left):
        return ()
    what = []
    if current.joined:
        what.append(f"{_few(current.joined)} into pool {current.view.pool}")
    if current.left:
        what.append(f"{_few(current.left)} back to the silos")
    return (f"on top of the change under review: {' and '.join(what)}",)


def _few(keys: Sequence[GpuKey]) -> str:
    shown = ", ".join(key_text(k) for k in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


# ---- fleet.yaml text -----------------------------------------------------------------------------------


def fleet_text(view: PoolView, draft: Draft) -> tuple[str, bool]:
    """The new fleet.yaml text, and whether it keeps the file's comments and layout: the file
    edited in place where that reads back as the draft's fleet, else the whole file written anew."""
    try:
        text = set_pool(view.data.decode("utf-8"), view.pool, draft.data)
        parsed = parse_fleet(text, str(view.file), base_dir=view.file.parent)
        if dump_fleet(parsed) == dump_fleet(draft.fleet):
            return text, True
    except (EditError, SpecError, UnicodeDecodeError):
        pass  # not editable in place, or the edit does not read back as the draft: written anew
    except Exception:  # ruamel's emitter and representer errors have no common base: written anew
        pass
    comment = (
        f"Written by the gpuops TUI's Pool screen (pool {view.pool}); the previous file is kept as a backup"
    )
    return dump_fleet(draft.fleet, comment=comment), False


def backup_path(path: Path, now: float) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    candidate = path.with_name(f"{path.name}.bak-{stamp}")
    n = 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.bak-{stamp}-{n}")
    return candidate


def write_fleet(path: Path, expected: bytes, text: str, now: float) -> Path:
    """Replace fleet.yaml atomically, after keeping the current file as `<name>.bak-<time>`.
    Refuses when the file is no longer what was read (someone else changed it)."""
    target = path.resolve()
    try:
        current = target.read_bytes()
    except OSError as exc:
        raise PoolError(f"cannot read {path}: {exc.strerror or exc}") from None
    if digest(current) != digest(expected):
        raise PoolError(
            f"{path} changed since it was read: nothing written or applied; press r to read it again"
        )
    backup = backup_path(target, now)
    try:
        mode = stat.S_IMODE(target.stat().st_mode)
        # The backup is private (0600); the new file keeps the operator's own mode, and is 0600
        # until it is complete (core/atomic_file.py).
        atomic_write(backup, current)
        atomic_write(target, text, mode)
    except OSError as exc:
        raise PoolError(f"cannot write {path}: {exc.strerror or exc}; nothing applied") from None
    return backup


def result_lines(results: Sequence[NodeResult]) -> list[str]:
    """Per node what was done and not (rich markup), and a summary, as `gpuops apply` prints."""
    lines = []
    for r in sorted(results, key=lambda r: r.name):
        style = {CHANGED: "green", UNCHANGED: "dim", PARTIAL: "yellow"}.get(r.status, "red")
        line = f"[bold]node {escape(r.name)}[/]: [{style}]{r.status}[/]"
        lines.append(line + (f": {escape(r.error)}" if r.error else ""))
        lines += [f"  [green]done[/] {escape(x)}" for x in r.done]
        lines += [f"  [red]not done[/] {escape(x)}" for x in r.refused]
    counts = {s: sum(r.status == s for r in results) for s in (CHANGED, UNCHANGED, PARTIAL)}
    bad = len(results) - sum(counts.values())
    lines.append(
        f"Apply: {counts[CHANGED]} node(s) changed, {counts[UNCHANGED]} unchanged, "
        f"{counts[PARTIAL]} partly done, {bad} refused or failed."
    )
    return lines


# ---- the source -------------------------------------------------------------------------------------


class PoolSource:
    """The Pool screen's link to fleet.yaml and the nodes."""

    def __init__(self, fleet_file: Path, parallel: int = 32) -> None:
        self.fleet_file = fleet_file
        self.parallel = parallel
        # Told (nodes whose history is read, nodes) as a `load` reads the nodes' history: first
        # (0, n), then once per node as it ends. The Pool screen draws it as a progress line.
        self.progress: Callable[[int, int], None] | None = None

    def read_file(self) -> tuple[Fleet, bytes]:
        try:
            data = self.fleet_file.read_bytes()
        except OSError as exc:
            raise PoolError(f"cannot read {self.fleet_file}: {exc.strerror or exc}") from None
        try:
            fleet = load_fleet(str(self.fleet_file))
        except SpecError as exc:
            lines = str(exc).splitlines()
            more = f" (and {len(lines) - 1} more: gpuops validate)" if len(lines) > 1 else ""
            raise PoolError((lines[0] if lines else "fleet.yaml does not load") + more) from None
        return fleet, data

    async def load(
        self,
        window_text: str = DEFAULT_WINDOW,
        pool: str | None = None,
        histories: Mapping[str, History | str] | None = None,
        now: float | None = None,
    ) -> PoolView:
        """fleet.yaml, each node's history over the window (or `histories` already read for it)
        and live state. Nodes that cannot be read are listed in `missing`."""
        try:
            window = parse_window(window_text)
        except WindowError as exc:
            raise PoolError(str(exc)) from None
        fleet, data = self.read_file()
        now = time.time() if now is None else now
        targets = node_targets(fleet)
        shakes = fleet.max_handshakes
        reads: list[Any] = [read_fleet(targets, parallel=self.parallel, handshakes=shakes)]
        if histories is None:
            progress, total, count = self.progress, len(targets), 0

            def done(_node: str, _result: History | str) -> None:
                nonlocal count
                count += 1
                if progress is not None:
                    progress(count, total)

            if progress is not None:
                progress(0, total)
            reads.append(
                read_histories(
                    targets,
                    window,
                    now,
                    parallel=self.parallel,
                    handshakes=shakes,
                    done=done if progress is not None else None,
                )
            )
        answers = await asyncio.gather(*reads)
        lives: list[NodeLive] = answers[0]
        read: Mapping[str, History | str] = answers[1] if histories is None else histories
        name = pool or (next(iter(fleet.pools)) if fleet.pools else DEFAULT_POOL)
        return await asyncio.to_thread(self._view, fleet, data, name, window, now, read, lives)

    def _view(
        self,
        fleet: Fleet,
        data: bytes,
        pool: str,
        window: Window,
        now: float,
        histories: Mapping[str, History | str],
        lives: Sequence[NodeLive],
    ) -> PoolView:
        evidence = gather_evidence(fleet, histories, window, now)
        missing: dict[str, str] = {**no_history(dict(histories)), **evidence.missing}
        for live in lives:
            if not live.ok and live.name not in missing:
                missing[live.name] = f"live state: {live.error or 'no data'}"
        return PoolView(
            file=self.fleet_file,
            data=data,
            fleet=fleet,
            pool=pool,
            window=window,
            read_at=now,
            histories=histories,
            evidence=evidence,
            lives={live.name: live for live in lives},
            teams=team_sides(evidence, fleet, pool),
            gpus=pool_gpus(evidence),
            missing=missing,
        )

    async def moves(
        self,
        view: PoolView,
        current: Draft | None,
        join: Iterable[GpuKey],
        leave: Iterable[GpuKey],
        known: Sequence[GpuRef],
    ) -> Review:
        draft = await asyncio.to_thread(draft_moves, view, current, list(join), list(leave), list(known))
        return await self.review(draft)

    async def planner(self, view: PoolView, current: Draft | None) -> Review:
        draft = await asyncio.to_thread(draft_planner, view, current)
        return await self.review(draft)

    async def review(self, draft: Draft) -> Review:
        """The draft's fleet.yaml text and its plan against the nodes as they are now."""
        view = draft.view
        text, preserved = await asyncio.to_thread(fleet_text, view, draft)
        targets = node_targets(draft.fleet)
        lives = await read_fleet(targets, parallel=self.parallel, handshakes=draft.fleet.max_handshakes)
        plan = await asyncio.to_thread(
            make_plan, draft.fleet, lives, str(view.file), digest(text.encode("utf-8")), time.time()
        )
        return Review(draft, text, plan, tuple(plan_lines(plan)), preserved)

    async def apply(self, review: Review, now: float | None = None) -> Applied:
        """Write the new fleet.yaml (backup first), then apply the reviewed plan node by node."""
        view, draft = review.draft.view, review.draft
        now = time.time() if now is None else now
        backup = None
        if draft.changed:
            backup = await asyncio.to_thread(write_fleet, view.file, view.data, review.text, now)
        todo = review.todo
        results: list[NodeResult] = []
        if todo:
            targets = node_targets(draft.fleet)
            results = await apply_fleet(draft.fleet, targets, todo, force=False, parallel=APPLY_PARALLEL)
        lines = (
            result_lines(results) if results else ["Nothing to apply on the nodes: the plan has no changes."]
        )
        return Applied(review, backup, tuple(results), tuple(lines))


__all__ = [
    "DEFAULT_POOL",
    "DEFAULT_WINDOW",
    "WINDOWS",
    "Applied",
    "Draft",
    # the types of the figures and keys this model hands out (tenancy/'s), for the screen
    "GpuKey",
    "PoolError",
    "PoolGpu",
    "PoolSource",
    "PoolView",
    "Review",
    "TeamSide",
    "carving_text",
    "draft_moves",
    "draft_planner",
    "fleet_text",
    "key_text",
    "known_gpus",
    "parse_key",
    "team_order",
    "total_side",
    "write_fleet",
]
