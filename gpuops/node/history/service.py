"""The recorder as a service, `gpuops agent --record`: sample the backend forever at an
interval and record (recorder.py) until SIGTERM or SIGINT.

Standard library only; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from typing import Any, Optional

from gpuops.node.history.recorder import DEFAULT_INTERVAL, Recorder, RecorderBusy

log = logging.getLogger("gpuops.history")

MIN_INTERVAL = 0.05
MAX_INTERVAL = 60.0  # a recorder writes on a sample: at most every minute keeps `recording` true
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
