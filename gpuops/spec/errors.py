"""Located errors of fleet.yaml: every mistake is one line `file:line:column: path: message; hint`."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Sequence, Union

PathElem = Union[str, int]
DataPath = tuple[PathElem, ...]

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*\Z")
_MAX_SHOWN = 60


@dataclass(frozen=True, order=True)
class SpecIssue:
    """One mistake. `line` and `column` are 1-based; 0 means "the whole file" (unreadable, no
    position known). `path` is the field as the user reads it (``nodes[3].port``), '' for the file
    itself. `hint` says how to fix it, when there is something useful to say."""

    file: str
    line: int
    column: int
    path: str
    message: str
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}" if self.line > 0 else self.file
        text = f"{where}: {self.path}: {self.message}" if self.path else f"{where}: {self.message}"
        return printable(f"{text}; {self.hint}" if self.hint else text)

    def sort_key(self) -> tuple[str, bool, int, int, str, str]:
        return (self.file, self.line == 0, self.line, self.column, self.path, self.message)

    def to_json(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "line": self.line,
            "column": self.column,
            "path": self.path,
            "message": self.message,
            "hint": self.hint,
        }


class SpecError(Exception):
    """fleet.yaml could not be loaded. `errors` holds every mistake found, sorted by location;
    `str()` gives them one per line."""

    def __init__(self, errors: Sequence[SpecIssue]) -> None:
        unique = sorted(set(errors), key=SpecIssue.sort_key)
        self.errors: list[SpecIssue] = unique
        super().__init__("\n".join(str(e) for e in unique))

    def __str__(self) -> str:
        return "\n".join(str(e) for e in self.errors)


class FieldProblem(ValueError):
    """Raised by the field validators; the loader turns it into a located `SpecIssue`."""

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def format_path(path: Sequence[PathElem]) -> str:
    """('nodes', 3, 'port') -> 'nodes[3].port'; keys that are not identifiers are quoted:
    ('nodes', 0, 'labels', 'k8s.io/zone') -> 'nodes[0].labels["k8s.io/zone"]'."""
    out = ""
    for elem in path:
        if isinstance(elem, int):
            out += f"[{elem}]"
        elif _IDENT_RE.match(elem):
            out += f".{elem}" if out else elem
        else:
            out += f"[{json.dumps(elem)}]"
    return out


def printable(text: str) -> str:
    """Control and other non-printable characters escaped, so a file cannot drive the terminal."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


def show(value: object) -> str:
    """A value as the user wrote it, short and safe to print (no control characters)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        text = repr(value)
        return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
    if isinstance(value, str):
        text = value if len(value) <= _MAX_SHOWN else value[: _MAX_SHOWN - 3] + "..."
        return repr(text)
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return "a " + type(value).__name__
