"""One-line errors with exit codes: the CLI never shows a traceback for bad input."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

_stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def fail(message: str, code: int = 1) -> NoReturn:
    _stderr.print(f"[bold red]error:[/] {message}", markup=True)
    raise typer.Exit(code)
