"""Workload models of the simulator: how busy a process keeps its GPU at a given moment.

Each model is a pure function of (seed, workload key, simulated time): no global random
generator, no state. Noise comes from a hash of the seed, the workload and a time bucket, so
two simulators with the same seed report the same figures at the same times.

The models follow what GPU fleets look like in public traces: most cards idle or hold memory
for a stale notebook at 0% utilization, online inference follows the working day, offline
training saturates its cards for days, notebooks are idle with short bursts.

A new kind is one more `WorkloadModel` subclass added to `MODELS`; the spec loader validates
its parameters from the class's `params` table.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

DAY = 86400.0
HOUR = 3600.0


def noise(seed: int, *key: object) -> float:
    """A uniform number in [0, 1) from a hash of the seed and the key; the same key, the same number."""
    text = "\x1f".join(map(str, (seed, *key)))
    digest = hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 18446744073709551616.0


# Hashers that have hashed the text of (seed, *key) and the separator: `noise` of that key at a
# time bucket is a copy of one of these fed the bucket's digits, the same hash of the same text
# (a third of the cost of hashing it whole: most of a sample is noise). Bounded: emptied when full.
_HASHERS: Dict[Tuple[int, Tuple[object, ...]], Any] = {}
_MAX_HASHERS = 1 << 16


def _noise_at(seed: int, key: Tuple[object, ...], bucket: object) -> float:
    """`noise(seed, *key, bucket)`."""
    base = _HASHERS.get((seed, key))
    if base is None:
        if len(_HASHERS) >= _MAX_HASHERS:
            _HASHERS.clear()
        text = "\x1f".join(map(str, (seed, *key))) + "\x1f"
        base = _HASHERS[(seed, key)] = hashlib.blake2b(text.encode("utf-8"), digest_size=8)
    h = base.copy()
    h.update(str(bucket).encode("utf-8"))
    return int.from_bytes(h.digest(), "big") / 18446744073709551616.0


def _hasher(seed: int, key: Tuple[object, ...]) -> Any:
    base = _HASHERS.get((seed, key))
    if base is None:
        _noise_at(seed, key, 0)
        base = _HASHERS[(seed, key)]
    return base


def _smooth_at(base: Any, t: float, period: float) -> float:
    """`smooth_noise(seed, key, t, period)` from `_hasher(seed, key)`."""
    x = t / period
    bucket = math.floor(x)
    frac = x - bucket
    frac = frac * frac * (3.0 - 2.0 * frac)
    h = base.copy()
    h.update(str(bucket).encode("utf-8"))
    a = int.from_bytes(h.digest(), "big") / 18446744073709551616.0
    h = base.copy()
    h.update(str(bucket + 1).encode("utf-8"))
    b = int.from_bytes(h.digest(), "big") / 18446744073709551616.0
    return a + (b - a) * frac


def _bucket_at(base: Any, bucket: int) -> float:
    h = base.copy()
    h.update(str(bucket).encode("utf-8"))
    return int.from_bytes(h.digest(), "big") / 18446744073709551616.0


# A noise memo (`Moment.memo`; the backend keeps one) only saves hashing: it holds what `noise`
# gives for each key at the last bucket asked for, which is what a sampler walking forward in time
# asks for again. Its values are the pure function's, so results never depend on what was asked
# before. Its keys are the noise keys without the time, so it stays as small as the set of keys.
# Keys that compare equal must print alike (do not mix 1, 1.0 and True).
NoiseMemo = Dict[Tuple[object, ...], Tuple[int, float, float]]


def smooth_noise(
    seed: int, key: Tuple[object, ...], t: float, period: float, memo: Optional[NoiseMemo] = None
) -> float:
    """Value noise in [0, 1): hashed values at each `period` bucket, eased between buckets."""
    x = t / period
    bucket = math.floor(x)
    frac = x - bucket
    frac = frac * frac * (3.0 - 2.0 * frac)
    if memo is None:
        a = _noise_at(seed, key, bucket)
        b = _noise_at(seed, key, bucket + 1)
        return a + (b - a) * frac
    slot = (seed, key, period)
    last = memo.get(slot)
    if last is not None and last[0] == bucket:
        a, b = last[1], last[2]
    else:
        a = last[2] if last is not None and last[0] == bucket - 1 else _noise_at(seed, key, bucket)
        b = _noise_at(seed, key, bucket + 1)
        memo[slot] = (bucket, a, b)
    return a + (b - a) * frac


def bucket_noise(seed: int, key: Tuple[object, ...], bucket: int, memo: Optional[NoiseMemo] = None) -> float:
    """`noise(seed, *key, bucket)`, through the memo when there is one."""
    if memo is None:
        return _noise_at(seed, key, bucket)
    slot = (seed, key)
    last = memo.get(slot)
    if last is not None and last[0] == bucket:
        return last[1]
    value = _noise_at(seed, key, bucket)
    memo[slot] = (bucket, value, value)
    return value


def clamp(value: float, low: float, high: float) -> float:
    return max(low, min(high, value))


def local_hour(t: float, utc_offset: float) -> float:
    """Hour of the day (0 <= h < 24) at simulated time t for a site `utc_offset` seconds east of UTC."""
    return ((t + utc_offset) % DAY) / HOUR


def is_weekend(t: float, utc_offset: float) -> bool:
    """1970-01-01 was a Thursday; Saturday and Sunday count as weekend."""
    day = math.floor((t + utc_offset) / DAY)
    return (day + 3) % 7 >= 5


@dataclass(frozen=True)
class Param:
    """One tunable of a workload model. `unit` says how the spec writes it:
    "percent" (0-100, "30%" or 30), "duration" ("30m", seconds), "hour" (0-24), "fraction" (0-1)."""

    name: str
    unit: str
    default: float
    help: str


@dataclass(frozen=True)
class Moment:
    """Where a workload is at one instant."""

    seed: int
    key: Tuple[object, ...]  # identifies the workload (and GPU) for noise
    t: float  # simulated time, seconds since the epoch
    running_for: float  # seconds since the workload started
    utc_offset: float  # site's offset east of UTC, seconds
    memo: Optional[NoiseMemo] = field(default=None, compare=False, repr=False)  # saves hashing only


@dataclass(frozen=True)
class Activity:
    """What a process does to its GPU (or MIG instance) at one instant."""

    utilization_percent: float  # share of the SMs it keeps busy, 0-100
    memory_fraction: float  # share of its memory footprint held now, 0-1
    memory_utilization_percent: float  # memory-bandwidth utilization, 0-100


class WorkloadModel:
    """Base of the workload models; subclasses set the class attributes and `activity`."""

    kind = "abstract"
    description = ""
    default_command = "python"
    default_memory = 0.2  # share of the target's memory held when the spec gives no size
    params: Tuple[Param, ...] = ()

    def defaults(self) -> Dict[str, float]:
        return {p.name: p.default for p in self.params}

    def activity(self, moment: Moment, params: Mapping[str, float]) -> Activity:
        raise NotImplementedError

    def series(
        self,
        seed: int,
        key: Tuple[object, ...],
        times: Sequence[float],
        running_for: Sequence[float],
        utc_offset: float,
        params: Mapping[str, float],
    ) -> List[Tuple[float, float]]:
        """(utilization_percent, memory_fraction) of `activity` at each of `times` (the
        workload `running_for` seconds at each): the simulator's past asks for hundreds at
        once. A model may compute them without a Moment per time (the built-in ones do, with
        the same operations as `activity`: tests/node/test_sim_past.py compares them)."""
        memo: NoiseMemo = {}
        out = []
        for t, r in zip(times, running_for):
            a = self.activity(Moment(seed, key, t, r, utc_offset, memo), params)
            out.append((a.utilization_percent, a.memory_fraction))
        return out


def _jitter(moment: Moment, name: str, period: float, amplitude: float) -> float:
    """Smooth noise centred on 0 in [-amplitude, amplitude]."""
    return (
        (smooth_noise(moment.seed, (*moment.key, name), moment.t, period, moment.memo) - 0.5)
        * 2.0
        * amplitude
    )


def _warmup(moment: Moment, seconds: float) -> float:
    """0 at start, 1 after `seconds`: a process loading its model and allocating memory."""
    if seconds <= 0:
        return 1.0
    return clamp(moment.running_for / seconds, 0.0, 1.0)


class Idle(WorkloadModel):
    """A process that holds memory and does nothing: a forgotten notebook kernel, a dead server."""

    kind = "idle"
    description = "holds memory at 0% utilization (stale notebook kernel)"
    default_command = "/opt/conda/bin/python -m ipykernel_launcher -f /tmp/kernel.json"
    default_memory = 0.1

    def activity(self, moment: Moment, params: Mapping[str, float]) -> Activity:
        return Activity(0.0, 1.0, 0.0)

    def series(
        self,
        seed: int,
        key: Tuple[object, ...],
        times: Sequence[float],
        running_for: Sequence[float],
        utc_offset: float,
        params: Mapping[str, float],
    ) -> List[Tuple[float, float]]:
        return [(0.0, 1.0)] * len(times)


class Inference(WorkloadModel):
    """An online model server: load follows requests, which follow the working day."""

    kind = "inference"
    description = "online inference: diurnal load peaking in working hours, steady memory"
    default_command = "python -m vllm.entrypoints.openai.api_server --model /models/llm"
    default_memory = 0.6
    params = (
        Param("peak_util", "percent", 85.0, "utilization at the daily peak"),
        Param("night_util", "percent", 6.0, "utilization in the middle of the night"),
        Param("peak_hour", "hour", 14.0, "local hour of the daily peak"),
        Param("spread_hours", "number", 3.5, "width of the daily bump, hours"),
        Param("weekend_factor", "fraction", 0.45, "share of the weekday load seen at weekends"),
    )

    def load(self, moment: Moment, params: Mapping[str, float]) -> float:
        """Request load in [0, 1] of the peak, before noise."""
        hour = local_hour(moment.t, moment.utc_offset)
        distance = abs(hour - params["peak_hour"])
        distance = min(distance, 24.0 - distance)
        spread = max(params["spread_hours"], 0.25)
        bump = math.exp(-0.5 * (distance / spread) ** 2)
        if is_weekend(moment.t, moment.utc_offset):
            bump *= params["weekend_factor"]
        return bump

    def activity(self, moment: Moment, params: Mapping[str, float]) -> Activity:
        night = params["night_util"]
        peak = max(params["peak_util"], night)
        base = night + (peak - night) * self.load(moment, params)
        # Requests arrive in waves of a minute or so, with second-scale jitter on top.
        wave = _jitter(moment, "wave", 60.0, 0.12) + _jitter(moment, "req", 5.0, 0.06)
        util = clamp(base * (1.0 + wave), 0.0, 100.0) * _warmup(moment, 120.0)
        memory = 0.96 + 0.04 * (util / 100.0)  # weights plus a KV cache that breathes a little
        return Activity(util, memory * max(_warmup(moment, 90.0), 0.3), util * 0.45)

    def series(
        self,
        seed: int,
        key: Tuple[object, ...],
        times: Sequence[float],
        running_for: Sequence[float],
        utc_offset: float,
        params: Mapping[str, float],
    ) -> List[Tuple[float, float]]:
        # `activity`, step by step, for many times (keep the two in step).
        night = params["night_util"]
        peak = max(params["peak_util"], night)
        peak_hour = params["peak_hour"]
        spread = max(params["spread_hours"], 0.25)
        weekend_factor = params["weekend_factor"]
        wave_hash, req_hash = _hasher(seed, (*key, "wave")), _hasher(seed, (*key, "req"))
        exp, floor = math.exp, math.floor
        out = []
        for t, r in zip(times, running_for):
            hour = ((t + utc_offset) % DAY) / HOUR
            distance = abs(hour - peak_hour)
            distance = min(distance, 24.0 - distance)
            bump = exp(-0.5 * (distance / spread) ** 2)
            if (floor((t + utc_offset) / DAY) + 3) % 7 >= 5:
                bump *= weekend_factor
            base = night + (peak - night) * bump
            wave = (_smooth_at(wave_hash, t, 60.0) - 0.5) * 2.0 * 0.12 + (
                _smooth_at(req_hash, t, 5.0) - 0.5
            ) * 2.0 * 0.06
            util = max(0.0, min(100.0, base * (1.0 + wave))) * max(0.0, min(1.0, r / 120.0))
            memory = 0.96 + 0.04 * (util / 100.0)
            out.append((util, memory * max(max(0.0, min(1.0, r / 90.0)), 0.3)))
        return out


class Training(WorkloadModel):
    """An offline training job: saturates its GPU for days, memory high and steady."""

    kind = "training"
    description = "offline training: 90-100% utilization, high steady memory, long-running"
    default_command = "python train.py --config configs/train.yaml"
    default_memory = 0.85
    params = (
        Param("util", "percent", 96.0, "mean utilization while stepping"),
        Param("checkpoint_every", "duration", 0.0, "seconds between checkpoints (0: none)"),
        Param("checkpoint_seconds", "duration", 45.0, "how long a checkpoint stalls the GPU"),
        Param("checkpoint_util", "percent", 20.0, "utilization while checkpointing"),
    )

    def activity(self, moment: Moment, params: Mapping[str, float]) -> Activity:
        warm = _warmup(moment, 60.0)
        mean = params["util"]
        util = clamp(mean + _jitter(moment, "step", 7.0, 3.0), min(90.0, mean), 100.0)
        every = params["checkpoint_every"]
        if every > 0 and moment.running_for >= every:
            phase = moment.running_for % every
            if phase < params["checkpoint_seconds"]:
                util = params["checkpoint_util"] + _jitter(moment, "ckpt", 5.0, 5.0)
        util = clamp(util, 0.0, 100.0)
        if warm < 1.0:
            util *= warm
        return Activity(util, 0.1 + 0.9 * warm, util * 0.6)

    def series(
        self,
        seed: int,
        key: Tuple[object, ...],
        times: Sequence[float],
        running_for: Sequence[float],
        utc_offset: float,
        params: Mapping[str, float],
    ) -> List[Tuple[float, float]]:
        # `activity`, step by step, for many times (keep the two in step).
        mean = params["util"]
        low = min(90.0, mean)
        every = params["checkpoint_every"]
        checkpoint_seconds, checkpoint_util = params["checkpoint_seconds"], params["checkpoint_util"]
        step_hash, ckpt_hash = _hasher(seed, (*key, "step")), _hasher(seed, (*key, "ckpt"))
        out = []
        for t, r in zip(times, running_for):
            warm = max(0.0, min(1.0, r / 60.0))
            util = max(low, min(100.0, mean + (_smooth_at(step_hash, t, 7.0) - 0.5) * 2.0 * 3.0))
            if every > 0 and r >= every and r % every < checkpoint_seconds:
                util = checkpoint_util + (_smooth_at(ckpt_hash, t, 5.0) - 0.5) * 2.0 * 5.0
            util = max(0.0, min(100.0, util))
            if warm < 1.0:
                util *= warm
            out.append((util, 0.1 + 0.9 * warm))
        return out


class Notebook(WorkloadModel):
    """An interactive notebook: idle most of the time, with short bursts when someone runs a cell."""

    kind = "notebook"
    description = "interactive notebook: mostly idle, short bursts, memory held throughout"
    default_command = "/opt/conda/bin/python -m ipykernel_launcher -f /tmp/kernel.json"
    default_memory = 0.25
    params = (
        Param("burst_probability", "fraction", 0.12, "share of time buckets with a burst"),
        Param("burst_util", "percent", 75.0, "mean utilization in a burst"),
        Param("bucket", "duration", 300.0, "length of a time bucket, seconds"),
        Param("working_hours_only", "fraction", 1.0, "1: bursts only between 08:00 and 20:00"),
    )

    def activity(self, moment: Moment, params: Mapping[str, float]) -> Activity:
        hour = local_hour(moment.t, moment.utc_offset)
        daytime = 8.0 <= hour < 20.0 and not is_weekend(moment.t, moment.utc_offset)
        if params["working_hours_only"] >= 0.5 and not daytime:
            return Activity(0.0, 1.0, 0.0)
        bucket_len = max(params["bucket"], 1.0)
        bucket = math.floor(moment.t / bucket_len)
        if (
            bucket_noise(moment.seed, (*moment.key, "burst"), bucket, moment.memo)
            >= params["burst_probability"]
        ):
            return Activity(0.0, 1.0, 0.0)
        # A burst covers part of its bucket: a cell that runs for a while, then the user reads.
        length = 0.3 + 0.6 * bucket_noise(moment.seed, (*moment.key, "len"), bucket, moment.memo)
        if (moment.t / bucket_len - bucket) > length:
            return Activity(0.0, 1.0, 0.0)
        util = clamp(params["burst_util"] + _jitter(moment, "burst", 3.0, 20.0), 5.0, 100.0)
        return Activity(util, 1.0, util * 0.4)

    def series(
        self,
        seed: int,
        key: Tuple[object, ...],
        times: Sequence[float],
        running_for: Sequence[float],
        utc_offset: float,
        params: Mapping[str, float],
    ) -> List[Tuple[float, float]]:
        # `activity`, step by step, for many times (keep the two in step).
        working_hours = params["working_hours_only"] >= 0.5
        bucket_len = max(params["bucket"], 1.0)
        probability, burst_util = params["burst_probability"], params["burst_util"]
        burst_hash, len_hash = _hasher(seed, (*key, "burst")), _hasher(seed, (*key, "len"))
        jitter_hash = _hasher(seed, (*key, "burst"))
        floor = math.floor
        out: List[Tuple[float, float]] = []
        for t in times:
            if working_hours:
                hour = ((t + utc_offset) % DAY) / HOUR
                if not (8.0 <= hour < 20.0 and not (floor((t + utc_offset) / DAY) + 3) % 7 >= 5):
                    out.append((0.0, 1.0))
                    continue
            bucket = floor(t / bucket_len)
            if _bucket_at(burst_hash, bucket) >= probability:
                out.append((0.0, 1.0))
                continue
            length = 0.3 + 0.6 * _bucket_at(len_hash, bucket)
            if (t / bucket_len - bucket) > length:
                out.append((0.0, 1.0))
                continue
            util = max(5.0, min(100.0, burst_util + (_smooth_at(jitter_hash, t, 3.0) - 0.5) * 2.0 * 20.0))
            out.append((util, 1.0))
        return out


class Steady(WorkloadModel):
    """A process at a constant utilization: benchmarks, tests, and specs that want exact figures."""

    kind = "steady"
    description = "constant utilization (benchmarks, tests)"
    default_command = "python bench.py"
    default_memory = 0.3
    params = (
        Param("util", "percent", 50.0, "utilization"),
        Param("jitter", "percent", 0.0, "+/- noise around it"),
        Param("memory_util", "percent", 25.0, "memory-bandwidth utilization"),
    )

    def activity(self, moment: Moment, params: Mapping[str, float]) -> Activity:
        util = params["util"]
        if params["jitter"] > 0:
            util += _jitter(moment, "steady", 5.0, params["jitter"])
        return Activity(clamp(util, 0.0, 100.0), 1.0, params["memory_util"])

    def series(
        self,
        seed: int,
        key: Tuple[object, ...],
        times: Sequence[float],
        running_for: Sequence[float],
        utc_offset: float,
        params: Mapping[str, float],
    ) -> List[Tuple[float, float]]:
        # `activity`, step by step, for many times (keep the two in step).
        jitter = params["jitter"]
        if jitter <= 0:
            return [(max(0.0, min(100.0, params["util"])), 1.0)] * len(times)
        steady_hash = _hasher(seed, (*key, "steady"))
        return [
            (
                max(0.0, min(100.0, params["util"] + (_smooth_at(steady_hash, t, 5.0) - 0.5) * 2.0 * jitter)),
                1.0,
            )
            for t in times
        ]


MODELS: Dict[str, WorkloadModel] = {
    model.kind: model for model in (Idle(), Inference(), Training(), Notebook(), Steady())
}


def get_model(kind: str) -> Optional[WorkloadModel]:
    return MODELS.get(kind)


# Workload states, as `SimBackend.workloads()` reports them.
PENDING = "pending"  # queued: not started yet (start time ahead, or no start time at all)
RUNNING = "running"
DONE = "done"  # its stop time has passed
BLOCKED = "blocked"  # due, but its GPU or MIG instance is missing (MIG mode changed, instance gone)
STATES = (PENDING, RUNNING, DONE, BLOCKED)


@dataclass(frozen=True)
class WorkloadStatus:
    """A workload's schedule and where it stands now (the fleet and pool layers build on this)."""

    name: str
    kind: str
    state: str
    tenant: Optional[str]
    user: str
    command: str
    gpus: Tuple[int, ...]
    gpu_instance_id: Optional[int]
    compute_instance_id: Optional[int]
    start: Optional[float]  # absolute simulated time; None while queued without a start
    stop: Optional[float]
    pids: Tuple[int, ...]
    memory_bytes: Tuple[int, ...]  # the footprint asked for on each target
