"""The history directory's files: their names, what they keep, their layout, reading one.

- `DIR/hours-YYYYMMDD.json`: the hour buckets of one UTC day, kept `KEEP_DAYS` (35) days;
- `DIR/minutes.json`: the minute buckets of the last `KEEP_MINUTES` (120) minutes;
- `DIR/NAME.corrupt`: a file the recorder found unreadable and moved aside.

A file is one JSON document (`file_text`): its head (format, version, resolution, when written),
then its buckets one per line, so a reader that slices the lines (`read_buckets`) gives each
bucket's text back without encoding it again (`bucket_text`); any JSON reader reads it whole.
Both the recorder (recorder.py) and the agent's reader (reader.py) depend on what is here.

Standard library only; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import functools
import json
import os
import re
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

from gpuops.core.history import (
    RESOLUTIONS,
    Bucket,
    bucket_from_json,
    keep_only_text,
)

FORMAT = "gpuops-history"
FILE_VERSION = 1
MINUTES_FILE = "minutes.json"
FLUSH_EVERY = 60.0  # seconds between the recorder's writes, at most
KEEP_DAYS = 35  # hour buckets, in day files
KEEP_MINUTES = 120  # minute buckets
# `History.recording`: minutes.json was written within this many seconds (3 flush intervals).
RECORDING_WITHIN = 3 * FLUSH_EVERY
MAX_FILE_BYTES = 64 * 1024 * 1024  # a bigger file is not ours: skipped
DAY = 86400.0

_HOURS_RE = re.compile(r"^hours-(\d{8})\.json\Z")


def hours_file(day: str) -> str:
    return "hours-%s.json" % day


def hours_day(name: str) -> Optional[str]:
    """The YYYYMMDD day of a day file's name; None for any other name."""
    match = _HOURS_RE.match(name)
    return match.group(1) if match is not None else None


def day_of(t: float) -> str:
    """The UTC day of a time, as YYYYMMDD."""
    return time.strftime("%Y%m%d", time.gmtime(t))


@functools.lru_cache(maxsize=1024)  # a reply names each day file's day once per bucket
def day_start(day: str) -> float:
    """Seconds since 1970 at 00:00 UTC of a YYYYMMDD day."""
    import calendar

    return float(calendar.timegm(time.strptime(day, "%Y%m%d")))


def dumps(data: Any) -> str:
    """Compact JSON, as the files hold it."""
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


class FileError(ValueError):
    """A history file that cannot be used; the message says which and why."""


def read_file(path: str, resolution: str) -> List[Bucket]:
    """The buckets of one history file; FileError when it is not a valid one."""
    return read_buckets(path, resolution)[0]


def read_buckets(path: str, resolution: str) -> Tuple[List[Bucket], int]:
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


def file_text(resolution: str, written: float, texts: Iterable[str]) -> str:
    """A history file: one JSON document, its buckets one per line (a reader that slices the
    lines gives each bucket's text back without encoding it again; any JSON reader reads it)."""
    head = dumps({"format": FORMAT, "version": FILE_VERSION, "resolution": resolution, "written": written})
    body = ",\n".join(texts)
    return head[:-1] + _BUCKETS_OPEN + "\n" + body + ("\n" if body else "") + "]}\n"


def _bucket_lines(text: str) -> Optional[List[str]]:
    """[head, bucket text, ...] of a file file_text wrote; None for any other layout (files of
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
