"""Text from nodes made safe to show: control characters escaped, visibly.

A node's agent, its stderr, its sshd and its processes' command lines are not the operator's:
an ESC in a reason can clear the operator's screen, set the terminal's title or forge a line
of a table, and a bidi override can make text read backwards. Everything a node sends passes
through `printable` (or `printable_data` for a parsed message) where it enters the operator's
process, so no screen, table or log has to remember to.

Escaped, not stripped: `\\x1b[2J` shows what the node sent. Escaped are the C0 controls
(newlines and tabs too: a reason is one line), DEL, the C1 controls, and the Unicode format
characters that reorder or break lines (bidi embeddings, overrides, isolates and marks, the line
and paragraph separators).
"""

from __future__ import annotations

import re
from typing import Any, Dict, List

_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(match: "re.Match[str]") -> str:
    code = ord(match.group())
    return "\\x%02x" % code if code < 0x100 else "\\u%04x" % code


def printable(text: str) -> str:
    """`text` with every control or reordering character written as `\\xNN` or `\\uNNNN`."""
    return _UNSAFE.sub(_escape, text)


def printable_data(data: Any) -> Any:
    """Parsed JSON with `printable` applied to every string in it, keys included."""
    if isinstance(data, str):
        return printable(data)
    if isinstance(data, list):
        items: List[Any] = [printable_data(item) for item in data]
        return items
    if isinstance(data, dict):
        mapping: Dict[Any, Any] = {printable_data(k): printable_data(v) for k, v in data.items()}
        return mapping
    return data


def may_need_escaping(line: bytes) -> bool:
    """False when a JSON line cannot hold an unsafe character: ASCII without `\\u` escapes or
    DEL (raw C0 bytes are not valid JSON). The common case, told apart by three C scans."""
    return not line.isascii() or b"\\u" in line or b"\x7f" in line
