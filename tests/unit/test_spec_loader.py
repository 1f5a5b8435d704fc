# ruff: noqa: E501  (the expected error lines are long by nature)
"""Reading fleet.yaml: files that cannot be read, YAML that cannot be parsed, YAML features
(anchors, merge keys, tags), relative paths: each mistake is one located line, never a traceback."""

from __future__ import annotations

import io
import os
import sys
import textwrap
from pathlib import Path

import pytest

from gpuops.spec import SpecError, SpecIssue, load_fleet, parse_fleet, source
from gpuops.spec.source import MAX_FILE_BYTES, MAX_VALUES

MINIMAL = "version: 1\nnodes:\n  - {name: a, host: h}\n"


def errors_of(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_fleet(textwrap.dedent(text), "f.yaml")
    return [str(e) for e in info.value.errors]


def file_errors(path: Path | str) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_fleet(path, display="fleet.yaml")
    return [str(e) for e in info.value.errors]


# ---- the file itself ------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    assert file_errors(tmp_path / "nope.yaml") == ["fleet.yaml: no such file"]


def test_directory(tmp_path: Path) -> None:
    assert file_errors(tmp_path) == ["fleet.yaml: is a directory, not a file"]


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(MINIMAL)
    path.chmod(0)
    try:
        assert file_errors(path) == ["fleet.yaml: cannot read: permission denied"]
    finally:
        path.chmod(0o600)


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (PermissionError(13, "Permission denied"), "fleet.yaml: cannot read: permission denied"),
        (OSError(5, "Input/output error"), "fleet.yaml: cannot read: Input/output error"),
    ],
)
def test_read_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: OSError, expected: str) -> None:
    def failing_open(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(source, "open", failing_open, raising=False)
    assert file_errors(tmp_path / "fleet.yaml") == [expected]


def test_file_too_large(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_bytes(b"#" * (MAX_FILE_BYTES + 1))
    assert file_errors(path) == ["fleet.yaml: file is larger than 16 MiB"]


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_bytes(b"version: 1\nnodes:\n  - host: caf\xe9\n")
    assert file_errors(path) == ["fleet.yaml:3:14: not valid UTF-8 (byte 0xe9); save the file as UTF-8"]


def test_byte_order_mark_is_fine(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + MINIMAL.encode())
    assert load_fleet(path).nodes[0].name == "a"


def test_names_the_file_as_given(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("fleet.yaml").write_text("version: 1\nnodes: 3\n")
    with pytest.raises(SpecError) as info:
        load_fleet("fleet.yaml")
    assert str(info.value) == "fleet.yaml:2:8: nodes: expected a list (got 3)"


def test_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        sys, "stdin", io.TextIOWrapper(io.BytesIO(b"version: 1\nnodes: [{host: x, port: 0}]\n"))
    )
    with pytest.raises(SpecError) as info:
        load_fleet("-")
    assert str(info.value) == "<stdin>:2:25: nodes[0].port: must be between 1 and 65535 (got 0)"


# ---- YAML that is not a fleet ----------------------------------------------------------------


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "---\n", "--- # nothing\n...\n"])
def test_empty(text: str) -> None:
    assert errors_of(text) == [
        "f.yaml:1:1: file is empty; a fleet file starts with 'version: 1' and lists 'nodes:'"
    ]


@pytest.mark.parametrize(
    ("text", "shown"),
    [("- a\n- b\n", "a list"), ("hello\n", "'hello'"), ("42\n", "42"), ("null\n", "null"), ("'x'\n", "'x'")],
)
def test_top_level_not_a_mapping(text: str, shown: str) -> None:
    assert errors_of(text) == [
        f"f.yaml:1:1: the top level must be a mapping (got {shown}); start with 'version: 1'"
    ]


def test_syntax_error() -> None:
    assert errors_of("version: 1\nnodes: [\n") == [
        "f.yaml:3:1: YAML syntax error: expected the node content, but found '<stream end>' (while parsing a flow node)"
    ]


def test_syntax_error_unclosed_quote() -> None:
    (line,) = errors_of('version: 1\nnodes:\n  - host: "gpu1\n')
    assert line.startswith(
        "f.yaml:4:1: YAML syntax error: found unexpected end of stream (while scanning a quoted scalar at line 3)"
    )


def test_syntax_error_bad_indentation() -> None:
    (line,) = errors_of("version: 1\nnodes:\n  - host: a\n   port: 22\n")
    assert line.startswith(
        "f.yaml:4:4: YAML syntax error: expected <block end>, but found '<block mapping start>'"
    )


def test_tab_in_indentation() -> None:
    assert errors_of("version: 1\nnodes:\n\t- host: x\n") == [
        "f.yaml:3:1: tab character where YAML expects spaces; indent with spaces"
    ]
    assert errors_of("version:\t1\nnodes: []\n") == [
        "f.yaml:1:9: tab character where YAML expects spaces; indent with spaces"
    ]


def test_every_duplicate_key_is_reported() -> None:
    assert errors_of(
        """\
        version: 1
        teams:
          a: {}
          b: {}
          a: {}
        nodes:
          - name: x
            host: h
            host: h2
        version: 1
        """
    ) == [
        "f.yaml:5:3: teams.a: duplicate key 'a' (first at line 3); keep one of them",
        "f.yaml:9:5: nodes[0].host: duplicate key 'host' (first at line 8); keep one of them",
        "f.yaml:10:1: version: duplicate key 'version' (first at line 1); keep one of them",
    ]


def test_several_documents() -> None:
    (line,) = errors_of("version: 1\nnodes: []\n---\nversion: 1\n")
    assert (
        line
        == "f.yaml:3:1: YAML syntax error: but found another document (expected a single document in the stream at line 1)"
    )


def test_undefined_alias() -> None:
    (line,) = errors_of("version: 1\nnodes: [*nope]\n")
    assert line.startswith("f.yaml:2:9: YAML syntax error: found undefined alias")


def test_control_character() -> None:
    assert errors_of("version: 1\nnodes: []\nx: \x07\n") == [
        "f.yaml:3:4: character U+0007 is not allowed in YAML; remove it"
    ]


def test_recursive_alias() -> None:
    assert errors_of("version: 1\nnodes: &n [*n]\n") == [
        "f.yaml:2:8: nodes[0]: an alias refers to itself (recursive structure)"
    ]


def test_alias_bomb_is_bounded() -> None:
    lines = ["version: 1", "a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, 9):
        prev = f"*a{i - 1}"
        lines.append(f"a{i}: &a{i} [{', '.join([prev] * 10)}]")
    lines.append("nodes: []")
    assert errors_of("\n".join(lines) + "\n") == [
        f"f.yaml:1:1: more than {MAX_VALUES} values (after expanding aliases)"
    ]


def test_deep_nesting() -> None:
    assert errors_of("version: 1\nnodes: " + "[" * 5000 + "]" * 5000 + "\n") == [
        "f.yaml:1:1: YAML nested too deeply"
    ]
    first, line = errors_of("version: 1\nnodes: " + "[" * 60 + "]" * 60 + "\n")
    assert first == "f.yaml:2:9: nodes[0]: expected a mapping (got a list)"
    assert line == "f.yaml:2:56: nodes" + "[0]" * 48 + ": nested more than 48 levels deep"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "version: 1\nnodes: []\nx: !!python/object:os.system echo\n",
            "f.yaml:3:4: x: unsupported tag 'tag:yaml.org,2002:python/object:os.system'; remove the tag",
        ),
        (
            "version: 1\nnodes: !!set {a}\n",
            "f.yaml:2:8: nodes: unsupported tag 'tag:yaml.org,2002:set'; remove the tag",
        ),
        (
            "version: !custom 1\nnodes: []\n",
            "f.yaml:1:10: version: unsupported tag '!custom'; remove the tag",
        ),
        (
            "version: 1\nnodes: []\nssh: {user: !!binary aGk=}\n",
            "f.yaml:3:13: ssh.user: unsupported tag 'tag:yaml.org,2002:binary'; remove the tag",
        ),
    ],
)
def test_tags_are_refused_once(text: str, expected: str) -> None:
    errors = errors_of(text)
    assert expected in errors
    assert len(errors) <= 2  # the tag, and for x: the unknown key; never also "expected ... (got null)"
    assert not any("got null" in e for e in errors)


def test_complex_key() -> None:
    assert errors_of("version: 1\nnodes: []\n? [a, b]\n: 1\n") == [
        "f.yaml:3:3: a mapping key must be plain text, not a list or mapping"
    ]


def test_bad_int_literal() -> None:
    (line,) = errors_of("version: !!int abc\nnodes: []\n")
    assert line.startswith("f.yaml:1:10: version: cannot read value 'abc'")


# ---- YAML features that are welcome ----------------------------------------------------------


def test_merge_keys_and_extension_keys() -> None:
    fleet = parse_fleet(
        textwrap.dedent(
            """\
            version: 1
            x-common: &common
              owner: vision
              labels: {zone: a}
              ssh: {connect_timeout: 30s}
            teams: {vision: {}, nlp: {}}
            nodes:
              - name: a
                host: h1
                <<: *common
              - name: b
                host: h2
                owner: nlp
                <<: *common
            """
        ),
        "f.yaml",
    )
    a, b = fleet.nodes
    assert (a.owner, b.owner) == ("vision", "nlp")  # explicit keys win over merged ones
    assert a.labels == b.labels == {"zone": "a"}
    assert fleet.ssh_settings("b").connect_timeout == 30.0


def test_merged_value_errors_point_at_the_anchor() -> None:
    assert errors_of(
        """\
        version: 1
        x-common: &common
          port: 99999
        nodes:
          - name: a
            host: h1
            <<: *common
        """
    ) == ["f.yaml:3:9: nodes[0].port: must be between 1 and 65535 (got 99999)"]


def test_merge_of_a_list_of_mappings() -> None:
    fleet = parse_fleet(
        "version: 1\nx-a: &a {port: 1}\nx-b: &b {port: 2, user: u}\nnodes:\n  - {name: n, host: h, <<: [*a, *b]}\n"
    )
    assert (fleet.nodes[0].port, fleet.nodes[0].user) == (1, "u")  # earlier sources win


def test_merge_of_a_scalar() -> None:
    assert errors_of("version: 1\nnodes:\n  - {name: n, host: h, <<: 3}\n") == [
        "f.yaml:3:28: nodes[0]: '<<' (merge key) takes a mapping or a list of mappings"
    ]


def test_keys_are_text_as_written() -> None:
    fleet = parse_fleet("version: 1\nteams: {a: {}}\nnodes:\n  - {name: n, host: h, gpus: {7: a, 0-1: a}}\n")
    assert fleet.nodes[0].gpus == {"7": "a", "0-1": "a"}
    assert fleet.gpu_owner("n", 7) == "a"


def test_dates_and_numbers_as_label_values() -> None:
    fleet = parse_fleet("version: 1\nnodes:\n  - {name: n, host: h, labels: {since: 2024-01-01, row: 7}}\n")
    assert fleet.nodes[0].labels == {"since": "2024-01-01", "row": "7"}


def test_yaml_1_1_booleans_are_text_in_yaml_1_2() -> None:
    fleet = parse_fleet("version: 1\nssh: {use_ssh_config: no}\nnodes: []\n")
    assert fleet.ssh_settings  # 'no' is a string in YAML 1.2; use_ssh_config takes it as false
    assert fleet.ssh.use_ssh_config is False


# ---- relative paths --------------------------------------------------------------------------


def test_local_paths_are_relative_to_the_file(tmp_path: Path) -> None:
    sub = tmp_path / "site"
    sub.mkdir()
    (sub / "fleet.yaml").write_text(
        textwrap.dedent(
            """\
            version: 1
            ssh: {identity_file: keys/id_ed25519, known_hosts: /etc/ssh/known}
            jump_hosts:
              gw: {host: gw, identity_file: ../gw_key}
            nodes:
              - {name: a, host: h, ssh: {jump_host: gw, known_hosts: known_hosts}}
              - {name: b, host: h2, ssh: {identity_file: ~/.ssh/other}}
            """
        )
    )
    fleet = load_fleet(sub / "fleet.yaml")
    a = fleet.ssh_settings("a")
    assert a.identity_file == str(sub / "keys" / "id_ed25519")
    assert a.known_hosts == str(sub / "known_hosts")
    assert a.jump is not None and a.jump.identity_file == str(tmp_path / "gw_key")
    b = fleet.ssh_settings("b")
    assert b.identity_file == os.path.expanduser("~/.ssh/other")
    assert b.known_hosts == "/etc/ssh/known"
    # the model keeps the anchored path, so a dump can be read from anywhere
    assert fleet.ssh.identity_file == str(sub / "keys" / "id_ed25519")
    assert fleet.nodes[1].ssh is not None and fleet.nodes[1].ssh.identity_file == "~/.ssh/other"


# ---- the error object ------------------------------------------------------------------------


def test_spec_error_lists_sorted_unique_issues() -> None:
    a = SpecIssue("f.yaml", 3, 1, "x", "later")
    b = SpecIssue("f.yaml", 1, 5, "y", "first", "a hint")
    c = SpecIssue("f.yaml", 0, 0, "", "whole file")
    err = SpecError([a, b, c, a])
    assert err.errors == [b, a, c]
    assert str(err) == "f.yaml:1:5: y: first; a hint\nf.yaml:3:1: x: later\nf.yaml: whole file"
    assert b.to_json() == {
        "file": "f.yaml",
        "line": 1,
        "column": 5,
        "path": "y",
        "message": "first",
        "hint": "a hint",
    }


def test_terminal_control_characters_are_never_printed() -> None:
    (line,) = errors_of('version: 1\nnodes:\n  - {name: a, host: "\\e[2Jx"}\n')
    assert "\x1b" not in line
    assert "\\x1b[2Jx" in line
