"""Fixtures shared by every test directory."""

import os
import signal

import pytest
from hypothesis import settings

# A run started in the background by a non-interactive shell (`bash .ci/run &`, nohup) has SIGINT
# ignored, and every gpuops process the tests start would inherit that: the tests that stop one
# with Ctrl-C (SIGINT) would wait for a process that never hears it. An ignored signal stays
# ignored across exec, a handler does not: with Python's own handler here, the children start
# with SIGINT at its default, as under a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# pytest-xdist's workers (make test runs in parallel) start with COLUMNS=80 and LINES=24 in their
# environment, which a plain run does not have: every gpuops the tests start would lay its tables
# out for 80 columns. The workers run the tests as the plain run does.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)

# The real-SSH fixtures (sshd on loopback, hosts in network namespaces): see docs/testing.md.
pytest_plugins = ["tests.sshtest.fixtures"]

# CI (`.ci/run`) explores the same examples on every run, so a submission lands or not on its own
# merits and never on a draw; a developer's `make test` draws new examples each time, which is how
# new failures are found (each one then kept as an `@example`).
settings.register_profile("ci", derandomize=True, database=None)
# `make test-deep`: the longer search (tests/hypothesis_budget.py scales each test's count by 4).
settings.register_profile("deep")
if os.environ.get("GPUOPS_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["GPUOPS_HYPOTHESIS_PROFILE"])


# Module-scoped fixtures that start nothing to share, only check what this worker left behind
# at the module's end: they hold a module's tests together for no gain (the two bootstrap tests,
# ~3 minutes each, ran one after the other on one worker for the SSH leak check).
_PER_WORKER_CHECKS = frozenset({"sshtest_leak_check"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup` (make test), the tests of a module that uses a module-scoped
    fixture (a simulated fleet, a Prometheus) run on one worker, so the fixture starts once; every
    other test goes to whichever worker is free. Runs before xdist reads the groups."""
    # The longest first (marked slow: bootstrap playbooks, tests that wait for a wall-clock
    # minute): the rest fills the cores around them instead of leaving them for the end.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    for item in items:
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        if any(
            defs and defs[-1].scope == "module" and name not in _PER_WORKER_CHECKS
            for name, defs in info.name2fixturedefs.items()
        ):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::", 1)[0]))
