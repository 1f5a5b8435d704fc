"""Simulated demand: a batch scheduler for the sim fleet that runs queued work where it is granted.

The scenarios queue work for busy teams (workloads with start "pending"). In a real data centre a
batch scheduler (Slurm, Kubernetes) starts such work when a GPU it may use frees up; here this
module plays that part for every simulated node at once, so that rebalancing visibly changes
utilization. It never reads fleet.yaml: what a team may use is what is applied on the nodes,
exactly as a scheduler integrated with gpuops would see it.

Where a team's job may run (whole GPUs only, one scheduled job per GPU):

1. `guaranteed`: the node's limiter tenant table (written by `gpuops apply`) has a line for the
   team that covers the GPU (its `gpus=` names the GPU's index or UUID, or no `gpus=`);
2. `silo`: the team owns the GPU (the sim spec's owner);
3. `borrowed`: the table has a `*` line covering the GPU (a pool that allows borrowing).

A GPU takes a job when it is not in MIG mode, not lost, under `IDLE_BELOW` % utilization from
the work already there, and has the job's memory free. Jobs start in queue order; each goes to
the first GPU by grant (guaranteed, silo, borrowed), then node order, then index. A job with a
guarantee or a silo (online work) that finds no GPU preempts a borrower on a GPU it is granted:
the borrower goes back to the queue and keeps the work it has done (checkpoint and requeue, as
the limiter's online-over-offline rule and Slurm's preemption do). Under `fixed-share` a team's
job progresses at its share of the GPU (the cap holds even when the GPU is otherwise idle).

Queued work runs `speed` times faster than real time (`gpuops sim up --queue-speed`), so a 6 h
job of the scenario is done in 6 minutes at the default 60; the job's own clock (warm-up,
checkpoints) runs as fast, so its figures look like the full-speed job's. What runs, what waits
and what is done goes to `demand.json` in the fleet's directory (`gpuops sim queue` prints it).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuops.core.atomic_file import atomic_write
from gpuops.node.backends.base import BackendError
from gpuops.node.backends.sim import SimBackend
from gpuops.node.limiter import LimiterError, TenantSpec, read_table
from gpuops.node.sim import workloads as wl
from gpuops.node.sim.spec import WorkloadSpec
from gpuops.simfleet.scenarios import DEFAULT_SPEED

log = logging.getLogger("gpuops.simfleet")

QUEUED, RUNNING, DONE = "queued", "running", "done"
GUARANTEED, SILO, BORROWED = "guaranteed", "silo", "borrowed"
_RANK = {GUARANTEED: 0, SILO: 1, BORROWED: 2}
IDLE_BELOW = 10.0  # % utilization from the work already on a GPU: above it, the GPU is taken
TICK_SECONDS = 2.0
RESCAN_SECONDS = 30.0  # look for room this often even when nothing was freed (other work ends)
WRITE_EVERY = 10.0  # seconds between rewrites of demand.json while only progress changes
FILE_VERSION = 1


@dataclass(frozen=True)
class Grant:
    """What a team may do on one GPU: how (`kind`) and how fast its work goes there (`rate`,
    1 for the whole GPU, a fixed-share cap below 1)."""

    kind: str
    rate: float = 1.0

    @property
    def online(self) -> bool:
        return self.kind != BORROWED


def grant_on(
    table: Sequence[TenantSpec], index: int, uuid: str, owner: str | None, team: str
) -> Grant | None:
    """The grant of `team` on a GPU, from the node's tenant table and the GPU's owner."""

    def covers(spec: TenantSpec) -> bool:
        return not spec.gpus or str(index) in spec.gpus or uuid in spec.gpus

    # A line naming the GPU wins over a line for every GPU, as in the limiter.
    named = sorted((s for s in table if s.name == team and covers(s)), key=lambda s: not s.gpus)
    if named:
        spec = named[0]
        rate = 1.0
        if spec.effective_policy() == "fixed-share" and spec.compute:
            rate = spec.compute / 100.0
        return Grant(GUARANTEED, rate)
    if owner == team:
        return Grant(SILO)
    if any(s.name == "*" and covers(s) for s in table):
        return Grant(BORROWED)
    return None


@dataclass
class Job:
    """One queued workload, followed from its queue to the GPU it ran on."""

    id: str  # "<origin node>/<workload>": unique in the fleet
    seq: int  # queue order
    team: str
    origin: str
    spec: WorkloadSpec
    work: float  # seconds of work at full speed (the spec's duration)
    done_work: float = 0.0
    state: str = QUEUED
    node: str = ""
    gpu: int = -1
    grant: str = ""
    rate: float = 1.0
    started: float | None = None
    ends: float | None = None
    finished: float | None = None
    runs: int = 0
    preempted: int = 0

    def progress(self, now: float, speed: float) -> float:
        """Work done by `now`, seconds at full speed."""
        if self.state != RUNNING or self.started is None:
            return self.done_work
        return min(self.work, self.done_work + max(now - self.started, 0.0) * speed * self.rate)


@dataclass
class _Node:
    name: str
    backend: SimBackend
    table_dir: Path
    table_key: tuple[int, int] | None = None
    table: list[TenantSpec] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.devices = [self.backend.device(i) for i in range(len(self.backend.spec.gpus))]
        self.owners = {d.owner for d in self.devices}


@dataclass(frozen=True)
class _Option:
    """A GPU a team may use, and how."""

    rank: tuple[int, int, int]
    node: _Node
    index: int
    grant: Grant

    @property
    def key(self) -> tuple[str, int]:
        return (self.node.name, self.index)


class Demand:
    """The fleet's batch scheduler; `tick()` does one round, `run()` ticks until cancelled."""

    def __init__(
        self,
        nodes: Sequence[tuple[str, SimBackend]],
        state_dir: Path,
        path: Path | None = None,
        speed: float = DEFAULT_SPEED,
    ) -> None:
        if not (math.isfinite(speed) and speed > 0):
            raise ValueError("queue speed must be a positive number")
        self.speed = float(speed)
        self.path = path
        self.nodes = [_Node(name, backend, state_dir / name / "limiter") for name, backend in nodes]
        self._by_name = {n.name: n for n in self.nodes}
        self.jobs: list[Job] = []
        self._written = 0.0
        self._dirty = True
        self._rescan = True  # a table changed or a GPU was freed: look for room again
        self._scanned = 0.0
        for node in self.nodes:
            teams = {user: team for team, users in node.backend.tenants().items() for user in users}
            for status in node.backend.workloads():
                if status.state != wl.PENDING or status.gpus or status.start is not None:
                    continue  # only work waiting for a GPU; scheduled starts belong to the spec
                spec = next(w for w in node.backend.spec.workloads if w.name == status.name)
                team = status.tenant or teams.get(status.user, "")
                if not team or spec.duration is None or spec.duration <= 0:
                    continue  # nobody to grant it to, or work without an end: not a batch job
                self.jobs.append(
                    Job(f"{node.name}/{spec.name}", len(self.jobs), team, node.name, spec, spec.duration)
                )

    # ---- one round ----------------------------------------------------------------------------

    def tick(self) -> None:
        now = self.nodes[0].backend.now() if self.nodes else time.time()
        for node in self.nodes:
            self._read_table(node)
        self._finish(now)
        self._place(now)
        if self.path is not None and (self._dirty or now - self._written >= WRITE_EVERY):
            self.write(now)

    def _read_table(self, node: _Node) -> None:
        path = node.table_dir / "tenants"
        try:
            st = path.stat()
            key: tuple[int, int] | None = (st.st_mtime_ns, st.st_size)
        except OSError:
            key = None
        if key == node.table_key:
            return
        node.table_key = key
        self._rescan = True
        try:
            node.table = read_table(node.table_dir)[1] if key is not None else []
        except LimiterError as exc:  # the limiter keeps its last good table; so does the scheduler
            log.warning("%s: %s (keeping the last good tenant table)", node.name, exc)

    def _finish(self, now: float) -> None:
        """Account for running jobs that ended, or whose GPU went away (back to the queue)."""
        for job in self.jobs:
            if job.state != RUNNING:
                continue
            backend = self._by_name[job.node].backend
            status = next((s for s in backend.workloads(at=now) if s.name == job.spec.name), None)
            if status is not None and status.state == wl.RUNNING:
                continue
            until = now
            if status is not None and status.state == wl.DONE and job.ends is not None:
                if status.stop is not None and status.stop >= job.ends - 1e-6:
                    job.done_work, job.state, job.finished = job.work, DONE, job.ends
                    self._release(job, keep_place=True)
                    continue
                until = min(now, status.stop) if status.stop is not None else now  # killed early
            # Killed (apply --force), blocked (GPU lost, MIG mode changed) or gone: the work done
            # so far is kept (a checkpoint) and the job waits again.
            job.done_work, job.state = job.progress(until, self.speed), QUEUED
            self._release(job)

    def _release(self, job: Job, keep_place: bool = False) -> None:
        """Take the job's workload off its node; a finished job keeps where it ran."""
        with contextlib.suppress(BackendError):
            self._by_name[job.node].backend.remove_workload(job.spec.name)
        if not keep_place:
            job.node, job.gpu, job.grant, job.started, job.ends = "", -1, "", None, None
        self._dirty = self._rescan = True

    def _place(self, now: float) -> None:
        waiting = sorted((j for j in self.jobs if j.state == QUEUED), key=lambda j: j.seq)
        if not waiting:
            return
        if not self._rescan and now - self._scanned < RESCAN_SECONDS:
            return  # nothing freed or granted since the last round found no room
        self._rescan, self._scanned = False, now
        taken = {(j.node, j.gpu): j for j in self.jobs if j.state == RUNNING}
        occupancy: dict[tuple[str, int], tuple[float, int, int]] = {}
        options: dict[str, list[_Option]] = {}
        for job in waiting:
            if job.team not in options:
                options[job.team] = self._options(job.team)
            chosen = next(
                (o for o in options[job.team] if o.key not in taken and self._fits(o, job, occupancy)), None
            )
            if chosen is None:
                chosen = self._preempt(job, options[job.team], taken, occupancy, now)
            if chosen is not None and self._start(job, chosen, now):
                taken[chosen.key] = job
                occupancy.pop(chosen.key, None)

    def _options(self, team: str) -> list[_Option]:
        """Every GPU the team may use, best first: guaranteed, silo, borrowed; node order; index."""
        out = []
        for n, node in enumerate(self.nodes):
            if not node.table and team not in node.owners:
                continue
            for index, device in enumerate(node.devices):
                grant = grant_on(node.table, index, device.uuid, device.owner, team)
                if grant is not None:
                    out.append(_Option((_RANK[grant.kind], n, index), node, index, grant))
        out.sort(key=lambda o: o.rank)
        return out

    def _preempt(
        self,
        job: Job,
        options: Sequence[_Option],
        taken: dict[tuple[str, int], Job],
        occupancy: dict[tuple[str, int], tuple[float, int, int]],
        now: float,
    ) -> _Option | None:
        """Online work that found no free GPU sends another team's borrower back to the queue."""
        for option in options:
            holder = taken.get(option.key)
            if holder is None or holder.grant != BORROWED or holder.team == job.team:
                continue
            if not option.grant.online:
                continue
            log.info("%s: %s preempted on %s:%d by %s", holder.team, holder.id, *option.key, job.id)
            holder.done_work, holder.state = holder.progress(now, self.speed), QUEUED
            holder.preempted += 1
            self._release(holder)
            del taken[option.key]
            occupancy.pop(option.key, None)
            return option if self._fits(option, job, occupancy) else None
        return None

    def _fits(self, option: _Option, job: Job, memo: dict[tuple[str, int], tuple[float, int, int]]) -> bool:
        device = option.node.devices[option.index]
        if device.mig_current or device.lost:
            return False
        if option.key not in memo:
            memo[option.key] = option.node.backend.occupancy(option.index)
        util, used, total = memo[option.key]  # what processes hold, of what the driver leaves
        need = job.spec.memory.on(device.hardware.memory_total_bytes, wl.MODELS[job.spec.kind].default_memory)
        need = max(need, device.context_bytes)  # the job's process holds its context at least
        return util < IDLE_BELOW and used + need <= total

    def _start(self, job: Job, option: _Option, now: float) -> bool:
        node, index, grant = option.node, option.index, option.grant
        left = max(job.work - job.done_work, 0.0)
        duration = left / (self.speed * grant.rate)
        if job.runs == 0:  # the first start takes it off the queue of the node it waited on
            with contextlib.suppress(BackendError):
                self._by_name[job.origin].backend.remove_workload(job.spec.name)
        spec = job.spec
        if node.table:  # on a node with a tenant table, work runs under the limiter, tagged
            spec = dataclasses.replace(spec, limiter=True, tenant=job.team)
        try:
            node.backend.adopt_workload(spec, index, max(duration, 1e-3), pace=self.speed, at=now)
        except BackendError as exc:
            log.warning("%s: cannot start %s on %s:%d: %s", job.team, job.id, node.name, index, exc.message)
            return False
        job.state, job.node, job.gpu, job.grant, job.rate = RUNNING, node.name, index, grant.kind, grant.rate
        job.started, job.ends, job.runs = now, now + duration, job.runs + 1
        self._dirty = True
        log.info("%s: %s started on %s:%d (%s)", job.team, job.id, node.name, index, grant.kind)
        return True

    # ---- what it says -------------------------------------------------------------------------

    def document(self, now: float) -> dict[str, Any]:
        teams: dict[str, dict[str, Any]] = {}
        jobs = []
        for job in sorted(self.jobs, key=lambda j: j.seq):
            done = job.progress(now, self.speed)
            team = teams.setdefault(
                job.team,
                {"queued": 0, "running": 0, "done": 0, "work_done_hours": 0.0, "work_left_hours": 0.0},
            )
            team[job.state] += 1
            team["work_done_hours"] += done / 3600.0
            team["work_left_hours"] += (job.work - done) / 3600.0
            jobs.append(
                {
                    "id": job.id,
                    "team": job.team,
                    "state": job.state,
                    "node": job.node or None,
                    "gpu": job.gpu if job.gpu >= 0 else None,
                    "grant": job.grant or None,
                    "work_hours": job.work / 3600.0,
                    "done_hours": done / 3600.0,
                    "started": job.started,
                    "ends": job.ends,
                    "finished": job.finished,
                    "runs": job.runs,
                    "preempted": job.preempted,
                }
            )
        return {"version": FILE_VERSION, "speed": self.speed, "updated": now, "teams": teams, "jobs": jobs}

    def write(self, now: float) -> None:
        if self.path is None:
            return
        text = json.dumps(self.document(now), indent=1) + "\n"
        try:
            atomic_write(self.path, text, 0o666, umask=True, durable=False)
        except OSError as exc:
            log.warning("cannot write %s: %s", self.path, exc)
        self._written, self._dirty = now, False

    async def run(self, interval: float = TICK_SECONDS) -> None:
        while True:
            try:
                self.tick()
            except Exception:  # the scheduler must never take the fleet down with it
                log.exception("simulated demand: a round failed")
            await asyncio.sleep(interval)


def read_demand(directory: Path) -> dict[str, Any] | None:
    """demand.json of a running (or stopped) sim fleet, or None when there is none."""
    try:
        data = json.loads((directory / "demand.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("version") == FILE_VERSION else None
