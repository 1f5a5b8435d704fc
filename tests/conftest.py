"""Fixtures shared by every test directory."""

import os
import signal

from hypothesis import settings

# A run started in the background by a non-interactive shell (`bash .ci/run &`, nohup) has SIGINT
# ignored, and every gpuops process the tests start would inherit that: the tests that stop one
# with Ctrl-C (SIGINT) would wait for a process that never hears it. An ignored signal stays
# ignored across exec, a handler does not: with Python's own handler here, the children start
# with SIGINT at its default, as under a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The real-SSH fixtures (sshd on loopback, hosts in network namespaces): see docs/testing.md.
pytest_plugins = ["tests.sshtest.fixtures"]

# CI (`.ci/run`) explores the same examples on every run, so a submission lands or not on its own
# merits and never on a draw; a developer's `make test` draws new examples each time, which is how
# new failures are found (each one then kept as an `@example`).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("GPUOPS_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["GPUOPS_HYPOTHESIS_PROFILE"])
