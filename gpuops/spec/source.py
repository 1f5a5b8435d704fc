"""fleet.yaml text -> plain data (dicts, lists, scalars) plus the line and column of every key and
value, so that any later mistake can be reported at its place in the file.

The YAML is composed (not constructed) with ruamel.yaml, and the node graph is walked here:
that is what lets us report *every* duplicate key (not just the first), keep the location of
keys brought in by merge keys (``<<: *defaults``), refuse recursive aliases and alias bombs,
and refuse tags that have no place in an inventory (``!!python/...``, ``!!binary``, ``!!set``).
Mapping keys are always text: ``7: nlp`` gives the key ``"7"``, as written.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

from ruamel.yaml import YAML
from ruamel.yaml.error import MarkedYAMLError
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.reader import ReaderError

from gpuops.spec.errors import DataPath, SpecIssue, format_path, show

MAX_FILE_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 48
MAX_VALUES = 500_000

Position = tuple[int, int]  # 1-based line and column; (0, 0) when unknown

_TAG = "tag:yaml.org,2002:"
_SCALAR_TAGS = {_TAG + t for t in ("str", "int", "float", "bool", "null")}
_MERGE_TAG = _TAG + "merge"
_NO_POSITION: Position = (0, 0)


class _TooBig(Exception):
    pass


@dataclass
class Document:
    """Plain data read from one source, with positions by data path."""

    file: str
    data: Any = None
    issues: list[SpecIssue] = field(default_factory=list)
    key_positions: dict[DataPath, Position] = field(default_factory=dict)
    value_positions: dict[DataPath, Position] = field(default_factory=dict)
    base_dir: Path | None = None  # where relative local paths in the file are anchored
    refused: set[DataPath] = field(default_factory=set)  # values already reported and read as null

    def position(self, path: DataPath, *, at_key: bool = False) -> Position:
        """Where `path` is written: its key (`at_key`) or its value; an unknown path falls back
        to its nearest written parent (for a missing key: the mapping that lacks it)."""
        if at_key and path in self.key_positions:
            return self.key_positions[path]
        if path in self.value_positions:
            return self.value_positions[path]
        prefix = path[:-1]
        while prefix:
            if prefix in self.key_positions:
                return self.key_positions[prefix]
            if prefix in self.value_positions:
                return self.value_positions[prefix]
            prefix = prefix[:-1]
        return self.value_positions.get((), _NO_POSITION)

    def is_written(self, path: DataPath) -> bool:
        return path in self.value_positions or path in self.key_positions

    def issue(self, path: DataPath, message: str, hint: str = "", *, at_key: bool = False) -> SpecIssue:
        line, column = self.position(path, at_key=at_key)
        return SpecIssue(self.file, line, column, format_path(path), message, hint)


def read_text(path: Union[str, Path], display: str | None = None) -> tuple[str | None, SpecIssue | None]:
    """The file's text, or one issue saying why it cannot be read (never raises)."""
    name = display if display is not None else str(path)
    try:
        with open(path, "rb") as handle:
            raw = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        return None, SpecIssue(name, 0, 0, "", "no such file")
    except IsADirectoryError:
        return None, SpecIssue(name, 0, 0, "", "is a directory, not a file")
    except PermissionError:
        return None, SpecIssue(name, 0, 0, "", "cannot read: permission denied")
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        return None, SpecIssue(name, 0, 0, "", f"cannot read: {reason}")
    return decode(raw, name)


def decode(raw: bytes, name: str) -> tuple[str | None, SpecIssue | None]:
    if len(raw) > MAX_FILE_BYTES:
        return None, SpecIssue(name, 0, 0, "", f"file is larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB")
    try:
        return raw.decode("utf-8-sig"), None
    except UnicodeDecodeError as exc:
        good = raw[: exc.start].decode("utf-8-sig", errors="replace")
        line = good.count("\n") + 1
        column = len(good) - (good.rfind("\n") + 1) + 1
        return None, SpecIssue(
            name, line, column, "", f"not valid UTF-8 (byte 0x{raw[exc.start]:02x})", "save the file as UTF-8"
        )


def parse_yaml(text: str, file: str) -> Document:
    """Compose `text` and convert it; syntax errors become located issues in `Document.issues`."""
    doc = Document(file)
    yaml = YAML(typ="safe", pure=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            root = yaml.compose(text)
    except MarkedYAMLError as exc:
        doc.issues.append(_syntax_issue(exc, file))
        return doc
    except ReaderError as exc:
        line, column = _offset_position(text, exc.position)
        code = exc.character if isinstance(exc.character, int) else ord(str(exc.character)[:1] or "?")
        doc.issues.append(
            SpecIssue(file, line, column, "", f"character U+{code:04X} is not allowed in YAML", "remove it")
        )
        return doc
    except RecursionError:
        doc.issues.append(SpecIssue(file, 1, 1, "", "YAML nested too deeply"))
        return doc
    except Exception as exc:  # ruamel.yaml may fail on odd input in odd ways
        doc.issues.append(
            SpecIssue(file, 1, 1, "", f"cannot parse YAML: {_one_line(str(exc)) or type(exc).__name__}")
        )
        return doc
    if root is None or (isinstance(root, ScalarNode) and root.tag == _TAG + "null" and not root.value):
        doc.issues.append(
            SpecIssue(
                file, 1, 1, "", "file is empty", "a fleet file starts with 'version: 1' and lists 'nodes:'"
            )
        )
        return doc
    converter = _NodeConverter(doc, yaml)
    try:
        doc.data = converter.convert(root, (), 0)
    except _TooBig:
        doc.issues.append(
            SpecIssue(file, 1, 1, "", f"more than {MAX_VALUES} values (after expanding aliases)", "")
        )
        doc.data = None
    return doc


def from_data(data: Any, file: str) -> Document:
    """A Document from data already in memory (no positions), checked like parsed YAML."""
    doc = Document(file)
    try:
        doc.data = _DataConverter(doc).convert(data, (), 0)
    except _TooBig:
        doc.issues.append(SpecIssue(file, 0, 0, "", f"more than {MAX_VALUES} values"))
        doc.data = None
    return doc


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _offset_position(text: str, offset: int) -> Position:
    before = text[: max(0, offset)]
    return before.count("\n") + 1, offset - (before.rfind("\n") + 1) + 1


def _syntax_issue(exc: MarkedYAMLError, file: str) -> SpecIssue:
    mark = exc.problem_mark or exc.context_mark
    line, column = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
    problem = _one_line(str(exc.problem or ""))
    context = _one_line(str(exc.context or ""))
    if "'\\t'" in problem:
        return SpecIssue(
            file, line, column, "", "tab character where YAML expects spaces", "indent with spaces"
        )
    message = problem or context or "invalid YAML"
    if problem and context:
        where = exc.context_mark
        at = f" at line {where.line + 1}" if where is not None and where is not mark else ""
        message = f"{problem} ({context}{at})"
    return SpecIssue(file, line, column, "", f"YAML syntax error: {message}")


def _mark(node: Node) -> Position:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


class _NodeConverter:
    def __init__(self, doc: Document, yaml: YAML) -> None:
        self.doc = doc
        self.constructor = yaml.constructor
        self.count = 0
        self.active: set[int] = set()

    def _problem(
        self, node: Node, path: DataPath, message: str, hint: str = "", *, refused: bool = True
    ) -> None:
        """Report a problem; `refused`: the value at `path` was replaced by null."""
        if refused:
            self.doc.refused.add(path)
        line, column = _mark(node)
        self.doc.issues.append(SpecIssue(self.doc.file, line, column, format_path(path), message, hint))

    def convert(self, node: Node, path: DataPath, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise _TooBig
        self.doc.value_positions[path] = _mark(node)
        if depth > MAX_DEPTH:
            self._problem(node, path, f"nested more than {MAX_DEPTH} levels deep")
            return None
        if isinstance(node, ScalarNode):
            return self._scalar(node, path)
        if id(node) in self.active:
            self._problem(node, path, "an alias refers to itself (recursive structure)")
            return None
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _TAG + "seq":
                    self._problem(node, path, f"unsupported tag {node.tag!r}", "remove the tag")
                return self._sequence(node, path, depth)
            if isinstance(node, MappingNode):
                if node.tag != _TAG + "map":
                    self._problem(node, path, f"unsupported tag {node.tag!r}", "remove the tag")
                return self._mapping(node, path, depth)
        finally:
            self.active.discard(id(node))
        self._problem(node, path, "unsupported YAML node")
        return None

    def _scalar(self, node: ScalarNode, path: DataPath) -> Any:
        if node.tag == _TAG + "str":
            return str(node.value)
        if node.tag == _TAG + "timestamp":
            return str(node.value)  # no field takes a date: keep the text as written
        if node.tag not in _SCALAR_TAGS:
            self._problem(node, path, f"unsupported tag {node.tag!r}", "remove the tag")
            return None
        try:
            value = self.constructor.construct_object(node, deep=True)
        except Exception as exc:  # a malformed !!int and the like
            self._problem(
                node, path, f"cannot read value {show(str(node.value))}: {_one_line(str(exc))[:80]}"
            )
            return None
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        return str(node.value)

    def _sequence(self, node: SequenceNode, path: DataPath, depth: int) -> list[Any]:
        items: list[Any] = []
        for index, child in enumerate(node.value):
            child_path = (*path, index)
            self.doc.key_positions[child_path] = _mark(child)
            items.append(self.convert(child, child_path, depth + 1))
        return items

    def _mapping(self, node: MappingNode, path: DataPath, depth: int) -> dict[str, Any]:
        result: dict[str, Any] = {}
        merges: list[Node] = []
        explicit: list[tuple[str, Node, Node]] = []
        seen: dict[str, Position] = {}
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                merges.append(value_node)
                continue
            if not isinstance(key_node, ScalarNode):
                self._problem(
                    key_node, path, "a mapping key must be plain text, not a list or mapping", refused=False
                )
                continue
            key = str(key_node.value)
            if key in seen:
                line = seen[key][0]
                self._problem(
                    key_node,
                    (*path, key),
                    f"duplicate key {show(key)} (first at line {line})",
                    "keep one of them",
                    refused=False,
                )
                continue
            seen[key] = _mark(key_node)
            explicit.append((key, key_node, value_node))
        # Merge keys: explicit keys win over merged ones, and earlier sources over later ones.
        for merge in merges:
            sources = merge.value if isinstance(merge, SequenceNode) else [merge]
            for source in reversed(sources):
                if not isinstance(source, MappingNode):
                    self._problem(
                        source, path, "'<<' (merge key) takes a mapping or a list of mappings", refused=False
                    )
                    continue
                if id(source) in self.active:
                    self._problem(
                        source, path, "an alias refers to itself (recursive structure)", refused=False
                    )
                    continue
                self.active.add(id(source))
                try:
                    merged = self._mapping(source, path, depth)
                finally:
                    self.active.discard(id(source))
                result.update(merged)
        for key, key_node, value_node in explicit:
            child_path = (*path, key)
            self.doc.key_positions[child_path] = _mark(key_node)
            result[key] = self.convert(value_node, child_path, depth + 1)
        return result


class _DataConverter:
    """Checks data from memory the way _NodeConverter checks YAML: plain types, text keys, bounded."""

    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.count = 0
        self.active: set[int] = set()

    def _problem(self, path: DataPath, message: str, *, refused: bool = True) -> None:
        if refused:
            self.doc.refused.add(path)
        self.doc.issues.append(SpecIssue(self.doc.file, 0, 0, format_path(path), message))

    def convert(self, value: Any, path: DataPath, depth: int) -> Any:
        self.count += 1
        if self.count > MAX_VALUES:
            raise _TooBig
        if value is None or isinstance(value, (bool, int, float, str)):
            return value
        if depth > MAX_DEPTH:
            self._problem(path, f"nested more than {MAX_DEPTH} levels deep")
            return None
        if id(value) in self.active:
            self._problem(path, "recursive structure")
            return None
        self.active.add(id(value))
        try:
            if isinstance(value, (list, tuple)):
                return [self.convert(item, (*path, i), depth + 1) for i, item in enumerate(value)]
            if isinstance(value, dict):
                out: dict[str, Any] = {}
                for key, item in value.items():
                    if isinstance(key, bool) or not isinstance(key, (str, int)):
                        self._problem(path, f"a mapping key must be text, got {show(key)}", refused=False)
                        continue
                    text = str(key)
                    if text in out:
                        self._problem((*path, text), f"duplicate key {show(text)}", refused=False)
                        continue
                    out[text] = self.convert(item, (*path, text), depth + 1)
                return out
        finally:
            self.active.discard(id(value))
        self._problem(path, f"unsupported value {show(value)}")
        return None
