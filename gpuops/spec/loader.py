"""Loading fleet.yaml: text -> located data -> pydantic models -> cross-field checks -> Fleet.

Every mistake found on the way is collected; if there is any, `SpecError` carries all of them,
sorted by place in the file. Nothing here raises anything else for bad input.
"""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin

from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails

from gpuops.spec.checks import CheckContext, run_checks
from gpuops.spec.errors import DataPath, FieldProblem, SpecError, SpecIssue, format_path, show
from gpuops.spec.model import AgentOptions, Fleet, JumpHost, NodeEntry, SshDefaults, SshOptions
from gpuops.spec.source import Document, decode, from_data, parse_yaml, read_text
from gpuops.spec.types import SPEC_VERSION, closest

EXTENSION_PREFIX = "x-"  # top-level keys for YAML anchors, ignored (as in docker compose files)

_MISSING_HINTS = {
    "version": f"add 'version: {SPEC_VERSION}' at the top of the file",
    "nodes": "list the GPU servers under nodes:, each with at least a host",
    "host": "the DNS name, IP address or ~/.ssh/config alias to reach the node",
    "name": "a node needs a name when its host is not usable as one (an IPv6 address)",
    "enabled": "enabled: true or enabled: false",
    "select": "which GPUs: select: {nodes: gpu-a-*, gpus: 0-3}",
}

# Local paths in the file (under the top-level ssh: and each node's ssh:) are relative to the
# file's directory; so are the identity files of jump_hosts.
_SSH_LOCAL_PATHS: tuple[DataPath, ...] = (("ssh", "identity_file"), ("ssh", "known_hosts"))


def load_fleet(path: Union[str, Path], *, display: str | None = None) -> Fleet:
    """Read and check a fleet.yaml; raises SpecError listing every mistake. '-' reads stdin.
    Messages name the file as `display`, or as `path` was given."""
    name = display if display is not None else ("<stdin>" if str(path) == "-" else str(path))
    if str(path) == "-":
        text, problem = decode(sys.stdin.buffer.read(), name)
        base = Path.cwd()
    else:
        text, problem = read_text(path, name)
        base = Path(path).absolute().parent
    if problem is not None or text is None:
        raise SpecError([problem or SpecIssue(name, 0, 0, "", "cannot read")])
    return parse_fleet(text, name, base_dir=base)


def parse_fleet(text: str, file: str = "<string>", *, base_dir: Path | None = None) -> Fleet:
    """A Fleet from YAML text; relative local paths are anchored at `base_dir` when given."""
    doc = parse_yaml(text, file)
    doc.base_dir = base_dir
    return build_fleet(doc)


def fleet_from_data(data: Any, file: str = "<data>", *, base_dir: Path | None = None) -> Fleet:
    """A Fleet from plain data (as json.load or a YAML library gives), checked like a file."""
    doc = from_data(data, file)
    doc.base_dir = base_dir
    return build_fleet(doc)


def check_fleet(fleet: Fleet, file: str = "<fleet>") -> list[SpecIssue]:
    """The cross-field mistakes of a Fleet built in code (names, owners, references)."""
    return run_checks(fleet, CheckContext(Document(file)))


def build_fleet(doc: Document) -> Fleet:
    issues = list(doc.issues)
    data = doc.data
    if not isinstance(data, dict):
        if data is not None or not issues:
            issues.append(
                doc.issue(
                    (), f"the top level must be a mapping (got {show(data)})", "start with 'version: 1'"
                )
            )
        raise SpecError(issues)
    data = {k: v for k, v in data.items() if not k.startswith(EXTENSION_PREFIX)}
    if doc.base_dir is not None:
        data = _anchor_paths(data, doc.base_dir)
    try:
        fleet = Fleet.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        # A value the YAML reader already refused (a bad tag...) was read as null: say it once.
        # A node whose host is wrong has no name to default to: the host's error says it all.
        bad_hosts = {
            tuple(e["loc"][:-1]) for e in errors if e["loc"][-1:] == ("host",) and e["type"] != "missing"
        }
        issues.extend(
            _issue_from_error(err, doc)
            for err in errors
            if not _under(tuple(err["loc"]), doc.refused)
            and not (
                err["type"] == "missing"
                and err["loc"][-1:] == ("name",)
                and tuple(err["loc"][:-1]) in bad_hosts
            )
        )
        pruned, kept = _prune(data, errors)
        try:
            partial = Fleet.model_validate(pruned)
        except ValidationError:
            raise SpecError(issues) from None
        issues.extend(run_checks(partial, CheckContext(doc, kept)))
        raise SpecError(issues) from None
    issues.extend(run_checks(fleet, CheckContext(doc)))
    if issues:
        raise SpecError(issues)
    fleet._doc = doc
    return fleet


def _under(loc: DataPath, refused: set[DataPath]) -> bool:
    return any(loc[:i] in refused for i in range(len(loc) + 1))


def _anchor_paths(data: dict[str, Any], base: Path) -> dict[str, Any]:
    def anchored(value: Any) -> Any:
        if isinstance(value, str) and value and not value.startswith(("~", "-")) and not os.path.isabs(value):
            return os.path.normpath(os.path.join(base, value))
        return value

    def rewrite(mapping: Any, paths: tuple[DataPath, ...]) -> Any:
        if not isinstance(mapping, dict):
            return mapping
        out = dict(mapping)
        for path in paths:
            head, leaf = path[0], path[1]
            inner = out.get(head)
            if isinstance(inner, dict) and leaf in inner:
                out[head] = {**inner, leaf: anchored(inner[leaf])}
        return out

    data = rewrite(data, _SSH_LOCAL_PATHS)
    jumps = data.get("jump_hosts")
    if isinstance(jumps, dict):
        data["jump_hosts"] = {
            k: (
                {**v, "identity_file": anchored(v["identity_file"])}
                if isinstance(v, dict) and "identity_file" in v
                else v
            )
            for k, v in jumps.items()
        }
    nodes = data.get("nodes")
    if isinstance(nodes, list):
        data["nodes"] = [rewrite(n, _SSH_LOCAL_PATHS) for n in nodes]
    return data


def _prune(
    data: dict[str, Any], errors: list[ErrorDetails]
) -> tuple[dict[str, Any], dict[DataPath, list[int]]]:
    """The data without what failed validation, so that the cross-field checks can run on the
    rest: a bad optional key is removed from its mapping, an entry missing or failing a required
    key is removed from its list or mapping. Also returns, per list (by its path in the file),
    the positions of the entries kept."""
    cuts: set[DataPath] = set()
    for err in errors:
        loc: DataPath = tuple(err["loc"])
        if loc and loc[-1] == "[key]":
            loc = loc[:-1]
        cut = _cut_point(data, loc)
        if cut is not None:
            cuts.add(cut)
    kept: dict[DataPath, list[int]] = {}

    def copy(value: Any, path: DataPath) -> Any:
        if isinstance(value, dict):
            return {k: copy(v, (*path, k)) for k, v in value.items() if (*path, k) not in cuts}
        if isinstance(value, list):
            positions = [i for i in range(len(value)) if (*path, i) not in cuts]
            if len(positions) != len(value):
                kept[path] = positions
            return [copy(value[i], (*path, i)) for i in positions]
        return value

    pruned: dict[str, Any] = copy(data, ())
    pruned.setdefault("version", SPEC_VERSION)
    pruned.setdefault("nodes", [])
    return pruned, kept


def _cut_point(data: Any, loc: DataPath) -> DataPath | None:
    """The smallest part of the data around an error whose removal leaves the rest valid."""
    for end in range(len(loc), 0, -1):
        parent, key = loc[: end - 1], loc[end - 1]
        container = _get(data, parent)
        model = _model_at(parent)
        if model is not None and isinstance(container, dict):
            field = _field(model, str(key))
            if field is None or not field.is_required():
                return loc[:end]
            continue  # a required key: remove the mapping that holds it
        if isinstance(container, (dict, list)):
            return loc[:end]
    return None


def _get(data: Any, path: DataPath) -> Any:
    for elem in path:
        in_list = isinstance(data, list) and isinstance(elem, int) and 0 <= elem < len(data)
        if in_list or (isinstance(data, dict) and elem in data):
            data = data[elem]
        else:
            return None
    return data


def _strip_type(tp: Any) -> Any:
    """Annotated[X, ...] -> X; X | None -> X (the model, in a union with one)."""
    while True:
        if hasattr(tp, "__metadata__"):
            tp = get_args(tp)[0]
            continue
        if get_origin(tp) in (Union, types.UnionType):
            args = [a for a in get_args(tp) if a is not type(None)]
            models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
            tp = models[0] if models else args[0]
            continue
        return tp


def _field(model: type[BaseModel], key: str) -> FieldInfo | None:
    """A model's field by the key written in the file (its alias, where it has one)."""
    for name, info in model.model_fields.items():
        if (info.alias or name) == key:
            return info
    return None


def _model_at(path: DataPath) -> type[BaseModel] | None:
    """The model class that validates the mapping at `path`, if there is one."""
    tp: Any = Fleet
    for elem in path:
        tp = _strip_type(tp)
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = _field(tp, str(elem))
            if field is None:
                return None
            tp = field.annotation
        elif get_origin(tp) is list:
            tp = get_args(tp)[0]
        elif get_origin(tp) is dict:
            tp = get_args(tp)[1]
        else:
            return None
    tp = _strip_type(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unknown_key_hint(key: str, parent: DataPath, model: type[BaseModel] | None) -> str:
    choices = [f.alias or name for name, f in model.model_fields.items()] if model is not None else []
    if model is NodeEntry and key in SshDefaults.model_fields:
        return f"SSH settings of a node go under its ssh: ({format_path((*parent, 'ssh', key))})"
    if model is NodeEntry and key in AgentOptions.model_fields:
        return f"agent settings of a node go under its agent: ({format_path((*parent, 'agent', key))})"
    if model is JumpHost and key == "jump_host":
        return "one hop only in fleet.yaml; for chains use ProxyJump in ~/.ssh/config"
    if model is SshOptions and key in SshDefaults.model_fields:
        return f"{key} is fleet-wide: set it in the top-level ssh:"
    if model is Fleet and key in NodeEntry.model_fields and key not in choices:
        return "node settings go in an entry of nodes:"
    if model is Fleet and key in SshDefaults.model_fields:
        return f"SSH settings go under ssh: (ssh.{key})"
    guess = closest(key, choices)
    if guess:
        return guess
    return f"valid keys: {', '.join(choices)}" if choices else ""


def _issue_from_error(err: ErrorDetails, doc: Document) -> SpecIssue:
    loc: DataPath = tuple(err["loc"])
    kind = err["type"]
    value = err.get("input")
    at_key = False
    if loc and loc[-1] == "[key]":
        loc, at_key = loc[:-1], True
    problem = (err.get("ctx") or {}).get("error")
    if isinstance(problem, FieldProblem):
        return doc.issue(loc, problem.message, problem.hint, at_key=at_key)
    if kind == "missing" and loc:
        key, parent = loc[-1], loc[:-1]
        issue = doc.issue(parent, f"missing required key {show(str(key))}", _MISSING_HINTS.get(str(key), ""))
        line, column = doc.position(parent, at_key=True)
        return SpecIssue(issue.file, line, column, issue.path, issue.message, issue.hint)
    if kind == "extra_forbidden" and loc:
        key, parent = str(loc[-1]), loc[:-1]
        return doc.issue(
            loc, f"unknown key {show(key)}", _unknown_key_hint(key, parent, _model_at(parent)), at_key=True
        )
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return doc.issue(loc, f"expected a mapping (got {show(value)})", at_key=at_key)
    if kind == "list_type":
        hint = f"write a YAML list: [{value}]" if isinstance(value, str) else ""
        return doc.issue(loc, f"expected a list (got {show(value)})", hint, at_key=at_key)
    if kind == "string_type":
        return doc.issue(loc, f"expected text (got {show(value)})", "quote it", at_key=at_key)
    if kind.startswith("bool"):
        return doc.issue(loc, f"expected true or false (got {show(value)})", at_key=at_key)
    if kind.startswith("int"):
        return doc.issue(loc, f"expected a whole number (got {show(value)})", at_key=at_key)
    message = str(err.get("msg", "invalid value"))
    message = message.removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    return doc.issue(loc, f"{message} (got {show(value)})", at_key=at_key)
