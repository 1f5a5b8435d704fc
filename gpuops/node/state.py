"""What a node keeps on disk between agent sessions: the apply lock and the MIG journal.

- The **node lock** (`apply.lock`, flock): one apply at a time per node, whoever runs it. The
  kernel drops an flock when its holder dies, so a crashed apply never leaves a stale lock;
  the file's text only says who holds it, for the message another apply gets.
- The **journal**: before a GPU's layout changes, its old and new layouts are written (atomically)
  to `mig-<uuid>.json` (`partition-<uuid>.json` for partition modes, node/partition_apply.py),
  and removed once the change is done or undone. One left behind means an
  apply was interrupted (its agent killed mid-change). Only the next apply resolves it, after
  checking it (node/mig_apply.py `recover`); read-only sessions only report it
  (`interrupted_applies`), as Terraform leaves a stale state lock to the next write command.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import time
from typing import Any, Dict, List, Optional, TextIO, Tuple

from gpuops.core.atomic_file import atomic_write

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


MAX_JOURNAL_BYTES = 1024 * 1024  # a journal is two layouts: anything bigger is not one
MIG, PARTITION = "mig", "partition"  # the journals' kinds: their files' prefixes


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

    def journal_path(self, uuid: str, kind: str = MIG) -> str:
        """Where the journal of this GPU is kept."""
        return self._journal_path(uuid, kind)

    def _journal_path(self, uuid: str, kind: str = MIG) -> str:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in uuid)[:100]
        return os.path.join(self.directory, "%s-%s.json" % (kind, safe))

    def begin(self, uuid: str, index: int, old: Dict[str, Any], new: Dict[str, Any], kind: str = MIG) -> None:
        self._ensure()
        record = {
            "uuid": uuid,
            "index": index,
            "old": old,
            "new": new,
            "pid": os.getpid(),
            "time": time.time(),
        }
        path = self._journal_path(uuid, kind)
        atomic_write(path, json.dumps(record), 0o666, umask=True)

    def end(self, uuid: str, kind: str = MIG) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._journal_path(uuid, kind))

    def pending(self) -> List[Dict[str, Any]]:
        """Well-formed journal records left by an agent that died mid-change."""
        return [record for _path, record, problem in self.journals() if record is not None and not problem]

    def journals(self, kind: str = MIG) -> List[Tuple[str, Optional[Dict[str, Any]], str]]:
        """Every journal file of `kind`: (path, its record or None, "" or what is wrong with it).
        A record comes with a problem when it names a GPU but is malformed otherwise."""
        try:
            names = sorted(os.listdir(self.directory))
        except OSError:
            return []
        out = []
        for name in names:
            if name.startswith(kind + "-") and name.endswith(".json"):
                path = os.path.join(self.directory, name)
                record, problem = self._read(path)
                out.append((path, record, problem))
        return out

    @staticmethod
    def _read(path: str) -> Tuple[Optional[Dict[str, Any]], str]:
        try:
            if os.path.getsize(path) > MAX_JOURNAL_BYTES:
                return None, "larger than a journal is"
            with open(path) as f:
                data = json.load(f)
        except OSError as exc:
            return None, "cannot be read (%s)" % (exc.strerror or exc)
        except (ValueError, RecursionError):
            return None, "not JSON"
        if not isinstance(data, dict):
            return None, "not a journal (expected an object)"
        uuid, index = data.get("uuid"), data.get("index")
        if not isinstance(uuid, str) or not uuid:
            return None, "'uuid': expected the GPU's UUID"
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            return data, "'index': expected a GPU index"
        for key in ("old", "new"):
            if not isinstance(data.get(key), dict):
                return data, "%r: expected a layout" % key
        return data, ""


def interrupted_applies(directory: str) -> List[str]:
    """One line per journal in the state directory, for read-only sessions: what was interrupted
    and that only an apply resolves it. Nothing is changed."""
    lines = []
    state = NodeState(directory)
    for path, record, problem in state.journals(MIG) + state.journals(PARTITION):
        if record is not None and not problem:
            lines.append(
                "interrupted apply on GPU %d (%s), journal %s: run `gpuops apply` to roll it back or "
                "finish it" % (record["index"], record["uuid"], path)
            )
        else:
            lines.append(
                "interrupted-apply journal %s: %s; `gpuops apply` leaves its GPU alone until it is "
                "checked and the journal removed" % (path, problem)
            )
    return lines
