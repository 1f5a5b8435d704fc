"""Fuzzing the loader: whatever the input, the answer is a Fleet or a SpecError whose every issue
is one located line. Never another exception."""

from __future__ import annotations

import copy
import io
import re
import tempfile
from pathlib import Path
from typing import Any

import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML
from typer.testing import CliRunner

from gpuops.cli import spec as spec_cli
from gpuops.spec import Fleet, SpecError, fleet_from_data, parse_fleet
from gpuops.spec.source import parse_yaml
from tests.hypothesis_budget import examples

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
FUZZ = settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
LINE_RE = re.compile(r"^f\.yaml(:\d+:\d+)?: \S")


def check_outcome(text: str) -> Fleet | SpecError:
    try:
        return parse_fleet(text, "f.yaml")
    except SpecError as exc:
        assert exc.errors, "a SpecError without issues"
        lines = text.count("\n") + 2
        for issue in exc.errors:
            line = str(issue)
            assert "\n" not in line and "\r" not in line, line
            assert LINE_RE.match(line), line
            assert 0 <= issue.line <= lines and issue.column >= 0, line
            assert all(c.isprintable() for c in line), line
        return exc


def check_data(data: Any) -> None:
    try:
        fleet_from_data(data, "f.yaml")
    except SpecError as exc:
        assert exc.errors
        for issue in exc.errors:
            assert "\n" not in str(issue) and str(issue).startswith("f.yaml")


# ---- text -----------------------------------------------------------------------------------


@FUZZ
@given(st.text(max_size=400))
def test_any_text(text: str) -> None:
    check_outcome(text)


TOKENS = [
    "version: 1\n",
    "version: 2\n",
    "nodes:\n",
    "nodes: []\n",
    "teams:\n",
    "ssh:\n",
    "agent:\n",
    "jump_hosts:\n",
    "  - ",
    "  ",
    "    ",
    "- ",
    "name: a\n",
    "host: h\n",
    "host: -oProxyCommand=x\n",
    "port: 70000\n",
    "port: 22\n",
    "owner: vision\n",
    "vision:\n",
    "users: [alice, bob]\n",
    "gpus: {0-3: vision, '3': x}\n",
    "labels: {a: b}\n",
    "jump_host: gw\n",
    "connect_timeout: 10x\n",
    "&a ",
    "*a",
    "<<: *a\n",
    "!!set ",
    "!!python/object:os.system ",
    "? ",
    ": ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "'",
    '"',
    "\t",
    "\n",
    "---\n",
    "...\n",
    "#",
    "|\n",
    ">\n",
    "~",
    "null",
    "true",
    "1e999",
    "0x",
    "\x00",
    "\x1b[2J",
    "\ufeff",
    "é",
]


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=40))
def test_yaml_like_token_soup(tokens: list[str]) -> None:
    check_outcome("".join(tokens))


@FUZZ
@given(st.data())
def test_the_example_with_one_line_broken(data: st.DataObject) -> None:
    lines = EXAMPLE.read_text().splitlines(keepends=True)
    index = data.draw(st.integers(0, len(lines) - 1))
    replacement = data.draw(st.one_of(st.sampled_from(TOKENS), st.text(max_size=30)))
    where = data.draw(st.integers(0, len(lines[index])))
    lines[index] = lines[index][:where] + replacement + lines[index][where:]
    check_outcome("".join(lines))


# ---- structures -----------------------------------------------------------------------------

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["1", "h", "none", "vision", "0-3", "10s", "strict", "alice", "-x", "a b", "sim"]),
)
KEYS = st.one_of(
    st.sampled_from(
        [
            "version",
            "nodes",
            "teams",
            "ssh",
            "agent",
            "jump_hosts",
            "interval",
            "name",
            "host",
            "port",
            "user",
            "owner",
            "gpus",
            "labels",
            "users",
            "groups",
            "jump_host",
            "0-3",
            "x-a",
        ]
    ),
    st.text(max_size=8),
)
STRUCTURES = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(KEYS, children, max_size=5)),
    max_leaves=40,
)


@FUZZ
@given(STRUCTURES)
def test_any_structure(data: Any) -> None:
    check_data(data)
    check_data({"version": 1, "nodes": data})
    check_data({"version": 1, "nodes": [data], "teams": data})


@FUZZ
@given(STRUCTURES)
def test_any_structure_as_yaml(data: Any) -> None:
    out = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.dump({"version": 1, "nodes": [data], "ssh": data}, out)
    check_outcome(out.getvalue())


_EXAMPLE_DOC = parse_yaml(EXAMPLE.read_text(), "example")


def _example_data() -> dict[str, Any]:
    assert isinstance(_EXAMPLE_DOC.data, dict)
    return copy.deepcopy(_EXAMPLE_DOC.data)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*path, i))
    return found


@settings(max_examples=examples(150), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_example_with_one_value_replaced(data: st.DataObject) -> None:
    example = _example_data()
    paths = [p for p in _paths(example) if p]
    path = data.draw(st.sampled_from(paths))
    value = data.draw(STRUCTURES)
    target: Any = example
    for elem in path[:-1]:
        target = target[elem]
    if isinstance(target, dict) and data.draw(st.booleans()):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    check_data(example)
    out = io.StringIO()
    YAML(typ="safe", pure=True).dump(example, out)
    check_outcome(out.getvalue())


# ---- the command line -----------------------------------------------------------------------

_app = typer.Typer()


@_app.callback()
def _root() -> None:
    pass


spec_cli.register(_app)
_runner = CliRunner()


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(st.text(max_size=200), st.lists(st.sampled_from(TOKENS), max_size=30).map("".join)))
def test_the_cli_never_prints_a_traceback(text: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.yaml"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        result = _runner.invoke(_app, ["validate", str(path)])
    assert result.exit_code in (0, 1), (result.exit_code, result.output, result.exception)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    if result.exit_code == 0:
        assert result.stdout.startswith(f"{path}: OK")
    else:
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert lines and all(line.startswith(str(path)) for line in lines), result.stderr
