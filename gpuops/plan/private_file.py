"""Writing files that only their owner may read (saved plans, proposals, fleet.yaml backups).

They name hosts, users, process ids and the layout of every GPU, so they are made 0600 the way
OpenSSH makes its private files: the file is created with that mode (no moment where another user
could open it), written in full under a temporary name in the same directory, then renamed over the
target, so a reader sees the old file or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

PRIVATE = 0o600


def write_private(path: Path, data: str | bytes, mode: int = PRIVATE) -> None:
    """Replace `path` with `data` atomically. `mode` is applied before the rename (0600 unless the
    caller keeps an existing file's own mode); raises OSError."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    # mkstemp creates the file O_EXCL with mode 0600, whatever the umask.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            if mode != PRIVATE:
                os.fchmod(f.fileno(), mode)
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
