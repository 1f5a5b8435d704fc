"""k9s' `/` filter of the tables: a case-insensitive regular expression, `!` inverts it."""

from __future__ import annotations

import re
from dataclasses import dataclass


class FilterError(ValueError):
    """A filter that is not a valid regular expression; the message says why."""


@dataclass(frozen=True)
class Filter:
    """k9s' `/` filter: a case-insensitive regular expression; `!` in front inverts it."""

    text: str
    pattern: re.Pattern[str]
    inverse: bool = False

    def matches(self, text: str) -> bool:
        return (self.pattern.search(text) is not None) != self.inverse


def parse_filter(text: str) -> Filter | None:
    """'' -> no filter; 'vision|chat' -> rows matching; '!idle' -> rows not matching."""
    raw = text.strip()
    inverse = raw.startswith("!")
    body = raw[1:] if inverse else raw
    if not body:
        return None
    try:
        pattern = re.compile(body, re.IGNORECASE)
    except re.error as exc:
        raise FilterError(f"not a regular expression: {exc}") from None
    return Filter(raw, pattern, inverse)
