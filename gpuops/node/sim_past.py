"""A simulated node's past as history keeps it, without building its samples.

History (gpuops/core/history.py) keeps per GPU and sample only what `gpu_shares` makes of it:
how busy the GPU is, the memory it uses and each key's share, integrated over time into hour
and minute buckets (`Rollup`, node/history/rollup.py). The sim fleet gives every node a week of
past (gpuops/simfleet/history.py): about 870 evaluations of every GPU. Building a whole
`NodeSample` for each (processes, MIG instance samples, clocks), reading it back through
`gpu_shares` and adding it to the buckets through objects made for one sample at a time was
most of what a 100-node sim fleet spent before its first `gpuops tenants` (issue 22).

`past_rollup(backend, times, ...)` gives the `Rollup` that `rollup.add(backend.sample())` at
each time would give, the same floats from the same operations in the same order: per GPU,
time after time, the workloads' activities, the memory each process holds (as
`SimBackend._allocate`), the GPU's or its MIG instances' utilization (as `_load` and
`_instance_utilization`, rounded as a sample reports it) and each key's share (as
`gpu_shares`), added into the buckets' accumulators as `_BucketAcc.add` adds them. What stays
fixed while the same processes run on a GPU (their keys, the order memory is handed out, MIG
instance fractions) is worked out once per GPU and set of processes.

The backend's state (MIG layouts, workload bindings and schedules) must not change meanwhile:
the sim fleet's past is evaluated on a backend of its own. GPUs this does not cover are sampled
and read through `gpu_shares` as before: a GPU whose spec marks figures unsupported, every GPU
of a node where a GPU is or gets lost, a GPU with more keys than a bucket keeps apart. A test
compares both ways on every node shape of the simulated fleets (tests/node/test_sim_past.py).
"""

from __future__ import annotations

import math
from typing import Dict, List, Optional, Sequence, Tuple

from gpuops.core.history import HOUR, MAX_KEYS, MINUTE, Key, gpu_shares, instance_fraction
from gpuops.core.model import Gpu, GpuInfo
from gpuops.node.backends.sim import SimBackend, _Workload
from gpuops.node.history.rollup import Rollup, _BucketAcc, _dt, _GpuAcc, _KeyAcc, _pieces
from gpuops.node.sim import workloads as wl
from gpuops.node.sim.device import SimDevice

_MIB = 1024 * 1024

# One key's part of one sample: (key, weight, busy, memory, process_max, processes), KeyShare's
# fields; one GPU's sample: (busy, memory used, key parts), GpuShare's.
_KeyPart = Tuple[Key, float, float, int, int, int]
_Figures = Tuple[float, int, List[_KeyPart]]
# When a sample counts and for how long in which buckets (Rollup.add's pieces).
_Schedule = List[Tuple[float, List[Tuple[_BucketAcc, float]]]]


def past_rollup(
    backend: SimBackend,
    times: Sequence[float],
    interval: float,
    minutes_after: float,
    max_keys: int = MAX_KEYS,
) -> Rollup:
    """`Rollup(interval, minutes_after, max_keys)` after `add(backend.sample())` at each of
    `times` (ascending), the backend's clock set to each."""
    rollup = Rollup(interval, minutes_after=minutes_after, max_keys=max_keys)
    schedule: _Schedule = []
    last: Optional[float] = None
    for time in times:
        t = float(time)
        dt = _dt(last, t, rollup.interval)
        last = t
        if dt <= 0:
            continue
        pieces = []
        for span, accs in ((HOUR, rollup._hours), (MINUTE, rollup._minutes)):
            for start, seconds in _pieces(t - dt, t, span):
                if span == MINUTE and start + MINUTE <= rollup.minutes_after:
                    continue
                acc = accs.get(start)
                if acc is None:
                    acc = accs[start] = _BucketAcc(start, span)
                pieces.append((acc, seconds))
        schedule.append((t, pieces))
    rollup._last = last
    _Past(backend, rollup.max_keys).count(schedule)
    return rollup


class _Group:
    """The processes of one device (a whole GPU, or one MIG GPU instance) sharing it: each key
    with its processes' positions in the GPU's process list, in the order `_key_shares`
    (core/history.py) meets them."""

    __slots__ = ("keys", "scale")

    def __init__(self, keys: List[Tuple[Key, List[int]]], scale: float) -> None:
        self.keys = keys
        self.scale = scale

    def parts(self, memory: Sequence[int], util: Optional[float], out: List[_KeyPart]) -> None:
        """`_key_shares(processes, memories, scale, util)`."""
        held = []
        for key, positions in self.keys:
            first = memory[positions[0]]
            key_memory, top = first, first
            for k in positions[1:]:
                m = memory[k]
                key_memory += m
                top = max(top, m)
            held.append((key, key_memory, top, len(positions)))
        total = sum(h[1] for h in held)
        count = len(held)
        scale = self.scale
        for key, key_memory, process_max, processes in held:
            weight = scale * (key_memory / total if total > 0 else 1.0 / count)
            busy = weight if util is None else weight * util
            out.append((key, weight, busy, key_memory, process_max, processes))


class _Instance:
    """A MIG GPU instance with processes: its fraction of the GPU, its processes, and what its
    GPM utilization is made of (`whole` None where NVML gives none: Ampere)."""

    __slots__ = ("fraction", "group", "parts", "whole")

    def __init__(
        self, fraction: float, group: _Group, whole: Optional[float], parts: List[Tuple[int, float]]
    ) -> None:
        self.fraction = fraction
        self.group = group
        self.whole = whole  # the instance's compute share of the GPU
        self.parts = parts  # (position, its compute instance's share of the GPU) per process


class _Plan:
    """What stays the same on one GPU while the same processes run on it."""

    __slots__ = ("alone", "instances", "order", "runs", "targets", "whole")

    def __init__(self, device: SimDevice, gpu: Gpu, runs: List[Tuple[_Workload, int]]) -> None:
        self.runs = runs
        mig = device.mig_current
        # The order memory is handed out (earliest first) and what each target has, as
        # SimBackend._allocate.
        self.order = sorted(range(len(runs)), key=lambda i: (runs[i][0].start or 0.0, runs[i][0].name))
        targets: Dict[Optional[int], int] = {}
        for w, _i in runs:
            target = w.gpu_instance_id if mig else None
            if target not in targets:
                targets[target] = (
                    device.gpu_instance_memory_bytes(target)
                    if target is not None
                    else device.hardware.memory_total_bytes
                )
        self.targets = targets
        keys = [_key(w, mig) for w, _i in runs]
        self.whole: Optional[_Group] = None
        self.instances: List[_Instance] = []
        # (footprint, memory of the GPU, key) of a lone process on a whole GPU.
        self.alone: Optional[Tuple[int, int, Key]] = None
        if not mig:
            self.whole = _Group(_grouped(keys, range(len(runs))), 1.0)
            if len(runs) == 1:
                w, i = runs[0]
                self.alone = (w.footprints[i], targets[None], keys[0])
            return
        gpm = not (device.hardware.architecture == "ampere" or "utilization_gpu" in device.unsupported)
        assert gpu.mig is not None
        for gi in gpu.mig.gpu_instances:  # gpu_shares' order
            positions = [k for k, (w, _i) in enumerate(runs) if w.gpu_instance_id == gi.id]
            if not positions:
                continue
            fraction = instance_fraction(gpu, gi)
            parts = [
                (k, device.gpu_instance_compute_share(gi.id, w.compute_instance_id))
                for k, (w, _i) in enumerate(runs)
                if (w.gpu_instance_id or 0) == gi.id
            ]
            whole = device.gpu_instance_compute_share(gi.id) if gpm else None
            self.instances.append(
                _Instance(fraction, _Group(_grouped(keys, positions), fraction), whole, parts)
            )


def _key(w: _Workload, mig: bool) -> Key:
    """key_of() of the process SimBackend._process makes of this workload."""
    spec = w.spec
    on_mig = mig and w.gpu_instance_id is not None
    return (
        spec.user,
        spec.groups,
        spec.tenant if spec.limiter else None,
        "limiter" if spec.limiter and spec.tenant else "",
        w.gpu_instance_id if on_mig else None,
    )


def _grouped(keys: Sequence[Key], positions: Sequence[int]) -> List[Tuple[Key, List[int]]]:
    out: Dict[Key, List[int]] = {}
    for k in positions:
        out.setdefault(keys[k], []).append(k)
    return list(out.items())


def _gpu_acc(bucket: _BucketAcc, info: GpuInfo, total: object, owner: Optional[str], mig: bool) -> _GpuAcc:
    """The GPU's accumulator in a bucket, with what _BucketAcc.add sets at every sample (from
    the same GPU: the same each time)."""
    acc = bucket._gpu(info.index, info.uuid, info.name)
    if isinstance(total, int) and not isinstance(total, bool) and total > 0:
        acc.memory_total = total
    acc.owner = owner
    acc.mig = acc.mig or mig
    return acc


class _Past:
    def __init__(self, backend: SimBackend, max_keys: int) -> None:
        self.backend = backend
        self.max_keys = max_keys
        backend._refresh()

    def count(self, schedule: _Schedule) -> None:
        backend = self.backend
        devices = backend._devices
        # Lost GPUs (now or later) block workloads spanning them and change the GPU's info:
        # such nodes are sampled.
        lost = any(d.lost for d in devices) or any(g.lost_at is not None for g in backend.spec.gpus)
        for device in devices:
            gpu = Gpu(info=device.info(), mig=device.mig_state(), owner=device.owner)
            # The workloads that can run here (a workload bound to a MIG instance that is not
            # there, or to a whole GPU in MIG mode, is blocked throughout).
            runnable = [
                (w, i)
                for w, i in backend._on_gpu[device.index]
                if w.start is not None and backend._state(w, w.start) in (wl.RUNNING, wl.DONE)
            ]
            keys = {_key(w, device.mig_current) for w, _i in runnable}
            if lost or device.unsupported or len(keys) > self.max_keys - 1:
                self._sampled(device, schedule)
            else:
                self._computed(device, gpu, runnable, schedule)

    def _sampled(self, device: SimDevice, schedule: _Schedule) -> None:
        """As Rollup.add does it, from this GPU's samples."""
        for t, pieces in schedule:
            gpu = self.backend._sample_gpu(device, t)
            shares = [(gpu, gpu_shares(gpu))]
            for acc, seconds in pieces:
                acc.add(shares, seconds, self.max_keys)

    def _computed(
        self, device: SimDevice, gpu: Gpu, runnable: List[Tuple[_Workload, int]], schedule: _Schedule
    ) -> None:
        info = gpu.info
        total = info.memory_total_bytes
        mig = device.mig_current
        plans: Dict[Tuple[int, ...], _Plan] = {}
        accs: Dict[_BucketAcc, _GpuAcc] = {}
        times = [t for t, _pieces in schedule]
        spans = [(w.start if w.start is not None else math.inf, w.stop) for w, _i in runnable]
        same: Dict[Tuple[int, ...], Tuple[int, ...]] = {}
        running = []
        for t in times:
            ks = tuple(
                [k for k, (start, stop) in enumerate(spans) if t >= start and (stop is None or t < stop)]
            )
            running.append(same.setdefault(ks, ks))
        # Each workload's (utilization, memory fraction) at the times it runs, by time.
        activity: List[List[Tuple[float, float]]] = []
        backend = self.backend
        for k, (w, _i) in enumerate(runnable):
            at = [n for n, ks in enumerate(running) if k in ks]
            start = w.start or 0.0
            values = w.model.series(
                backend.seed,
                (w.name, device.index),
                [times[n] for n in at],
                [(times[n] - start) * w.pace for n in at],
                backend.spec.utc_offset,
                w.spec.params,
            )
            by_time: List[Tuple[float, float]] = [(0.0, 0.0)] * len(times)
            for n, value in zip(at, values):
                by_time[n] = value
            activity.append(by_time)
        # A GPU's figures repeat whenever its processes do the same (idle kernels, notebooks
        # between bursts): worked out once.
        known: Dict[Tuple[Tuple[int, ...], Tuple[Tuple[float, float], ...]], _Figures] = {}
        owner = gpu.owner
        for n, (_t, pieces) in enumerate(schedule):
            ks = running[n]
            if not ks:  # nothing running: busy and memory add 0
                for bucket, seconds in pieces:
                    acc = accs.get(bucket)
                    if acc is None:
                        acc = accs[bucket] = _gpu_acc(bucket, info, total, owner, mig)
                    acc.seconds += seconds
                continue
            plan = plans.get(ks)
            if plan is None:
                plan = plans[ks] = _Plan(device, gpu, [runnable[k] for k in ks])
            if plan.alone is not None:
                # One process on a whole GPU (most busy GPUs): _figures' steps for it.
                footprint, room, key = plan.alone
                util_percent, memory_fraction = activity[ks[0]][n]
                want = int(footprint * max(0.0, min(1.0, memory_fraction)))
                want -= want % _MIB
                memory = min(want, room)
                util = round(min((0.0 + util_percent) / 100.0, 1.0) * 100.0, 1)
                busy = min(1.0, max(0.0, util / 100.0))
                weight = 1.0 * (memory / memory if memory > 0 else 1.0 / 1)
                parts = [(key, weight, weight * busy, memory, memory, 1)]
            else:
                acts = tuple([activity[k][n] for k in ks])
                figures = known.get((ks, acts))
                if figures is None:
                    figures = known[(ks, acts)] = self._figures(device, plan, acts)
                busy, memory, parts = figures
            for bucket, seconds in pieces:
                acc = accs.get(bucket)
                if acc is None:
                    acc = accs[bucket] = _gpu_acc(bucket, info, total, owner, mig)
                acc.seconds += seconds
                acc.busy += busy * seconds
                acc.memory += memory * seconds
                if memory > acc.memory_max:
                    acc.memory_max = memory
                keys = acc.keys
                for key, weight, key_busy, key_memory, process_max, processes in parts:
                    ka = keys.get(key)
                    if ka is None:
                        ka = keys[key] = _KeyAcc()
                    ka.seconds += seconds
                    ka.held += weight * seconds
                    ka.busy += key_busy * seconds
                    ka.memory += key_memory * seconds
                    if key_memory > ka.memory_max:
                        ka.memory_max = key_memory
                    if process_max > ka.process_max:
                        ka.process_max = process_max
                    if processes > ka.processes:
                        ka.processes = processes

    def _figures(self, device: SimDevice, plan: _Plan, acts: Sequence[Tuple[float, float]]) -> _Figures:
        """gpu_shares of the GPU's sample at a time its processes' activities are `acts`
        ((utilization, memory fraction) each)."""
        runs = plan.runs
        # Memory each process holds (SimBackend._allocate).
        free = dict(plan.targets)
        memory = [0] * len(runs)
        mig = device.mig_current
        for k in plan.order:
            w, i = runs[k]
            target = w.gpu_instance_id if mig else None
            want = int(w.footprints[i] * wl.clamp(acts[k][1], 0.0, 1.0))
            want -= want % _MIB
            got = min(want, free[target])
            free[target] -= got
            memory[k] = got
        used = sum(memory)
        parts: List[_KeyPart] = []
        whole = plan.whole
        if whole is not None:
            # SimBackend._load, then the sample's rounded utilization as gpu_shares reads it.
            sm = min(sum(a[0] for a in acts) / 100.0, 1.0)
            util = round(sm * 100.0, 1)
            fraction = min(1.0, max(0.0, util / 100.0))
            whole.parts(memory, fraction, parts)
            return fraction, used, parts
        busy = 0.0
        for instance in plan.instances:
            gi_fraction: Optional[float] = None
            if instance.whole is not None:  # SimBackend._instance_utilization
                if instance.whole <= 0:
                    gi_util = 0.0
                else:
                    gi_busy = sum(acts[k][0] * share for k, share in instance.parts)
                    gi_util = round(min(gi_busy / instance.whole, 100.0), 1)
                gi_fraction = min(1.0, max(0.0, gi_util / 100.0))
            fraction = instance.fraction
            busy += fraction if gi_fraction is None else fraction * gi_fraction
            instance.group.parts(memory, gi_fraction, parts)
        return min(1.0, busy), used, parts
