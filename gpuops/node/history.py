"""History on the node: bounded minute and hour rollups of samples, kept in a directory.

- `Recorder` takes `NodeSample`s (the sample's own timestamp counts) and integrates them into the
  current minute and hour buckets (gpuops/core/history.py says what each figure is). It writes
  atomically (temporary file, fsync, rename, fsync of the directory) at least every
  `flush_every` seconds and when an hour ends:
  - `DIR/hours-YYYYMMDD.json`: the hour buckets of one UTC day; day files older than
    `keep_days` (35) are deleted;
  - `DIR/minutes.json`: the minute buckets of the last `keep_minutes` (120) minutes.
  A crash loses at most what came after the last write; a file is always either the old one or
  the new one. A file that cannot be read (garbage, a foreign format) is logged and skipped; the
  recorder moves it aside to `NAME.corrupt` before it writes that file again.
- `read_history(dir, resolution, since, until)` answers the agent's `history` request. The time
  an unreadable file (or one moved aside) held is said in `History.unreadable`: unknown, not idle;
  so is a bucket whose figures cannot be true (`core.history.bucket_fault`: a busy time past the
  time sampled, more memory than the GPU has...), which is left out of the reply.
- `run_recorder(...)` is the service mode, `gpuops agent --record`: sample the backend forever at
  an interval and record. One recorder per directory (`DIR/recorder.lock`, flock).

Standard library only; valid Python 3.8 (runs on GPU nodes). docs/history.md has the details.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import gc
import json
import logging
import math
import os
import re
import signal
import sys
import time
import zlib
from typing import Any, Callable, Dict, Iterable, List, Optional, TextIO, Tuple

from gpuops.core.atomic_file import atomic_write
from gpuops.core.history import (
    HOUR,
    MAX_KEYS,
    MINUTE,
    OTHER_USER,
    RESOLUTIONS,
    Bucket,
    GpuShare,
    GpuUsage,
    History,
    Key,
    Unreadable,
    UserUsage,
    bucket_fault,
    bucket_from_json,
    bucket_to_json,
    bucket_when,
    gpu_shares,
    keep_only_text,
)
from gpuops.core.model import Gpu, NodeSample

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("gpuops.history")

FORMAT = "gpuops-history"
FILE_VERSION = 1
MINUTES_FILE = "minutes.json"
LOCK_FILE = "recorder.lock"
DEFAULT_INTERVAL = 10.0  # seconds between samples in service mode
MIN_INTERVAL = 0.05
MAX_INTERVAL = 60.0  # a recorder writes on a sample: at most every minute keeps `recording` true
FLUSH_EVERY = 60.0  # seconds between writes, at most
KEEP_DAYS = 35  # hour buckets, in day files
KEEP_MINUTES = 120  # minute buckets
# `History.recording`: minutes.json was written within this many seconds (3 flush intervals).
RECORDING_WITHIN = 3 * FLUSH_EVERY
MAX_FILE_BYTES = 64 * 1024 * 1024  # a bigger file is not ours: skipped
DAY = 86400.0

_HOURS_RE = re.compile(r"^hours-(\d{8})\.json\Z")
_OTHER: Key = (OTHER_USER, (), None, "", None)


def hours_file(day: str) -> str:
    return "hours-%s.json" % day


def day_of(t: float) -> str:
    """The UTC day of a time, as YYYYMMDD."""
    return time.strftime("%Y%m%d", time.gmtime(t))


@functools.lru_cache(maxsize=1024)  # a reply names each day file's day once per bucket
def day_start(day: str) -> float:
    """Seconds since 1970 at 00:00 UTC of a YYYYMMDD day."""
    import calendar

    return float(calendar.timegm(time.strptime(day, "%Y%m%d")))


def _dumps(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


_fast_loads: Callable[[str], Any]
try:  # the operator's parser; a node without it reads with the standard library's
    from orjson import loads as _fast_loads
except ImportError:  # pragma: no cover - nodes may not have it
    _fast_loads = json.loads


def _loads_line(text: str) -> Any:
    """One bucket's line: orjson when the node has it (reading the files is most of what
    answering `history` costs), the standard library for anything orjson refuses that it takes
    (a lone surrogate in an escape), so both read the same files."""
    try:
        return _fast_loads(text)
    except ValueError:
        return json.loads(text)


# ---- accumulation ------------------------------------------------------------------------------


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
        """`_dumps(bucket_to_json(self.freeze()))`, without the bucket's objects: the figures
        written as json writes them (repr) between fragments that stay the same from bucket
        to bucket (a GPU's identity, a key's), encoded by json once and kept in `parts`. The
        simulator's past is hundreds of buckets per node, encoded right away."""
        gpus = []
        for acc in sorted(self.gpus.values(), key=lambda a: (a.index, a.uuid)):
            ident = (acc.index, acc.uuid, acc.name, acc.memory_total, acc.owner, acc.mig)
            head = parts.get(ident)
            if head is None:
                names = ("index", "uuid", "name", "memory_total", "owner", "mig")
                head = parts[ident] = _dumps(dict(zip(names, ident)))[:-1] + ',"seconds":'
            seconds = acc.seconds
            users = []
            for key, k in sorted(acc.keys.items(), key=_key_order):
                user = parts.get(key)
                if user is None:
                    fields = ("user", "groups", "tenant", "tenant_source", "gpu_instance_id")
                    values = (key[0], list(key[1]), key[2], key[3], key[4])
                    user = parts[key] = _dumps(dict(zip(fields, values)))[:-1] + ',"seconds":'
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


# ---- files -------------------------------------------------------------------------------------


class FileError(ValueError):
    """A history file that cannot be used; the message says which and why."""


def read_file(path: str, resolution: str) -> List[Bucket]:
    """The buckets of one history file; FileError when it is not a valid one."""
    return _read_file(path, resolution)[0]


def _read_file(path: str, resolution: str) -> Tuple[List[Bucket], int]:
    """read_file's buckets, which keep the JSON they were read from (bucket_to_json gives it
    back: a node answers `history` without encoding them again), and the file's size."""
    try:
        size = os.path.getsize(path)
        if size > MAX_FILE_BYTES:
            raise FileError("%s: %d bytes, more than a history file holds" % (path, size))
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise FileError("%s: %s" % (path, exc.strerror or exc)) from None
    texts: Optional[List[str]] = None
    try:
        text = raw.decode("utf-8")
        data = _read_lines(text)
        if data is None:
            data = json.loads(text)
        else:
            texts = data["buckets"][1]
            data["buckets"] = data["buckets"][0]
    except (UnicodeDecodeError, ValueError) as exc:
        raise FileError("%s: not JSON (%s)" % (path, str(exc)[:100])) from None
    except RecursionError:
        raise FileError("%s: nested too deeply" % path) from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise FileError("%s: not a gpuops history file" % path)
    if data.get("version") != FILE_VERSION:
        raise FileError(
            "%s: history file version %r (this agent reads %d)" % (path, data.get("version"), FILE_VERSION)
        )
    if data.get("resolution") != resolution:
        raise FileError("%s: holds %r buckets, expected %s" % (path, data.get("resolution"), resolution))
    buckets = data.get("buckets")
    if not isinstance(buckets, list):
        raise FileError("%s: 'buckets' must be a list" % path)
    out: List[Bucket] = []
    span = RESOLUTIONS[resolution]
    try:
        for n, item in enumerate(buckets):
            b = bucket_from_json(item, "buckets[%d]" % n, keep_json=True)
            if b.span != span:
                raise ValueError("buckets[%d].span: %g in a %s file" % (n, b.span, resolution))
            if texts is not None:
                # Only the checked line is kept, not its objects: a reply sends the line, and
                # held objects would be walked by the cyclic collector while the reply is made
                # (`gpus` is built from the line if something asks for it).
                b.__dict__[_TEXT] = texts[n]
                keep_only_text(b, texts[n])
            out.append(b)
    except ValueError as exc:
        raise FileError("%s: %s" % (path, exc)) from None
    out.sort(key=lambda b: b.start)
    return out, len(raw)


_TEXT = "_text"  # instance dictionary key of a bucket's line in its file (not a field)
_BUCKETS_OPEN = ',"buckets":['


def _file_text(resolution: str, written: float, texts: Iterable[str]) -> str:
    """A history file: one JSON document, its buckets one per line (a reader that slices the
    lines gives each bucket's text back without encoding it again; any JSON reader reads it)."""
    head = _dumps({"format": FORMAT, "version": FILE_VERSION, "resolution": resolution, "written": written})
    body = ",\n".join(texts)
    return head[:-1] + _BUCKETS_OPEN + "\n" + body + ("\n" if body else "") + "]}\n"


def _bucket_lines(text: str) -> Optional[List[str]]:
    """[head, bucket text, ...] of a file _file_text wrote; None for any other layout (files of
    earlier agents: one line), which is then read as a whole."""
    if not text.endswith("\n]}\n"):
        return None
    lines = text[:-4].split("\n")
    if len(lines) < 1 or not lines[0].endswith(_BUCKETS_OPEN[1:]):
        return None
    body = lines[1:]
    for i in range(len(body) - 1):
        if not body[i].endswith(","):
            return None
        body[i] = body[i][:-1]
    return [lines[0], *body]


def _read_lines(text: str) -> Optional[Dict[str, Any]]:
    """A file in the line layout, its "buckets" as (decoded, texts), each line parsed alone: each
    is then known to be one whole bucket, and the node can answer `history` with the lines as
    they are. None when the text is not in that layout (it is then read as a whole)."""
    lines = _bucket_lines(text)
    if lines is None:
        return None
    try:
        data = json.loads(lines[0] + "]}")
        if not isinstance(data, dict):
            return None
        data["buckets"] = ([_loads_line(t) for t in lines[1:]], lines[1:])
    except (ValueError, RecursionError):
        return None
    return data


def bucket_text(bucket: Bucket) -> Optional[str]:
    """The bucket's JSON as its file has it, when read from a file in the line layout."""
    text = bucket.__dict__.get(_TEXT)
    return text if isinstance(text, str) else None


class _Stored:
    """A finished bucket, kept as compressed JSON text: a node keeps 120 minutes and a day of
    hours in memory (the simulator a thousand nodes' worth), and writes them as text."""

    __slots__ = ("_data",)

    def __init__(self, bucket: Optional[Bucket], data: bytes = b"") -> None:
        self._data = (
            zlib.compress(_dumps(bucket_to_json(bucket)).encode("utf-8"), 1) if bucket is not None else data
        )

    def json(self) -> str:
        return zlib.decompress(self._data).decode("utf-8")

    @property
    def bucket(self) -> Bucket:
        return bucket_from_json(json.loads(self.json()))


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


def _unpacked(b: "Bucket | Packed") -> Bucket:
    return b.bucket if isinstance(b, Packed) else b


class RecorderBusy(Exception):
    """Another recorder writes this directory; the message says which."""


def _lock(directory: str) -> Optional[TextIO]:
    """Take DIR/recorder.lock (non-blocking); RecorderBusy when someone else has it."""
    if fcntl is None:  # pragma: no cover
        return None
    f = open(os.path.join(directory, LOCK_FILE), "a+")  # noqa: SIM115 (held open: the lock)
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        f.seek(0)
        who = f.read(200).strip() or "another process"
        f.close()
        if exc.errno in (errno.EAGAIN, errno.EACCES):
            raise RecorderBusy("another recorder writes %s (%s)" % (directory, who)) from None
        raise
    f.seek(0)
    f.truncate()
    f.write("recorder pid %d since %s\n" % (os.getpid(), time.strftime("%Y-%m-%d %H:%M:%S")))
    f.flush()
    return f


class Recorder:
    """Integrates samples into minute and hour buckets and keeps them in `directory`.

    `interval`: the recording interval; a sample counts for the time since the previous one, at
    most 2 x interval (a longer gap counts nothing). `flush_every`: seconds of the clock between
    writes (and at the end of each hour); `autoflush=False` writes only on `flush()` and when an
    hour is done. `durable=False` skips the fsyncs (the simulator). `clock`
    decides what "the last 120 minutes" and "35 days" are and when to write."""

    def __init__(
        self,
        directory: str,
        interval: float = DEFAULT_INTERVAL,
        flush_every: float = FLUSH_EVERY,
        durable: bool = True,
        clock: Callable[[], float] = time.time,
        keep_days: int = KEEP_DAYS,
        keep_minutes: int = KEEP_MINUTES,
        max_keys: int = MAX_KEYS,
        autoflush: bool = True,
        lock: bool = True,
    ) -> None:
        self.directory = directory
        self.interval = float(interval)
        self.flush_every = float(flush_every)
        self.durable = durable
        self.clock = clock
        self.keep_days = keep_days
        self.keep_minutes = keep_minutes
        self.max_keys = max(2, max_keys)
        self.autoflush = autoflush
        os.makedirs(directory, mode=0o755, exist_ok=True)
        self._lock = _lock(directory) if lock else None
        self._last: Optional[float] = None  # timestamp of the previous sample
        self.first: Optional[float] = None  # timestamp of the first sample recorded
        self._hour: Optional[_BucketAcc] = None
        self._minute: Optional[_BucketAcc] = None
        self._day: Optional[str] = None  # the day whose hour buckets are in `_hours`
        self._hours: Dict[float, _Stored] = {}
        self._minutes: Dict[float, _Stored] = {}
        self._dirty_hours = False
        self._dirty_minutes = False
        self._last_flush = clock()
        self._last_prune = -math.inf
        self.samples = 0
        self.writes = 0
        self._clean_temporaries()
        self._minutes = {b.start: _Stored(b) for b in self._load(MINUTES_FILE, "minute")}

    # ---- input ---------------------------------------------------------------------------------

    def add(self, sample: NodeSample) -> None:
        """Record one sample (its timestamp counts, not the clock's)."""
        t = float(sample.timestamp)
        if not math.isfinite(t) or t <= 0:
            return
        previous, self._last = self._last, t
        if self.first is None:
            self.first = t
        self.samples += 1
        dt = _dt(previous, t, self.interval)
        if dt > 0:
            shares = [(gpu, gpu_shares(gpu)) for gpu in sample.gpus]
            for start, seconds in _pieces(t - dt, t, HOUR):
                self._hour_acc(start).add(shares, seconds, self.max_keys)
                self._dirty_hours = True
            horizon = self.clock() - self.keep_minutes * MINUTE
            for start, seconds in _pieces(t - dt, t, MINUTE):
                if start + MINUTE > horizon:
                    self._minute_acc(start).add(shares, seconds, self.max_keys)
                    self._dirty_minutes = True
        if self.autoflush and self.clock() - self._last_flush >= self.flush_every:
            self.flush()

    def merge(self, buckets: Iterable["Bucket | Packed"]) -> None:
        """Add buckets recorded elsewhere for times this recorder did not record (the
        simulator's past), then write."""
        others: Dict[str, List[Bucket | Packed]] = {}
        horizon = self.clock() - self.keep_minutes * MINUTE
        for b in buckets:
            if b.span == MINUTE:
                if b.start + MINUTE <= horizon:
                    continue
                if self._minute is not None and self._minute.start == b.start:
                    self._minute.merge(_unpacked(b), self.max_keys)
                else:
                    self._merge_stored(self._minutes, b)
                self._dirty_minutes = True
            elif b.span == HOUR:
                day = day_of(b.start)
                if day == self._day:
                    if self._hour is not None and self._hour.start == b.start:
                        self._hour.merge(_unpacked(b), self.max_keys)
                    else:
                        self._merge_stored(self._hours, b)
                    self._dirty_hours = True
                else:
                    others.setdefault(day, []).append(b)
        for day, extra in sorted(others.items()):
            if day_start(day) + DAY <= self.clock() - self.keep_days * DAY:
                continue
            stored = {b.start: _Stored(b) for b in self._load(hours_file(day), "hour")}
            for b in extra:
                self._merge_stored(stored, b)
            self._write_hours(day, stored, None)
        self.flush()

    def _merge_stored(self, stored: Dict[float, _Stored], b: "Bucket | Packed") -> None:
        old = stored.get(b.start)
        if old is None:
            stored[b.start] = _Stored(None, b.data) if isinstance(b, Packed) else _Stored(b)
        else:
            acc = _BucketAcc.of(old.bucket, self.max_keys)
            acc.merge(_unpacked(b), self.max_keys)
            stored[b.start] = _Stored(acc.freeze())

    def _hour_acc(self, start: float) -> _BucketAcc:
        acc = self._hour
        if acc is not None and acc.start == start:
            return acc
        if acc is not None:  # the hour is over: it joins its day, which is written now
            self._hours[acc.start] = _Stored(acc.freeze())
            self._write_hours(self._day or day_of(acc.start), self._hours, None)
            self._dirty_hours = False
        day = day_of(start)
        if day != self._day:
            self._day = day
            self._hours = {b.start: _Stored(b) for b in self._load(hours_file(day), "hour")}
            self._prune_days(force=True)
        old = self._hours.pop(start, None)  # a restart within the hour goes on with it
        self._hour = _BucketAcc.of(old.bucket, self.max_keys) if old else _BucketAcc(start, HOUR)
        return self._hour

    def _minute_acc(self, start: float) -> _BucketAcc:
        acc = self._minute
        if acc is not None and acc.start == start:
            return acc
        if acc is not None:
            self._minutes[acc.start] = _Stored(acc.freeze())
        old = self._minutes.pop(start, None)
        self._minute = _BucketAcc.of(old.bucket, self.max_keys) if old else _BucketAcc(start, MINUTE)
        return self._minute

    # ---- output --------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write what changed since the last write (atomically)."""
        self._last_flush = self.clock()
        if self._dirty_hours and self._day is not None:
            self._write_hours(self._day, self._hours, self._hour)
            self._dirty_hours = False
        if self._dirty_minutes:
            horizon = self.clock() - self.keep_minutes * MINUTE
            for start in [s for s in self._minutes if s + MINUTE <= horizon]:
                del self._minutes[start]
            self._write(MINUTES_FILE, _file_text("minute", self._last_flush, self._ordered_minutes()))
            self._dirty_minutes = False
        self._prune_days()

    def _ordered_minutes(self) -> List[str]:
        items: List[Tuple[float, str]] = [(s, st.json()) for s, st in self._minutes.items()]
        if self._minute is not None:
            items.append((self._minute.start, _dumps(bucket_to_json(self._minute.freeze()))))
        items.sort(key=lambda x: x[0])
        return [text for _s, text in items]

    def _write_hours(self, day: str, stored: Dict[float, _Stored], current: Optional[_BucketAcc]) -> None:
        items: List[Tuple[float, str]] = [(s, st.json()) for s, st in stored.items()]
        if current is not None and day_of(current.start) == day:
            items.append((current.start, _dumps(bucket_to_json(current.freeze()))))
        items.sort(key=lambda x: x[0])
        self._write(hours_file(day), _file_text("hour", self.clock(), [text for _s, text in items]))

    def _write(self, name: str, text: str) -> None:
        try:
            # 0644 through the umask, as the files were always created; the directory synced too,
            # so that a power cut after a flush cannot bring the old file back.
            atomic_write(
                os.path.join(self.directory, name),
                text,
                0o644,
                umask=True,
                durable=self.durable,
                sync_directory=self.durable,
            )
            self.writes += 1
        except OSError as exc:  # a full disk must not stop the recorder: it tries again later
            log.error("history: cannot write %s: %s", os.path.join(self.directory, name), exc)

    def _load(self, name: str, resolution: str) -> List[Bucket]:
        """A file's buckets; a bad file is logged and moved aside (it is about to be rewritten)."""
        path = os.path.join(self.directory, name)
        if not os.path.exists(path):
            return []
        try:
            return read_file(path, resolution)
        except FileError as exc:
            log.error("history: skipping %s", exc)
            with contextlib.suppress(OSError):
                os.replace(path, path + ".corrupt")
            return []

    def _prune_days(self, force: bool = False) -> None:
        """Delete day files (and files moved aside) older than keep_days: when a day begins,
        else at most hourly."""
        now = self.clock()
        if not force and now - self._last_prune < HOUR:
            return
        self._last_prune = now
        limit = now - self.keep_days * DAY
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            base = name[: -len(".corrupt")] if name.endswith(".corrupt") else name
            match = _HOURS_RE.match(base)
            if match is None:
                continue
            try:
                old = day_start(match.group(1)) + DAY <= limit
            except ValueError:
                old = True
            if old:
                try:
                    os.unlink(os.path.join(self.directory, name))
                except OSError as exc:
                    log.warning("history: cannot delete %s: %s", name, exc)

    def _clean_temporaries(self) -> None:
        """Temporary files a killed recorder left (never read: the rename did not happen)."""
        try:
            names = os.listdir(self.directory)
        except OSError:
            return
        for name in names:
            if name.startswith(".") and name.endswith(".tmp") and (".hours-" in name or ".minutes" in name):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.directory, name))

    def close(self) -> None:
        """Write everything, let go of the directory."""
        self._dirty_hours = self._dirty_hours or self._hour is not None
        self._dirty_minutes = self._dirty_minutes or self._minute is not None
        self.flush()
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def buckets(self, resolution: str) -> List[Bucket]:
        """What the recorder holds in memory (for tests and the simulator)."""
        if resolution == "minute":
            out = [s.bucket for s in self._minutes.values()]
            if self._minute is not None:
                out.append(self._minute.freeze())
        else:
            out = [s.bucket for s in self._hours.values()]
            if self._hour is not None:
                out.append(self._hour.freeze())
        return sorted(out, key=lambda b: b.start)


# ---- reading -----------------------------------------------------------------------------------


# The most a bucket's JSON grows when it is decoded from a file and encoded again: 4.5 for a
# number ("1e15" is written back as "1000000000000000.0", "5" in a float field as "5.0"), 3 for
# a character (2 to 4 bytes of UTF-8 become one or two 6-byte \u escapes); keys, spacing and
# other escapes only shrink.
_GROWTH = 5


def _overlaps(b: Bucket, since: float, until: float) -> bool:
    return b.start < until and b.start + b.span > since


# The oldest bucket's start per history directory, with the day file and its modification time it
# was read from: a request asks for it every time, and the oldest day file (up to 35 days back,
# 1 MiB on a MIG node) rarely changes, so a long-lived agent reads it once, not per request.
_OLDEST: Dict[str, Tuple[str, int, float]] = {}


def _oldest_start(
    directory: str, days: List[str], load: Callable[[str], Tuple[List[Bucket], int]]
) -> Optional[float]:
    """The start of the oldest bucket kept: in the oldest readable day file."""
    for day in days:
        try:
            mtime = os.stat(os.path.join(directory, hours_file(day))).st_mtime_ns
        except OSError:
            continue
        hit = _OLDEST.get(directory)
        if hit is not None and hit[0] == day and hit[1] == mtime:
            return hit[2]
        bs = load(day)[0]
        if bs:
            _OLDEST[directory] = (day, mtime, bs[0].start)
            return bs[0].start
    return None


def read_history(
    directory: str,
    resolution: str,
    since: float,
    until: float,
    now: Optional[float] = None,
    max_bytes: int = 15 * 1024 * 1024,
) -> History:
    """The buckets of `directory` that overlap [since, until), oldest first.

    Bad files are logged and skipped. At most `max_bytes` of bucket JSON: beyond that the oldest
    buckets are left out and `since` is moved up to the oldest bucket returned."""
    # A week of a node's files parses into hundreds of thousands of containers, held until the
    # reply is sent; each time enough have survived the cyclic collector walks the whole heap
    # again (three quarters of the reading time in a 200-node simulator). JSON trees have no
    # cycles: the collector is off while reading, as it was afterwards.
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _read_history(directory, resolution, since, until, now, max_bytes)
    finally:
        if collecting:
            gc.enable()


def _read_history(
    directory: str, resolution: str, since: float, until: float, now: Optional[float], max_bytes: int
) -> History:
    if not isinstance(resolution, str) or resolution not in RESOLUTIONS:
        raise ValueError("resolution must be 'minute' or 'hour'")
    now = time.time() if now is None else now
    minutes_path = os.path.join(directory, MINUTES_FILE)
    try:
        recording = abs(now - os.stat(minutes_path).st_mtime) <= RECORDING_WITHIN
    except OSError:
        recording = False
    found: List[Bucket] = []
    oldest: Optional[float] = None
    text_bytes = 0  # of the files `found` comes from
    unreadable: List[Tuple[float, float, str]] = []  # (since, until, why), before clipping
    try:
        names = os.listdir(directory)
    except OSError:
        names = []

    def sound(path: str, buckets: List[Bucket]) -> List[Bucket]:
        """The buckets whose figures can be true; the others' time is unreadable, as a bad file's."""
        kept = []
        for b in buckets:
            fault = bucket_fault(b)
            if fault is None:
                kept.append(b)
                continue
            why = "%s: %s: figures that cannot be true: %s" % (path, bucket_when(b), fault)
            log.error("history: skipping %s", why)
            unreadable.append((b.start, b.start + b.span, why))
        return kept

    if resolution == "minute":
        if os.path.exists(minutes_path):
            try:
                kept, text_bytes = _read_file(minutes_path, "minute")
                kept = sound(minutes_path, kept)
            except FileError as exc:
                log.error("history: skipping %s", exc)
                kept = []
                held = _minutes_held(_mtime(minutes_path) or now, now)
                unreadable.append((held[0], held[1], str(exc)))
            oldest = kept[0].start if kept else None
            found = [b for b in kept if _overlaps(b, since, until)]
        unreadable.extend(u for u in _moved_aside(directory, names, now) if u[2].startswith(MINUTES_FILE))
    else:
        days = sorted(m.group(1) for m in (_HOURS_RE.match(n) for n in names) if m)
        loaded: Dict[str, Tuple[List[Bucket], int]] = {}

        def load(day: str) -> Tuple[List[Bucket], int]:
            if day not in loaded:
                path = os.path.join(directory, hours_file(day))
                try:
                    found, size = _read_file(path, "hour")
                    loaded[day] = (sound(path, found), size)
                except FileError as exc:
                    log.error("history: skipping %s", exc)
                    loaded[day] = ([], 0)
                    with contextlib.suppress(ValueError):
                        unreadable.append((day_start(day), day_start(day) + DAY, str(exc)))
            return loaded[day]

        unreadable.extend(u for u in _moved_aside(directory, names, now) if u[2].startswith("hours-"))

        oldest = _oldest_start(directory, days, load)
        for day in reversed(days):  # newest first, so a bound keeps the most recent
            try:
                start = day_start(day)
            except ValueError:
                continue
            if start < until and start + DAY > since:
                bs, size = load(day)
                found.extend(b for b in bs if _overlaps(b, since, until))
                text_bytes += size
    found.sort(key=lambda b: b.start)
    # Bound the reply: newest first until the budget is spent. Buckets written again (compact,
    # ASCII) take at most _GROWTH times their text in the files, so when the files are that
    # much smaller than the budget everything fits and nothing needs measuring.
    kept_from = 0
    if text_bytes * _GROWTH + len(found) > max_bytes:
        budget = max_bytes
        kept_from = len(found)
        for i in range(len(found) - 1, -1, -1):
            budget -= len((bucket_text(found[i]) or _dumps(bucket_to_json(found[i]))).encode("utf-8")) + 1
            if budget < 0:
                break
            kept_from = i
    if kept_from > 0 and found:
        if kept_from >= len(found):
            found, since = [], until
        else:
            found = found[kept_from:]
            since = max(since, found[0].start)
    deduped: List[Bucket] = []
    for b in found:  # a bucket in two files (a day file edited by hand): the first wins
        if not deduped or b.start > deduped[-1].start:
            deduped.append(b)
    holes = [
        Unreadable(max(first, since), min(last, until), why)
        for first, last, why in unreadable
        if max(first, since) < min(last, until)
    ]
    return History(
        resolution=resolution,
        since=since,
        until=until,
        recording=recording,
        oldest=oldest,
        buckets=tuple(deduped),
        unreadable=tuple(sorted(holes, key=lambda u: (u.since, u.until))),
    )


def _mtime(path: str) -> Optional[float]:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _minutes_held(written: float, now: float) -> Tuple[float, float]:
    """The time a minutes file last written at `written` can hold: the minutes kept before it."""
    end = min(written, now)
    return end - KEEP_MINUTES * MINUTE, end + MINUTE


def _moved_aside(directory: str, names: List[str], now: float) -> List[Tuple[float, float, str]]:
    """Time held by files the recorder found unreadable and moved aside (NAME.corrupt): it
    started those files afresh, so what they held is lost, not idle. A day file held its day up
    to its last write; the minutes file the minutes kept before its last write."""
    out: List[Tuple[float, float, str]] = []
    for name in names:
        if not name.endswith(".corrupt"):
            continue
        base = name[: -len(".corrupt")]
        written = _mtime(os.path.join(directory, name))
        if written is None:
            continue
        why = "%s was unreadable; the recorder moved it aside to %s" % (base, name)
        match = _HOURS_RE.match(base)
        if match is not None:
            try:
                start = day_start(match.group(1))
            except ValueError:
                continue
            out.append((start, min(start + DAY, written), why))
        elif base == MINUTES_FILE:
            a, b = _minutes_held(written, now)
            out.append((a, b, why))
    return out


# ---- service mode ------------------------------------------------------------------------------

EXIT_OK = 0
EXIT_FAIL = 1


def run_recorder(
    backend_name: str,
    sim_spec: Optional[str],
    directory: str,
    interval: float = DEFAULT_INTERVAL,
    log_level: str = "WARNING",
    limiter_dir: Optional[str] = None,
) -> int:
    """`gpuops agent --record`: sample the backend every `interval` seconds and record, until
    SIGTERM or SIGINT (then write and exit 0). A second recorder on the same directory, or a
    backend that cannot start, exits 1 with one line on stderr."""
    from gpuops.node.backends.base import BackendError
    from gpuops.node.backends.registry import open_backend
    from gpuops.node.limiter import DEFAULT_DIR
    from gpuops.node.limiter_tags import LimiterTagger
    from gpuops.node.logs import log_to_stderr

    log_to_stderr(log_level)
    if not (isinstance(interval, (int, float)) and MIN_INTERVAL <= interval <= MAX_INTERVAL):
        print(
            "error: --record-interval must lie between %g and %g seconds" % (MIN_INTERVAL, MAX_INTERVAL),
            file=sys.stderr,
        )
        return 2
    try:
        recorder = Recorder(directory, interval=interval)
    except RecorderBusy as exc:
        print("error: %s" % exc, file=sys.stderr)
        return EXIT_FAIL
    except OSError as exc:
        print("error: cannot record into %s: %s" % (directory, exc.strerror or exc), file=sys.stderr)
        return EXIT_FAIL
    backend, reason = open_backend(backend_name, sim_spec)
    if backend is None:
        recorder.close()
        print("error: %s" % reason, file=sys.stderr)
        return EXIT_FAIL
    stopping = []

    def stop(_signum: int, _frame: Any) -> None:
        stopping.append(True)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    log.info("recording into %s every %gs", directory, interval)
    next_tick = time.monotonic()
    failures = 0
    tagger = LimiterTagger(limiter_dir or DEFAULT_DIR)  # history keeps the limiter's tenants too
    try:
        while not stopping:
            try:
                recorder.add(tagger.tag(backend.sample()))
                failures = 0
            except BackendError as exc:
                failures += 1
                if failures == 1 or failures % 60 == 0:
                    log.warning("history: sample failed (%d in a row): %s", failures, exc)
            next_tick += interval
            now = time.monotonic()
            if next_tick < now:
                next_tick = now + interval - ((now - next_tick) % interval)
            while not stopping and time.monotonic() < next_tick:
                time.sleep(min(0.5, max(0.0, next_tick - time.monotonic())))
    finally:
        recorder.close()
        backend.close()
    return EXIT_OK
