"""Writing a benchmark's figures into docs/benchmarks.md, each between its own markers."""

from __future__ import annotations

import platform
import time
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = (
    "# Benchmarks\n\nFigures written by the scripts under `bench/`; each section says how to run it again.\n"
)


def machine() -> str:
    import os

    return f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}"


def write_section(name: str, body: str, where: str | None = None) -> None:
    """Replace (or append) the section between `<!-- NAME:begin -->` and `<!-- NAME:end -->`;
    where names the machine that measured when it is not this one (figures from a GPU machine)."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    text = DOC.read_text(encoding="utf-8") if DOC.exists() else HEADER
    stamp = time.strftime("%Y-%m-%d")
    block = f"{begin}\n{body.rstrip()}\n\n_Recorded {stamp} on {where or machine()}._\n{end}"
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        _, tail = rest.split(end, 1)
        text = head + block + tail
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text(text, encoding="utf-8")
