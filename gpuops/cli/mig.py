from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Commands of this group are added by their own change."""
