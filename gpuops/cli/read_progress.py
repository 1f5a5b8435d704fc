"""A progress bar for the CLI's long reads (history from every node), on stderr and only when
stderr is a terminal: scripts reading stdout or stderr through a pipe get nothing extra."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Done = Callable[[str, Any], None]


def _ignore(_name: str, _result: Any) -> None:
    return None


@contextmanager
def read_progress(total: int, what: str) -> Iterator[Done]:
    """A callback to tell of each node read; a transient bar counts them while the block runs."""
    if total <= 0 or not sys.stderr.isatty():
        yield _ignore
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=sys.stderr, highlight=False)
    # transient: the bar goes once the read is done, so the report that follows stands alone
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("nodes"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(what, total=total)

        def done(_name: str, _result: Any) -> None:
            bar.advance(task)

        yield done
