"""What a node keeps on disk between agent sessions: the apply lock and the MIG journal.

- The **node lock** (`apply.lock`, flock): one apply at a time per node, whoever runs it. The
  kernel drops an flock when its holder dies, so a crashed apply never leaves a stale lock;
  the file's text only says who holds it, for the message another apply gets.
- The **journal**: before a GPU's layout changes, its old and new layouts are written (atomically)
  to `mig-<uuid>.json`, and removed once the change is done or undone. An agent that finds one
  at start-up (the previous agent was killed mid-change) puts that GPU back in its old layout,
  unless it already has the new one: a GPU ends in one layout or the other, never between.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from typing import Any, Dict, List, Optional, TextIO

try:
    import fcntl
except ImportError:  # pragma: no cover - not on Linux
    fcntl = None  # type: ignore[assignment]


def default_state_dir() -> str:
    """$GPUOPS_STATE_DIR, else /var/lib/gpuops for root, else ~/.local/state/gpuops."""
    explicit = os.environ.get("GPUOPS_STATE_DIR")
    if explicit:
        return explicit
    if os.geteuid() == 0:
        return "/var/lib/gpuops"
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(base, "gpuops")


class LockBusy(Exception):
    """Another apply holds the node lock; the message says who."""


class NodeState:
    def __init__(self, directory: str) -> None:
        self.directory = directory

    def _ensure(self) -> None:
        os.makedirs(self.directory, mode=0o700, exist_ok=True)

    # ---- the node lock -----------------------------------------------------------------------

    def lock(self, holder: str) -> TextIO:
        """Take the node lock (non-blocking); returns the open file that holds it."""
        self._ensure()
        path = os.path.join(self.directory, "apply.lock")
        f = open(path, "a+")  # noqa: SIM115 (held open: the open file is the lock)
        if fcntl is not None:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                f.seek(0)
                who = f.read(200).strip() or "another process"
                f.close()
                if exc.errno in (errno.EAGAIN, errno.EACCES):
                    raise LockBusy("another apply holds this node's lock (%s)" % who) from None
                raise
        f.seek(0)
        f.truncate()
        f.write("%s, pid %d, since %s\n" % (holder, os.getpid(), time.strftime("%Y-%m-%d %H:%M:%S")))
        f.flush()
        return f

    @staticmethod
    def unlock(f: TextIO) -> None:
        f.close()  # closing drops the flock

    # ---- the journal -------------------------------------------------------------------------

    def _journal_path(self, uuid: str) -> str:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in uuid)[:100]
        return os.path.join(self.directory, "mig-%s.json" % safe)

    def begin(self, uuid: str, index: int, old: Dict[str, Any], new: Dict[str, Any]) -> None:
        self._ensure()
        record = {
            "uuid": uuid,
            "index": index,
            "old": old,
            "new": new,
            "pid": os.getpid(),
            "time": time.time(),
        }
        path = self._journal_path(uuid)
        partial = "%s.%d.partial" % (path, os.getpid())
        with open(partial, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(partial, path)

    def end(self, uuid: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._journal_path(uuid))

    def pending(self) -> List[Dict[str, Any]]:
        """Journal records left by an agent that died mid-change (unreadable ones are skipped)."""
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return []
        records = []
        for name in names:
            if name.startswith("mig-") and name.endswith(".json"):
                record = self._read(os.path.join(self.directory, name))
                if record is not None:
                    records.append(record)
        return records

    @staticmethod
    def _read(path: str) -> Optional[Dict[str, Any]]:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError):
            return None
        ok = (
            isinstance(data, dict)
            and isinstance(data.get("uuid"), str)
            and isinstance(data.get("index"), int)
        )
        return data if ok else None
