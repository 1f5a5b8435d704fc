"""The rich console every command prints its tables with.

Rich sizes its output to the terminal, and to 80 columns when no standard stream is one (output
captured by a script, a cron job, CI). At 80 columns a wide table, such as `gpuops tenants`' twelve,
is cut to `…` in every cell; there, tables get `PIPED_WIDTH` columns instead. `COLUMNS` in the
environment still decides when set, as rich documents.
"""

from __future__ import annotations

import os

from rich.console import Console, ConsoleDimensions

PIPED_WIDTH = 160


def _any_terminal() -> bool:
    for fd in (0, 1, 2):
        try:
            os.get_terminal_size(fd)
        except (AttributeError, ValueError, OSError):
            continue
        return True
    return False


class CliConsole(Console):
    """A rich Console, `PIPED_WIDTH` wide where rich would take 80 for want of a terminal."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        if self._width is None and "COLUMNS" not in self._environ and not _any_terminal():
            return ConsoleDimensions(PIPED_WIDTH, size.height)
        return size

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        self._width, self._height = new_size
