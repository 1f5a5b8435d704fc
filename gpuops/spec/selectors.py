"""Node selectors and GPU index sets, as written in fleet.yaml and on the command line.

A node selector is a comma-separated list of terms:

- ``gpu-a-*``: a node-name glob (``*``, ``?``, ``[0-3]``); several name terms mean *any of them*;
- ``zone=a`` / ``zone!=a``: a label equals (or does not equal) a value; the value may be a glob
  (``zone=eu-*``); several label terms must *all* hold;
- ``*``: every node.

Name terms and label terms combine with AND: ``gpu-a-01,gpu-a-02,zone=a`` selects those of the
two nodes that are in zone a.

A GPU index set is ``3``, ``0-3``, ``4,5`` or ``0-1,6`` (0 to MAX_GPU_INDEX), each GPU at most
once.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Mapping

MAX_GPU_INDEX = 255

_GLOB_RE = re.compile(r"^[A-Za-z0-9_.*?\[\]!-]+\Z")
_LABEL_KEY_RE = re.compile(
    r"^(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9](?:[A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$"
)
_LABEL_VALUE_GLOB_RE = re.compile(r"^[A-Za-z0-9_.*?\[\]!-]*\Z")


class SelectorError(ValueError):
    """A selector or index set that cannot be read; the message says why."""


@dataclass(frozen=True)
class LabelTerm:
    key: str
    value: str
    negate: bool = False

    def matches(self, labels: Mapping[str, str]) -> bool:
        actual = labels.get(self.key)
        hit = actual is not None and fnmatchcase(actual, self.value)
        return not hit if self.negate else hit

    def __str__(self) -> str:
        return f"{self.key}{'!=' if self.negate else '='}{self.value}"


@dataclass(frozen=True)
class Selector:
    """A parsed node selector; `matches(name, labels)` says whether a node is selected."""

    names: tuple[str, ...] = ()
    labels: tuple[LabelTerm, ...] = ()

    def matches(self, name: str, labels: Mapping[str, str]) -> bool:
        if self.names and not any(fnmatchcase(name, glob) for glob in self.names):
            return False
        return all(term.matches(labels) for term in self.labels)

    def __str__(self) -> str:
        return ",".join([*self.names, *(str(t) for t in self.labels)])


def parse_selector(text: str) -> Selector:
    """'gpu-a-*,zone=a' -> Selector(names=('gpu-a-*',), labels=(LabelTerm('zone', 'a'),))."""
    if not isinstance(text, str):
        raise SelectorError(f"a selector is text, not {type(text).__name__}")
    if not text.strip():
        raise SelectorError("empty selector (use '*' for every node)")
    names: list[str] = []
    labels: list[LabelTerm] = []
    for raw in text.split(","):
        term = raw.strip()
        if not term:
            raise SelectorError(f"empty term in selector {text!r}")
        if "=" in term:
            key, sep, value = term.partition("!=") if "!=" in term else term.partition("=")
            key, value = key.strip(), value.strip()
            if not _LABEL_KEY_RE.match(key):
                raise SelectorError(f"{key!r} is not a label name (in {term!r})")
            if "=" in value or not _LABEL_VALUE_GLOB_RE.match(value):
                raise SelectorError(f"{value!r} is not a label value (in {term!r})")
            labels.append(LabelTerm(key, value, negate=sep == "!="))
        elif _GLOB_RE.match(term) and not term.startswith("-"):
            names.append(term)
        else:
            raise SelectorError(f"{term!r} is neither a node-name glob nor label=value")
    if names == ["*"] and not labels:
        return Selector()
    return Selector(tuple(names), tuple(labels))


def parse_gpu_indices(text: str | int) -> frozenset[int]:
    """'0-3' -> {0, 1, 2, 3}; '4,5' -> {4, 5}; 7 -> {7}. Raises SelectorError."""
    if isinstance(text, bool):
        raise SelectorError("GPU indices are numbers, not true/false")
    if isinstance(text, int):
        text = str(text)
    if not text.strip():
        raise SelectorError("no GPU indices given")
    found: set[int] = set()
    for raw in text.split(","):
        part = raw.strip()
        match = re.fullmatch(r"(\d{1,6})(?:\s*-\s*(\d{1,6}))?", part)
        if not match:
            raise SelectorError(f"{part!r} is not a GPU index or range such as 0-3")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if low > high:
            raise SelectorError(f"range {part!r} runs backwards (write {high}-{low})")
        if high > MAX_GPU_INDEX:
            raise SelectorError(f"GPU index {high} is out of range (0 to {MAX_GPU_INDEX})")
        span = set(range(low, high + 1))
        if twice := span & found:
            raise SelectorError(f"GPU {min(twice)} is listed twice in {text!r}")
        found |= span
    return frozenset(found)


def format_gpu_indices(indices: frozenset[int] | set[int]) -> str:
    """{0, 1, 2, 3, 6} -> '0-3,6'."""
    out: list[str] = []
    ordered = sorted(indices)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)
