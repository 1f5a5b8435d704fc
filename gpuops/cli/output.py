"""Standard output that delivers every byte printed to it, or ends the command saying why not.

A write(2) to a pipe may take fewer bytes than it was given: when it is interrupted, and when the
pipe was left non-blocking by another process sharing it. The first is what cut `discover --json`
short: after uvloop closes its loop (`gpuops.fleet.ssh.run`), the next write that has to wait for a
slow reader comes back with only what fit in the pipe, as an interrupted write does, with no
signal to see. Python's buffered stdout writes the rest; its unbuffered one (PYTHONUNBUFFERED=1,
`python -u`) drops it without a word and the command exits 0.

`install()` puts sys.stdout on a writer that loops until every byte is written, waits for the pipe
when it is non-blocking, and turns a failed write into `OutputError` so that main() can print one
line and exit 1. A reader that goes away (`| head`) gives BrokenPipeError: typer ends the command
quietly with exit 1, as click does.
"""

from __future__ import annotations

import contextlib
import io
import os
import select
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer


class OutputError(OSError):
    """Writing to standard output failed for a reason other than the reader leaving."""


class WholeWriter(io.RawIOBase):
    """A raw stream over a file descriptor whose write() writes all it is given, or raises."""

    def __init__(self, fd: int, name: str) -> None:
        super().__init__()
        self._fd = fd
        self.name = name

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: ReadableBuffer) -> int:
        view = memoryview(data).cast("B")
        total = len(view)
        while view:
            try:
                written = os.write(self._fd, view)
            except BlockingIOError:
                # Someone sharing the pipe made it non-blocking: wait as a blocking write would.
                select.select([], [self._fd], [])
                continue
            except BrokenPipeError:
                raise
            except OSError as exc:
                raise OutputError(exc.errno, f"cannot write to {self.name}: {exc.strerror}") from exc
            view = view[written:]
        return total


def install() -> None:
    """Put sys.stdout on a WholeWriter, keeping its encoding and its buffering (none under -u)."""
    stream = sys.stdout
    if not isinstance(stream, io.TextIOWrapper):
        return  # captured by a test runner, or replaced by whoever embeds us: theirs to keep
    try:
        fd = stream.fileno()
    except (OSError, ValueError):
        return
    stream.flush()
    raw = WholeWriter(fd, "standard output")
    binary: io.RawIOBase | io.BufferedWriter = (
        raw if isinstance(stream.buffer, io.RawIOBase) else io.BufferedWriter(raw)
    )
    sys.stdout = io.TextIOWrapper(
        binary,
        encoding=stream.encoding,
        errors=stream.errors,
        line_buffering=stream.line_buffering,
        write_through=stream.write_through,
    )


def give_up(exc: OSError) -> None:
    """Say once, on stderr, why the output stopped (nothing when the reader left, as typer does);
    later flushes (at exit) go nowhere."""
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - kept open until the process exits
    if isinstance(exc, BrokenPipeError):
        return
    with contextlib.suppress(OSError):  # stderr gone too: the exit code is all that is left
        os.write(2, f"error: {exc.strerror}\n".encode(errors="replace"))
