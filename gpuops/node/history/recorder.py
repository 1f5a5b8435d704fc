"""The recorder: samples integrated into minute and hour buckets (rollup.py) and kept in a
directory (files.py).

`Recorder` takes `NodeSample`s (the sample's own timestamp counts). It writes atomically
(temporary file, fsync, rename, fsync of the directory) at least every `flush_every` seconds and
when an hour ends; day files older than `keep_days` are deleted. A crash loses at most what came
after the last write; a file is always either the old one or the new one. A file that cannot be
read (garbage, a foreign format) is logged and skipped; the recorder moves it aside to
`NAME.corrupt` before it writes that file again. One recorder per directory
(`DIR/recorder.lock`, flock).

Standard library only; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import math
import os
import time
import zlib
from typing import Callable, Dict, Iterable, List, Optional, TextIO, Tuple

from gpuops.core.atomic_file import atomic_write
from gpuops.core.history import HOUR, MAX_KEYS, MINUTE, Bucket, bucket_from_json, bucket_to_json, gpu_shares
from gpuops.core.model import NodeSample
from gpuops.node.history.files import (
    DAY,
    FLUSH_EVERY,
    KEEP_DAYS,
    KEEP_MINUTES,
    MINUTES_FILE,
    FileError,
    day_of,
    day_start,
    dumps,
    file_text,
    hours_day,
    hours_file,
    read_file,
)
from gpuops.node.history.rollup import Packed, _BucketAcc, _dt, _pieces

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger("gpuops.history")

LOCK_FILE = "recorder.lock"
DEFAULT_INTERVAL = 10.0  # seconds between samples in service mode


class _Stored:
    """A finished bucket, kept as compressed JSON text: a node keeps 120 minutes and a day of
    hours in memory (the simulator a thousand nodes' worth), and writes them as text."""

    __slots__ = ("_data",)

    def __init__(self, bucket: Optional[Bucket], data: bytes = b"") -> None:
        self._data = (
            zlib.compress(dumps(bucket_to_json(bucket)).encode("utf-8"), 1) if bucket is not None else data
        )

    def json(self) -> str:
        return zlib.decompress(self._data).decode("utf-8")

    @property
    def bucket(self) -> Bucket:
        return bucket_from_json(json.loads(self.json()))


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
            self._write(MINUTES_FILE, file_text("minute", self._last_flush, self._ordered_minutes()))
            self._dirty_minutes = False
        self._prune_days()

    def _ordered_minutes(self) -> List[str]:
        items: List[Tuple[float, str]] = [(s, st.json()) for s, st in self._minutes.items()]
        if self._minute is not None:
            items.append((self._minute.start, dumps(bucket_to_json(self._minute.freeze()))))
        items.sort(key=lambda x: x[0])
        return [text for _s, text in items]

    def _write_hours(self, day: str, stored: Dict[float, _Stored], current: Optional[_BucketAcc]) -> None:
        items: List[Tuple[float, str]] = [(s, st.json()) for s, st in stored.items()]
        if current is not None and day_of(current.start) == day:
            items.append((current.start, dumps(bucket_to_json(current.freeze()))))
        items.sort(key=lambda x: x[0])
        self._write(hours_file(day), file_text("hour", self.clock(), [text for _s, text in items]))

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
            day = hours_day(base)
            if day is None:
                continue
            try:
                old = day_start(day) + DAY <= limit
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
