"""A sim fleet that lives only as long as the process that started it (`gpuops demo`).

`sim up` detaches its fleet on purpose; the demo's fleet is a throw-away that must not outlive the
demo however the demo ends. Its own cleanup (stop, remove the temporary directory) covers q, ctrl-c,
SIGTERM and SIGHUP; this covers what it cannot: SIGKILL, a crash, a signal arriving while the
fleet starts. The fleet asks the kernel for SIGTERM when its parent dies (Linux's
PR_SET_PDEATHSIG), stops as on any SIGTERM, and then removes its own directory, since nobody
else is left to.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from types import FrameType

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


class ParentGone(SystemExit):
    """Raised by the early SIGTERM handler: unwinds the fleet's start-up so its cleanup runs."""


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise ParentGone(128 + signum)


def tie_to_parent(parent: int) -> bool:
    """Get SIGTERM when `parent` dies; False when it is already gone (nothing to serve).

    Until the fleet's event loop installs its own handler, SIGTERM unwinds start-up as an
    exception rather than killing the process outright, so the directory is still removed.
    """
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"prctl(PR_SET_PDEATHSIG): {os.strerror(err)}")
    # The parent may have died before the request: the kernel will not signal that death.
    return os.getppid() == parent


def parent_gone(parent: int) -> bool:
    """Whether `parent` has died (an orphan is re-parented to init or a subreaper)."""
    return os.getppid() != parent
