"""A sim fleet that lives only as long as the process that started it (`gpuops demo`).

`sim up` detaches its fleet on purpose; the demo's fleet is a throw-away that must not outlive the
demo however the demo ends. Its own cleanup (stop, remove the temporary directory) covers q, ctrl-c,
SIGTERM and SIGHUP; this covers what it cannot: SIGKILL, a crash, a signal arriving while the
fleet starts.

The tie is a pipe, the *lifeline*: the starting process keeps its write end open (and never
writes), the fleet gets the read end (`--lifeline FD`). The kernel closes the write end only when
the whole starting process has ended (its file table goes with its last thread), so end of file on
the read end says, without a race, that nobody is left to stop the fleet or remove its directory:
the fleet stops, and removes the directory itself.

Not PR_SET_PDEATHSIG: that signals the death of the *thread* that forked the fleet. When a
SIGKILLed demo's main thread ended before its other threads, the fleet was handed to a surviving
thread of the still-exiting demo and got its SIGTERM while its parent pid was still the demo's; it
stopped and, its parent apparently alive, left the directory to a demo that would never remove it.
A fleet started from a thread that then ended was stopped under a living demo.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import select
import signal
from collections.abc import Callable
from types import FrameType


class StoppedWhileStarting(SystemExit):
    """Raised by the early SIGTERM handler: unwinds the fleet's start-up so its cleanup runs."""


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise StoppedWhileStarting(128 + signum)


def stop_on_sigterm_while_starting() -> None:
    """Until the fleet's event loop installs its own handler, SIGTERM unwinds start-up as an
    exception rather than killing the process outright, so the directory is still removed."""
    signal.signal(signal.SIGTERM, _exit_on_sigterm)


def lifeline_pair() -> tuple[int, int]:
    """(read end for the fleet, write end to keep open while this process lives); neither is
    inherited by other children (pass the read end explicitly)."""
    return os.pipe()


class Lifeline:
    """The fleet's end of the pipe whose other end only the starting process holds."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._cut = False
        os.set_inheritable(fd, False)  # not the fleet's own children (workers, Prometheus)
        os.set_blocking(fd, False)

    def cut(self, wait: float = 0.0) -> bool:
        """Whether the starting process has ended (end of file), waiting up to `wait` seconds."""
        if not self._cut:
            with contextlib.suppress(OSError):
                ready, _, _ = select.select([self.fd], [], [], wait)
                # Nothing is ever written: readable means end of file (bytes would be ignored).
                if ready and os.read(self.fd, 64) == b"":
                    self._cut = True
        return self._cut

    def watch(self, loop: asyncio.AbstractEventLoop, on_cut: Callable[[], None]) -> None:
        """Call `on_cut` from `loop` once the starting process has ended."""

        def readable() -> None:
            if self.cut():
                loop.remove_reader(self.fd)
                on_cut()

        loop.add_reader(self.fd, readable)

    def unwatch(self, loop: asyncio.AbstractEventLoop) -> None:
        loop.remove_reader(self.fd)
