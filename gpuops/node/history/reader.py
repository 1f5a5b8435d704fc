"""Reading a history directory: `read_history(dir, resolution, since, until)` answers the
agent's `history` request.

The time an unreadable file (or one moved aside) held is said in `History.unreadable`: unknown,
not idle; so is a bucket whose figures cannot be true (`core.history.bucket_fault`: a busy time
past the time sampled, more memory than the GPU has...), which is left out of the reply. Buckets
read from files in the line layout keep their text (files.py `bucket_text`): the agent sends it
as it is.

Standard library only; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import time
from typing import Callable, Dict, List, Optional, Tuple

from gpuops.core.history import (
    MINUTE,
    RESOLUTIONS,
    Bucket,
    History,
    Unreadable,
    bucket_fault,
    bucket_to_json,
    bucket_when,
)
from gpuops.node.history.files import (
    DAY,
    KEEP_MINUTES,
    MINUTES_FILE,
    RECORDING_WITHIN,
    FileError,
    bucket_text,
    day_start,
    dumps,
    hours_day,
    hours_file,
    read_buckets,
)

log = logging.getLogger("gpuops.history")


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
                kept, text_bytes = read_buckets(minutes_path, "minute")
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
        days = sorted(d for d in (hours_day(n) for n in names) if d is not None)
        loaded: Dict[str, Tuple[List[Bucket], int]] = {}

        def load(day: str) -> Tuple[List[Bucket], int]:
            if day not in loaded:
                path = os.path.join(directory, hours_file(day))
                try:
                    found, size = read_buckets(path, "hour")
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
            budget -= len((bucket_text(found[i]) or dumps(bucket_to_json(found[i]))).encode("utf-8")) + 1
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
        day = hours_day(base)
        if day is not None:
            try:
                start = day_start(day)
            except ValueError:
                continue
            out.append((start, min(start + DAY, written), why))
        elif base == MINUTES_FILE:
            a, b = _minutes_held(written, now)
            out.append((a, b, why))
    return out
