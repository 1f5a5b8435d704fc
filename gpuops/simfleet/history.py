"""History for simulated nodes: what `gpuops agent --record` keeps on a real node, for every node
of the sim fleet, and their past, so a fresh fleet already has days of evidence.

- **Live**: one asyncio task samples every node's backend in turn (staggered over the interval,
  10 s by default) and feeds each node's `Recorder` (gpuops/node/history.py), which writes into
  the node's state directory (`DIR/state/<node>/history`) where that node's agent reads it:
  when an hour ends, and when the agent is asked for history (`prepare`), rather than every
  minute as on a real node (the minutes stay in memory, compressed, until then).
- **The past** (backfill): the simulation's figures are a pure function of (seed, time), so a
  second `SimBackend` built from the node's spec with a clock under our control is evaluated
  every `step` (5 min; every `coarse_step`, 15 min, before the last day) from `days` (7) before
  the node's first live sample until that sample,
  integrated in memory (`Rollup`) and merged into the recorder's files. Work queued at the epoch
  (start "pending") is not running in the past, as the spec says. The live backend is never
  touched: MIG changes made by an apply count from when they were made.
  The model is evaluated in worker processes (`workers`, one per core up to 2): evaluating a
  100-node `large` fleet's week took 20 s of CPU in the fleet's one process, where the event
  loop that serves SSH also runs, so a first `gpuops tenants` waited for every node in turn
  (issue 22). Only merging the buckets into the recorder's files happens in the fleet process.
  Fleets of up to `background_nodes` nodes get their past from the start, as many nodes at a
  time as there are workers, so a node asked for later waits behind at most that many;
  bigger ones get a node's past when its history is first asked for, so
  `sim up --scenario large --nodes 1000` does not spend both cores on pasts nobody asked for.
  256 covers the 200-node fleet of issue 18: its pasts are built within seconds of `sim up`
  (docs/benchmarks.md, "Simulated history"), which a fleet built on demand spread over every
  node's first call.
  Without worker processes the evaluation runs in a thread of the fleet process, one node at a
  time, which the interpreter interleaves with the event loop: for fleets of up to
  `thread_nodes` (16) nodes, the `silos` and `mixed` fleets the tests start by the dozen, whose
  pasts cost less than starting the workers does (8 `silos` nodes: 0.35 s of CPU in all,
  against ~0.5 s per spawn worker, mostly re-importing gpuops; docs/benchmarks.md, "Launching
  a small fleet"); with `workers=0`; and when the workers cannot start.

Every start begins a new simulated past (the epoch is the start time): files of an earlier run
are removed when the fleet starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import math
import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

from gpuops.core.atomic_file import atomic_write
from gpuops.core.history import MINUTE, Bucket
from gpuops.core.model import NodeSample
from gpuops.node.backends.base import Backend, BackendError, BackendUnavailable
from gpuops.node.backends.sim import SimBackend
from gpuops.node.history.files import KEEP_MINUTES
from gpuops.node.history.recorder import DEFAULT_INTERVAL, Recorder
from gpuops.node.history.rollup import Packed, Rollup
from gpuops.node.sim_past import past_rollup

log = logging.getLogger("gpuops.simfleet")

HISTORY_DIR = "history"  # under each node's state directory, as the agent's default
BACKFILL_DAYS = 7.0
BACKFILL_STEP = 300.0  # seconds between the past samples of the last day
BACKFILL_COARSE_STEP = 900.0  # ... and of the days before
PASTS_FILE = "pasts.json"  # in the state directory: {"nodes", "built", "days", "background"}
BACKGROUND_NODES = 256  # fleets up to this size get their past from the start
MAX_WORKERS = 2  # worker processes evaluating pasts (at most one per core)
THREAD_NODES = 16  # fleets up to this size evaluate their pasts in a thread, not in workers
_OUR_FILES = ("minutes.json",)


class _PastBackend(SimBackend):
    """The node's model evaluated at past times. History records neither power nor temperature,
    so they are not evaluated (the temperature's ten minutes of load history are most of the
    cost of a sample at a random time); every figure history records is the simulator's."""

    def _past_power(self, device: Any, t: float) -> float:
        return 0.0

    def _power(self, device: Any, t: float, load: float, holding: bool) -> float:
        return 0.0

    def _temperature(self, device: Any, t: float, power: float, past: float) -> float:
        return 0.0


class _Node:
    __slots__ = ("backend", "directory", "name", "past", "recorder", "spec")

    def __init__(self, name: str, backend: Backend, spec: Any, directory: Path, recorder: Recorder) -> None:
        self.name = name
        self.backend = backend
        self.spec = spec
        self.directory = directory
        self.recorder = recorder
        self.past: asyncio.Task[float] | None = None


def clear_history(directory: Path) -> None:
    """Remove the history files of an earlier run (and nothing else)."""
    if not directory.is_dir():
        return
    for path in directory.iterdir():
        name = path.name
        base = name.removesuffix(".corrupt")
        if (
            base in _OUR_FILES
            or (base.startswith("hours-") and base.endswith(".json"))
            or name.endswith(".tmp")
        ):
            with contextlib.suppress(OSError):
                path.unlink()


class SimHistory:
    """Records every simulated node's history, and fills in each node's past.

    `nodes`: (name, live backend, sim spec) per node (a spec of None: no past). `state_dir`:
    the fleet's state directory (one subdirectory per node). `workers`: worker processes for the
    pasts (default: none for up to `thread_nodes` pasts, else one per core up to MAX_WORKERS; 0:
    a thread). Start `run()` as a task; `close()` stops."""

    def __init__(
        self,
        nodes: Sequence[tuple[str, Backend, Any]],
        state_dir: Path,
        interval: float = DEFAULT_INTERVAL,
        days: float = BACKFILL_DAYS,
        step: float = BACKFILL_STEP,
        coarse_step: float = BACKFILL_COARSE_STEP,
        background_nodes: int = BACKGROUND_NODES,
        keep_minutes: int = KEEP_MINUTES,
        clock: Callable[[], float] = time.time,
        durable: bool = False,
        workers: int | None = None,
        thread_nodes: int = THREAD_NODES,
    ) -> None:
        self.interval = float(interval)
        self.days = float(days)
        self.step = float(step)
        self.coarse_step = float(coarse_step)
        self.background = len(nodes) <= background_nodes
        self.clock = clock
        self.keep_minutes = keep_minutes
        self.nodes: dict[str, _Node] = {}
        for name, backend, spec in nodes:
            directory = state_dir / name / HISTORY_DIR
            clear_history(directory)
            recorder = Recorder(
                str(directory),
                interval=self.interval,
                # Written when an hour ends and when the node's history is asked for (`prepare`),
                # not every minute: a thousand nodes' minute files would be ~400 MB of writes
                # a minute for nobody. Nothing here needs to survive a crash.
                flush_every=math.inf,
                clock=clock,
                durable=durable,
                keep_minutes=keep_minutes,
                lock=False,  # the fleet's own lock keeps a second server out of DIR
            )
            self.nodes[name] = _Node(name, backend, spec, directory, recorder)
        self.samples = 0
        self.backfill_seconds = 0.0  # wall time from asking for a past until it was merged
        self.backfilled = 0
        self._closed = False
        self.progress_path = state_dir / PASTS_FILE
        self._pasts = sum(1 for _name, _backend, spec in nodes if spec is not None)
        self._write_progress()
        if workers is None:  # a small fleet's pasts cost less than starting the workers
            workers = 0 if self._pasts <= thread_nodes else min(MAX_WORKERS, os.cpu_count() or 1)
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None

    def history_dir(self, name: str) -> str:
        return str(self.nodes[name].directory)

    # ---- live ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Sample the nodes in turn forever (each once per interval); pasts in the background
        for a small fleet."""
        background = asyncio.ensure_future(self._background()) if self.background else None
        try:
            await self._record()
        finally:
            if background is not None:
                background.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await background

    async def _record(self) -> None:
        nodes = list(self.nodes.values())
        if not nodes:
            return
        loop = asyncio.get_running_loop()
        spacing = self.interval / len(nodes)
        tick = max(spacing, 0.05)  # wake at most 20 times a second, sampling what is due
        began = loop.time()
        done = 0
        while not self._closed:
            due = int((loop.time() - began) / spacing) + 1
            if due - done > len(nodes):  # fell behind by a whole round: skip it, do not burst
                done = due - len(nodes)
            while done < due:
                self._sample(nodes[done % len(nodes)])
                done += 1
            await asyncio.sleep(max(0.0, began + done * spacing - loop.time(), tick - spacing))

    def _sample(self, node: _Node) -> None:
        try:
            sample = node.backend.sample()
        except BackendError:  # a closed or failing backend: nothing to record this time
            return
        try:
            node.recorder.add(sample)
            self.samples += 1
        except Exception:  # one node's trouble must not stop the others' history
            log.exception("%s: recording history failed", node.name)

    # ---- the past ------------------------------------------------------------------------------

    async def _background(self) -> None:
        # As many pasts under way as there are workers: a node asked for meanwhile is queued
        # behind those only, not behind the whole fleet.
        slots = asyncio.Semaphore(max(1, self.workers))

        async def one(name: str) -> None:
            async with slots:
                await self.ensure_past(name)

        began = time.monotonic()
        await asyncio.gather(*(one(name) for name in list(self.nodes)))
        log.info("simulated pasts of %d nodes built in %.1fs", self.backfilled, time.monotonic() - began)

    async def prepare(self, name: str) -> None:
        """Before a node's agent reads its history: its past is there, what was recorded is
        written."""
        await self.ensure_past(name)
        node = self.nodes.get(name)
        if node is not None:
            node.recorder.flush()

    async def ensure_past(self, name: str) -> None:
        """Fill in this node's past, once; waits for it when it is under way."""
        node = self.nodes.get(name)
        if node is None or node.spec is None:
            return
        if node.past is None:
            node.past = asyncio.ensure_future(self._backfill(node))
        with contextlib.suppress(Exception):
            await asyncio.shield(node.past)

    async def _backfill(self, node: _Node) -> float:
        """Evaluate the node's model from `days` before its first live sample up to it (in a
        worker process), merge it into the node's recorder; returns the seconds it took."""
        began = time.monotonic()
        if node.recorder.first is None:  # not sampled live yet: that first sample is now
            self._sample(node)
        end = node.recorder.first
        if end is None:
            return 0.0
        minutes_after = self.clock() - self.keep_minutes * MINUTE
        args = (node.spec, end, self.days, self.step, self.coarse_step, minutes_after)
        try:
            buckets = await self._evaluate(args)
        except BackendUnavailable as exc:
            log.warning("%s: no simulated past: %s", node.name, exc)
            return 0.0
        node.recorder.merge(buckets)
        took = time.monotonic() - began
        self.backfill_seconds += took
        self.backfilled += 1
        self._write_progress()
        log.debug("%s: %d days of simulated history in %.2fs", node.name, self.days, took)
        return took

    def _write_progress(self) -> None:
        """How many pasts are built, for `gpuops sim status` (a first `tenants --window 7d`
        waits for the pasts of the nodes it asks)."""
        doc = {
            "nodes": self._pasts,
            "built": self.backfilled,
            "days": self.days,
            "background": self.background,
        }
        with contextlib.suppress(OSError):
            atomic_write(self.progress_path, json.dumps(doc) + "\n", 0o644, durable=False)

    async def _evaluate(self, args: tuple[Any, ...]) -> list[Packed]:
        """`past_packed(*args)` in a worker process, or in a thread when there is none."""
        loop = asyncio.get_running_loop()
        if self.workers > 0 and not self._closed:
            try:
                if self._pool is None:
                    self._pool = ProcessPoolExecutor(
                        self.workers,
                        # spawn: the fleet process has threads (the backends' locks, asyncssh)
                        # that a forked child would inherit mid-state.
                        mp_context=multiprocessing.get_context("spawn"),
                        initializer=_worker_init,
                    )
                buckets: list[Packed] = await loop.run_in_executor(self._pool, past_packed, *args)
                return buckets
            except (BrokenProcessPool, OSError) as exc:
                log.warning("simulated pasts: worker processes failed (%s); evaluating here", exc)
                self.workers = 0
        return await asyncio.to_thread(past_packed, *args)

    def close(self) -> None:
        """Stop recording. What is not written is dropped: the next start of the fleet begins a
        new past anyway (and writing a thousand nodes' minutes would outlast `sim down`)."""
        self._closed = True
        for node in self.nodes.values():
            if node.past is not None and not node.past.done():
                node.past.cancel()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


def past_buckets(
    spec: Any,
    end: float,
    days: float,
    step: float,
    coarse_step: float,
    minutes_after: float,
    sampled: bool = False,
) -> list[Bucket]:
    """The buckets a recorder would hold from the node's model sampled at `past_times` up to
    `end` (the live recorder's first sample, whose stretch is counted here; the live recorder
    counts from it). Raises BackendUnavailable for a spec the simulator cannot run.

    The buckets are computed from the model without building its samples (`past_rollup`,
    node/sim_past.py); `sampled=True` builds every sample and adds it to a `Rollup` instead (the
    reference the tests compare it with: the same buckets)."""
    return _past(spec, end, days, step, coarse_step, minutes_after, sampled).buckets()


def past_packed(
    spec: Any, end: float, days: float, step: float, coarse_step: float, minutes_after: float
) -> list[Packed]:
    """`past_buckets` as the recorder keeps them (compressed JSON text): what a worker process
    sends back, for the fleet process to merge without encoding a bucket."""
    return _past(spec, end, days, step, coarse_step, minutes_after, False).packed()


def _past(
    spec: Any, end: float, days: float, step: float, coarse_step: float, minutes_after: float, sampled: bool
) -> Rollup:
    clock = _Clock(end)
    past = _PastBackend(spec=spec, clock=clock)
    interval = max(step, coarse_step)
    times = past_times(end, days, step, coarse_step)
    try:
        if not sampled:
            return past_rollup(past, times, interval, minutes_after)
        rollup = Rollup(interval, minutes_after=minutes_after)
        for t in times:
            clock.t = t
            try:
                sample: NodeSample = past.sample()
            except BackendError:
                continue
            rollup.add(sample)
    finally:
        past.close()
    return rollup


def _worker_init() -> None:
    """In a worker: end with the fleet process (PR_SET_PDEATHSIG), and leave Ctrl-C to it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)


def past_times(end: float, days: float, step: float, coarse_step: float) -> list[float]:
    """When to evaluate the past: every `coarse_step` from one step before the hour `days`
    before `end`, every `step` in the last day, and `end` itself (the last, exactly)."""
    first = math.floor((end - days * 86400.0) / 3600.0) * 3600.0 - coarse_step
    fine_from = max(first, math.floor((end - 86400.0) / coarse_step) * coarse_step)
    times = []
    t = first
    while t < fine_from:
        times.append(t)
        t += coarse_step
    t = fine_from
    while t < end:
        times.append(t)
        t += step
    times.append(end)
    return times


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
