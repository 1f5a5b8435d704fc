"""Writing YAML: the one emitter set-up, and which parts go on one line.

Everything gpuops writes as YAML goes through here: a whole fleet.yaml (`dump_fleet`: the
simulated fleet, `gpuops tenants --propose`, the Pool screen's fallback), the `carve:` entries
`gpuops export` writes (`carve_section`), `gpuops import mig-parted`'s entries, and the parts
`spec/edit.py` puts into an operator's file. A mapping or list written on one line goes through
`flow`, which quotes the strings ruamel would write bare there and then refuse to read back.
"""

from __future__ import annotations

import io
import re
from collections.abc import Sequence
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.scalarstring import DoubleQuotedScalarString, SingleQuotedScalarString

from gpuops.spec.model import Fleet

_FLOW_WIDTH = 72
_WIDTH = 110  # the emitter's line width
# A string written bare inside `{...}` or `[...]`: ruamel writes some plain scalars there that its
# own parser then refuses (`{description: :0}`), so a string that starts with an indicator, holds
# a flow indicator, a colon or a comment mark, or has spaces at its ends, is written in quotes.
_FLOW_UNSAFE = re.compile(r"\A(?:[-?:,\[\]{}#&*!|>'\"%@`\s]|\Z)|[,\[\]{}#:]|\s\Z")


def yaml_writer() -> YAML:
    """The round-trip emitter every writer uses (and the loader of the files `spec/edit.py`
    edits, so that what is not edited keeps its comments, order and quotes)."""
    yaml = YAML(typ="rt", pure=True)
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = _WIDTH
    return yaml


def dump_yaml(document: Any, *, comment: str | None = None) -> str:
    """`document` as YAML text; `comment` becomes a '#' header, one line per line."""
    out = io.StringIO()
    if comment:
        for line in comment.splitlines():
            out.write(f"# {line}".rstrip() + "\n")
    yaml_writer().dump(document, out)
    return out.getvalue()


def dump_fleet(fleet: Fleet, *, comment: str | None = None) -> str:
    """`fleet` as YAML that `load_fleet` reads back equal: only the values that differ from the
    defaults; short lists and mappings of plain values (labels, users, GPU owners) on one line."""
    data = fleet.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    data["version"] = fleet.version  # always written, even if it ever gets a default
    ordered = {"version": data.pop("version"), **data}
    return dump_yaml(compact(ordered), comment=comment)


def flow(value: Any) -> Any:
    """`value` written on one line, every mapping and list inside it too."""
    if isinstance(value, dict):
        mapping = CommentedMap((_quoted(k), flow(v)) for k, v in value.items())
        mapping.fa.set_flow_style()
        return mapping
    if isinstance(value, list):
        seq = CommentedSeq(flow(v) for v in value)
        seq.fa.set_flow_style()
        return seq
    return _quoted(value)


def compact(value: Any) -> Any:
    """fleet.yaml's layout: a mapping or list of plain values on one line when short (labels,
    users, GPU owners, a selector), everything else in blocks."""
    if isinstance(value, dict):
        if not value or (all(_is_plain(v) for v in value.values()) and len(repr(value)) <= _FLOW_WIDTH):
            return flow(value)
        return CommentedMap((k, compact(v)) for k, v in value.items())
    if isinstance(value, list):
        if not value or (all(_is_plain(v) for v in value) and len(repr(value)) <= _FLOW_WIDTH):
            return flow(value)
        return CommentedSeq(compact(v) for v in value)
    return value


def carve_section(entries: Sequence[dict[str, Any]]) -> CommentedSeq:
    """`carve:` entries as `gpuops export` writes them: each entry a block; a setting on one line
    when its values are plain or all mappings of plain values, and a list on one line, as long as
    that line fits: the emitter would otherwise break it anywhere, a value from its key
    (`class:` at the end of one line, `online}` on the next). What does not fit is a block of
    such lines (a limiter's tenants one per line)."""
    return CommentedSeq(CommentedMap((k, _carve_value(v)) for k, v in entry.items()) for entry in entries)


def _carve_value(value: Any) -> Any:
    if isinstance(value, dict):
        if _fits_one_line(value) and (
            all(_is_plain(v) for v in value.values())
            or all(isinstance(v, dict) and all(_is_plain(x) for x in v.values()) for v in value.values())
        ):
            return flow(value)
        return CommentedMap((k, _carve_value(v)) for k, v in value.items())
    if isinstance(value, list):
        if _fits_one_line(value) or not all(_is_plain(v) for v in value):
            return flow(value)
        return CommentedSeq(value)
    return value


# A carve setting's one-line value starts at most this far in (entry, setting and key indentation
# and the key itself), so a value up to the rest of the emitter's width is never broken.
_CARVE_KEY_ROOM = 30


def _fits_one_line(value: Any) -> bool:
    out = io.StringIO()
    writer = yaml_writer()
    writer.width = 1 << 20
    writer.dump(flow(value), out)
    return len(out.getvalue().rstrip("\n")) <= _WIDTH - _CARVE_KEY_ROOM


def _is_plain(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _quoted(value: Any) -> Any:
    if isinstance(value, str) and _FLOW_UNSAFE.search(value):
        # Single quotes as ruamel writes them itself; double quotes where escapes are needed.
        return SingleQuotedScalarString(value) if value.isprintable() else DoubleQuotedScalarString(value)
    return value


__all__ = ["carve_section", "compact", "dump_fleet", "dump_yaml", "flow", "yaml_writer"]
