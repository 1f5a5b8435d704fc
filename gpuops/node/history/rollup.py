"""Samples integrated into minute and hour buckets: the accumulators both the recorder
(recorder.py) and the simulator's past (`Rollup`, node/sim_past.py) fill.

A sample counts for the seconds since the previous one (`_dt`: nothing after a gap of more than
two intervals), cut at the buckets' edges (`_pieces`); each GPU's figures and each key's (user,
groups, tenant, GPU instance: `core.history.gpu_shares`) are added into `_BucketAcc`s, frozen into
`Bucket`s or written straight as their JSON text (`_BucketAcc.text`). node/sim_past.py fills the
same accumulators in bulk, so their names stay this module's, shared with it alone.

Standard library only; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import json
import math
import zlib
from typing import Any, Dict, List, Optional, Tuple

from gpuops.core.history import (
    HOUR,
    MAX_KEYS,
    MINUTE,
    OTHER_USER,
    Bucket,
    GpuShare,
    GpuUsage,
    Key,
    UserUsage,
    bucket_from_json,
    gpu_shares,
)
from gpuops.core.model import Gpu, NodeSample
from gpuops.node.history.files import dumps

_OTHER: Key = (OTHER_USER, (), None, "", None)


class _KeyAcc:
    __slots__ = ("busy", "held", "memory", "memory_max", "process_max", "processes", "seconds")

    def __init__(self) -> None:
        self.seconds = self.held = self.busy = self.memory = 0.0
        self.memory_max = self.process_max = self.processes = 0


class _GpuAcc:
    __slots__ = (
        "busy",
        "index",
        "keys",
        "memory",
        "memory_max",
        "memory_total",
        "mig",
        "name",
        "owner",
        "seconds",
        "uuid",
    )

    def __init__(self, index: int, uuid: str, name: str) -> None:
        self.index = index
        self.uuid = uuid
        self.name = name
        self.memory_total = 0
        self.owner: Optional[str] = None
        self.mig = False
        self.seconds = self.busy = self.memory = 0.0
        self.memory_max = 0
        self.keys: Dict[Key, _KeyAcc] = {}

    def target(self, key: Key, max_keys: int) -> Key:
        """The key a process counts under: its own while there is room, else "(other)"."""
        if key in self.keys:
            return key
        own = len(self.keys) - (1 if _OTHER in self.keys else 0)
        return key if own < max_keys - 1 else _OTHER


def _gpu_id(index: int, uuid: str) -> str:
    return uuid or "#%d" % index


class _BucketAcc:
    """One minute or hour bucket being filled."""

    __slots__ = ("gpus", "span", "start")

    def __init__(self, start: float, span: float) -> None:
        self.start = start
        self.span = span
        self.gpus: Dict[str, _GpuAcc] = {}

    def _gpu(self, index: int, uuid: str, name: str) -> _GpuAcc:
        gid = _gpu_id(index, uuid)
        acc = self.gpus.get(gid)
        if acc is None:
            acc = self.gpus[gid] = _GpuAcc(index, uuid, name)
        return acc

    def add(self, shares: List[Tuple[Gpu, GpuShare]], dt: float, max_keys: int) -> None:
        """Count `dt` seconds of one sample (its GPUs and their shares), but never more time for
        a GPU than the bucket's length: after a clock set back, later samples would count a time
        of the bucket again (a bucket with more is one whose figures cannot be true)."""
        whole = dt
        for gpu, share in shares:
            info = gpu.info
            acc = self._gpu(info.index, info.uuid, info.name)
            dt = min(whole, self.span - acc.seconds)
            if dt <= 0:
                continue
            acc.index, acc.name = info.index, info.name
            total = info.memory_total_bytes
            if isinstance(total, int) and not isinstance(total, bool) and total > 0:
                acc.memory_total = total
            acc.owner = gpu.owner
            acc.mig = acc.mig or share.mig
            acc.seconds += dt
            acc.busy += share.busy * dt
            acc.memory += share.memory * dt
            if share.memory > acc.memory_max:
                acc.memory_max = share.memory
            # This sample's figures per key it counts under (several keys may land in "(other)").
            merged: Dict[Key, List[float]] = {}
            for ks in share.keys:
                target = acc.target(ks.key, max_keys)
                if target not in acc.keys:
                    acc.keys[target] = _KeyAcc()
                m = merged.get(target)
                if m is None:
                    merged[target] = [ks.weight, ks.busy, ks.memory, ks.process_max, ks.processes]
                else:
                    m[0] += ks.weight
                    m[1] += ks.busy
                    m[2] += ks.memory
                    m[3] = max(m[3], ks.process_max)
                    m[4] += ks.processes
            for target, (weight, busy, memory, process_max, processes) in merged.items():
                k = acc.keys[target]
                k.seconds += dt
                k.held += weight * dt
                k.busy += busy * dt
                k.memory += memory * dt
                k.memory_max = max(k.memory_max, int(memory))
                k.process_max = max(k.process_max, int(process_max))
                k.processes = max(k.processes, int(processes))

    def merge(self, bucket: Bucket, max_keys: int) -> None:
        """Add a bucket of the same start that covers other times (the sim's past, a restart)."""
        for g in bucket.gpus:
            acc = self._gpu(g.index, g.uuid, g.name)
            if g.memory_total:
                acc.memory_total = g.memory_total
            if acc.owner is None:
                acc.owner = g.owner
            acc.mig = acc.mig or g.mig
            acc.seconds += g.seconds
            acc.busy += g.busy
            acc.memory += g.memory
            acc.memory_max = max(acc.memory_max, g.memory_max)
            for u in g.users:
                target = acc.target(
                    (u.user, u.groups, u.tenant, u.tenant_source, u.gpu_instance_id), max_keys
                )
                k = acc.keys.get(target)
                if k is None:
                    k = acc.keys[target] = _KeyAcc()
                k.seconds += u.seconds
                k.held += u.held
                k.busy += u.busy
                k.memory += u.memory
                k.memory_max = max(k.memory_max, u.memory_max)
                k.process_max = max(k.process_max, u.process_max)
                k.processes = max(k.processes, u.processes)

    def freeze(self) -> Bucket:
        gpus = []
        for acc in sorted(self.gpus.values(), key=lambda a: (a.index, a.uuid)):
            users = tuple(
                UserUsage(
                    user=key[0],
                    groups=key[1],
                    tenant=key[2],
                    tenant_source=key[3],
                    gpu_instance_id=key[4],
                    seconds=round(min(k.seconds, acc.seconds), 3),
                    held=round(k.held, 3),
                    busy=round(k.busy, 3),
                    memory=float(round(k.memory)),
                    memory_max=k.memory_max,
                    process_max=k.process_max,
                    processes=k.processes,
                )
                for key, k in sorted(acc.keys.items(), key=_key_order)
            )
            gpus.append(
                GpuUsage(
                    index=acc.index,
                    uuid=acc.uuid,
                    name=acc.name,
                    memory_total=acc.memory_total,
                    owner=acc.owner,
                    mig=acc.mig,
                    seconds=round(acc.seconds, 3),
                    busy=round(acc.busy, 3),
                    memory=float(round(acc.memory)),
                    memory_max=acc.memory_max,
                    users=users,
                )
            )
        return Bucket(start=self.start, span=self.span, gpus=tuple(gpus))

    def text(self, parts: Dict[Any, str]) -> str:
        """`dumps(bucket_to_json(self.freeze()))`, without the bucket's objects: the figures
        written as json writes them (repr) between fragments that stay the same from bucket
        to bucket (a GPU's identity, a key's), encoded by json once and kept in `parts`. The
        simulator's past is hundreds of buckets per node, encoded right away."""
        gpus = []
        for acc in sorted(self.gpus.values(), key=lambda a: (a.index, a.uuid)):
            ident = (acc.index, acc.uuid, acc.name, acc.memory_total, acc.owner, acc.mig)
            head = parts.get(ident)
            if head is None:
                names = ("index", "uuid", "name", "memory_total", "owner", "mig")
                head = parts[ident] = dumps(dict(zip(names, ident)))[:-1] + ',"seconds":'
            seconds = acc.seconds
            users = []
            for key, k in sorted(acc.keys.items(), key=_key_order):
                user = parts.get(key)
                if user is None:
                    fields = ("user", "groups", "tenant", "tenant_source", "gpu_instance_id")
                    values = (key[0], list(key[1]), key[2], key[3], key[4])
                    user = parts[key] = dumps(dict(zip(fields, values)))[:-1] + ',"seconds":'
                users.append(
                    '%s%r,"held":%r,"busy":%r,"memory":%r,"memory_max":%r,"process_max":%r,'
                    '"processes":%r}'
                    % (
                        user,
                        round(min(k.seconds, seconds), 3),
                        round(k.held, 3),
                        round(k.busy, 3),
                        float(round(k.memory)),
                        k.memory_max,
                        k.process_max,
                        k.processes,
                    )
                )
            gpus.append(
                '%s%r,"busy":%r,"memory":%r,"memory_max":%r,"users":[%s]}'
                % (
                    head,
                    round(seconds, 3),
                    round(acc.busy, 3),
                    float(round(acc.memory)),
                    acc.memory_max,
                    ",".join(users),
                )
            )
        return '{"start":%r,"span":%r,"gpus":[%s]}' % (self.start, self.span, ",".join(gpus))

    @classmethod
    def of(cls, bucket: Bucket, max_keys: int) -> "_BucketAcc":
        acc = cls(bucket.start, bucket.span)
        acc.merge(bucket, max_keys)
        return acc


def _key_order(item: Tuple[Key, _KeyAcc]) -> Tuple[Any, ...]:
    user, groups, tenant, source, gi = item[0]
    return (user == OTHER_USER, user, groups, tenant or "", source, -1 if gi is None else gi)


def _pieces(t0: float, t1: float, span: float) -> List[Tuple[float, float]]:
    """(bucket start, seconds) of the interval [t0, t1] cut at multiples of span."""
    out = []
    t = t0
    while t < t1:
        start = math.floor(t / span) * span
        end = min(t1, start + span)
        if end > t:
            out.append((start, end - t))
        t = end if end > t else start + span
    return out


def _dt(previous: Optional[float], t: float, interval: float) -> float:
    """The seconds a sample at t counts for: since the previous sample, 0 after a gap of more
    than two intervals (the node or the recorder was down) or without a previous sample."""
    if previous is None or t <= previous or t - previous > 2 * interval:
        return 0.0
    return t - previous


class Rollup:
    """Samples integrated into hour and minute buckets in memory only (the simulator's past):
    the figures a Recorder with the same interval would write. Minute buckets that end before
    `minutes_after` are not kept."""

    def __init__(self, interval: float, minutes_after: float = -math.inf, max_keys: int = MAX_KEYS) -> None:
        self.interval = float(interval)
        self.minutes_after = minutes_after
        self.max_keys = max(2, max_keys)
        self._last: Optional[float] = None
        self._hours: Dict[float, _BucketAcc] = {}
        self._minutes: Dict[float, _BucketAcc] = {}

    def add(self, sample: NodeSample) -> None:
        t = float(sample.timestamp)
        dt = _dt(self._last, t, self.interval)
        self._last = t
        if dt <= 0:
            return
        shares = [(gpu, gpu_shares(gpu)) for gpu in sample.gpus]
        for span, accs in ((HOUR, self._hours), (MINUTE, self._minutes)):
            for start, seconds in _pieces(t - dt, t, span):
                if span == MINUTE and start + MINUTE <= self.minutes_after:
                    continue
                acc = accs.get(start)
                if acc is None:
                    acc = accs[start] = _BucketAcc(start, span)
                acc.add(shares, seconds, self.max_keys)

    def buckets(self) -> List[Bucket]:
        """Hour buckets, then minute buckets, each by start."""
        return [self._hours[s].freeze() for s in sorted(self._hours)] + [
            self._minutes[s].freeze() for s in sorted(self._minutes)
        ]

    def packed(self) -> List["Packed"]:
        """`buckets()` as a recorder keeps them (`Packed`), in the same order."""
        parts: Dict[Any, str] = {}
        return [
            Packed(start, accs[start].span, zlib.compress(accs[start].text(parts).encode("utf-8"), 1))
            for accs in (self._hours, self._minutes)
            for start in sorted(accs)
        ]


class Packed:
    """A finished bucket as a recorder keeps it (its JSON text, compressed) with its start and
    span: how the simulator's past comes from the worker processes that build it
    (`Rollup.packed`), a tenth of the bytes of the bucket's objects, and merged into the
    recorder without encoding it again (`Recorder.merge`)."""

    __slots__ = ("data", "span", "start")

    def __init__(self, start: float, span: float, data: bytes) -> None:
        self.start = start
        self.span = span
        self.data = data

    def json(self) -> str:
        return zlib.decompress(self.data).decode("utf-8")

    @property
    def bucket(self) -> Bucket:
        return bucket_from_json(json.loads(self.json()))

    def __reduce__(self) -> Tuple[Any, ...]:
        return (Packed, (self.start, self.span, self.data))
