"""Writing a Fleet as fleet.yaml text that `load_fleet` reads back equal (the simulated fleet and
`gpuops export` write their files with it)."""

from __future__ import annotations

import io
import re
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString, SingleQuotedScalarString

from gpuops.spec.model import Fleet

_FLOW_WIDTH = 72
# A string written bare inside `{...}` or `[...]`: ruamel writes some plain scalars there that its
# own parser then refuses (`{description: :0}`), so a string that starts with an indicator, holds
# a flow indicator, a colon or a comment mark, or has spaces at its ends, is written in quotes.
_FLOW_UNSAFE = re.compile(r"\A(?:[-?:,\[\]{}#&*!|>'\"%@`\s]|\Z)|[,\[\]{}#:]|\s\Z")


def dump_fleet(fleet: Fleet, *, comment: str | None = None) -> str:
    """`fleet` as YAML: only the values that differ from the defaults; short lists and mappings of
    plain values (labels, users, GPU owners) on one line. `comment` becomes a '#' header."""
    data = fleet.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data["version"] = fleet.version  # always written, even if it ever gets a default
    ordered = {"version": data.pop("version"), **data}
    yaml = YAML(typ="rt", pure=True)
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 110
    out = io.StringIO()
    if comment:
        for line in comment.splitlines():
            out.write(f"# {line}".rstrip() + "\n")
    yaml.dump(_styled(ordered), out)
    return out.getvalue()


def _is_plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _in_flow(value: Any) -> Any:
    if isinstance(value, str) and _FLOW_UNSAFE.search(value):
        # Single quotes as ruamel writes them itself; double quotes where escapes are needed.
        return SingleQuotedScalarString(value) if value.isprintable() else DoubleQuotedScalarString(value)
    return value


def _styled(value: Any) -> Any:
    if isinstance(value, dict):
        if not value or (all(_is_plain(v) for v in value.values()) and len(repr(value)) <= _FLOW_WIDTH):
            mapping = CommentedMap((_in_flow(k), _in_flow(v)) for k, v in value.items())
            mapping.fa.set_flow_style()
            return mapping
        return CommentedMap((k, _styled(v)) for k, v in value.items())
    if isinstance(value, list):
        if not value or (all(_is_plain(v) for v in value) and len(repr(value)) <= _FLOW_WIDTH):
            seq = CommentedSeq(_in_flow(v) for v in value)
            seq.fa.set_flow_style()
            return seq
        return CommentedSeq(_styled(v) for v in value)
    return value
