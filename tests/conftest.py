"""Fixtures shared by every test directory."""

import os

from hypothesis import settings

# The real-SSH fixtures (sshd on loopback, hosts in network namespaces): see docs/testing.md.
pytest_plugins = ["tests.sshtest.fixtures"]

# CI (`.ci/run`) explores the same examples on every run, so a submission lands or not on its own
# merits and never on a draw; a developer's `make test` draws new examples each time, which is how
# new failures are found (each one then kept as an `@example`).
settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("GPUOPS_HYPOTHESIS_PROFILE"):
    settings.load_profile(os.environ["GPUOPS_HYPOTHESIS_PROFILE"])
