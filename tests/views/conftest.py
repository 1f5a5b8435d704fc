"""The view models are tested on the TUI tests' simulated silos fleet, on the same fixed clock."""

from tests.tui.conftest import clock, source, utc  # noqa: F401  (fixtures shared with tests/tui)
