"""`gpuops validate` and `gpuops schema`: through typer, and once as a real `python -m gpuops`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpuops.cli import spec as spec_cli
from gpuops.spec import fleet_json_schema

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "fleet.yaml"

app = typer.Typer(pretty_exceptions_enable=False)


@app.callback()
def _root() -> None:
    """Test app holding only the spec commands."""


spec_cli.register(app)
runner = CliRunner()

BAD = """\
version: 1
teams:
  vision: {users: [alice]}
nodes:
  - name: a
    host: 10.0.0.1
    port: 70000
  - name: b
    host: 10.0.0.2
    owner: visoin
"""


def run(*args: str, stdin: str | None = None) -> Any:
    result = runner.invoke(app, list(args), input=stdin)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_validate_ok(in_tmp: Path) -> None:
    (in_tmp / "fleet.yaml").write_text(EXAMPLE.read_text())
    r = run("validate", "fleet.yaml")
    assert r.exit_code == 0
    assert r.stdout == "fleet.yaml: OK \u2014 8 nodes, 4 teams\n"
    assert r.stderr == ""


def test_validate_singular(in_tmp: Path) -> None:
    (in_tmp / "one.yaml").write_text("version: 1\nteams: {a: {}}\nnodes: [{host: h}]\n")
    assert run("validate", "one.yaml").stdout == "one.yaml: OK \u2014 1 node, 1 team\n"


def test_validate_errors(in_tmp: Path) -> None:
    (in_tmp / "fleet.yaml").write_text(BAD)
    r = run("validate", "fleet.yaml")
    assert r.exit_code == 1
    assert r.stdout == ""
    assert r.stderr.splitlines() == [
        "fleet.yaml:7:11: nodes[0].port: must be between 1 and 65535 (got 70000)",
        "fleet.yaml:10:12: nodes[1].owner: no team named 'visoin'; did you mean 'vision'?",
    ]


def test_validate_missing_file(in_tmp: Path) -> None:
    r = run("validate", "nope.yaml")
    assert (r.exit_code, r.stdout, r.stderr) == (1, "", "nope.yaml: no such file\n")


def test_validate_directory(in_tmp: Path) -> None:
    r = run("validate", ".")
    assert (r.exit_code, r.stderr) == (1, ".: is a directory, not a file\n")


def test_validate_several_files(in_tmp: Path) -> None:
    (in_tmp / "good.yaml").write_text("version: 1\nnodes: []\n")
    (in_tmp / "bad.yaml").write_text("version: 1\n")
    r = run("validate", "good.yaml", "bad.yaml")
    assert r.exit_code == 1
    assert r.stdout == "good.yaml: OK \u2014 0 nodes, 0 teams\n"
    assert r.stderr == (
        "bad.yaml:1:1: missing required key 'nodes'; "
        "list the GPU servers under nodes:, each with at least a host\n"
    )


def test_validate_stdin() -> None:
    r = run("validate", "-", stdin="version: 1\nnodes: [{host: h, port: 0}]\n")
    assert r.exit_code == 1
    assert r.stderr == "<stdin>:2:25: nodes[0].port: must be between 1 and 65535 (got 0)\n"


def test_validate_json(in_tmp: Path) -> None:
    (in_tmp / "fleet.yaml").write_text(BAD)
    (in_tmp / "good.yaml").write_text("version: 1\nnodes: [{host: h}]\n")
    r = run("validate", "--json", "good.yaml", "fleet.yaml")
    assert r.exit_code == 1
    assert r.stderr == ""
    assert json.loads(r.stdout) == {
        "ok": False,
        "files": [
            {"file": "good.yaml", "ok": True, "nodes": 1, "teams": 0, "errors": [], "warnings": []},
            {
                "file": "fleet.yaml",
                "ok": False,
                "errors": [
                    {
                        "file": "fleet.yaml",
                        "line": 7,
                        "column": 11,
                        "path": "nodes[0].port",
                        "message": "must be between 1 and 65535 (got 70000)",
                        "hint": "",
                    },
                    {
                        "file": "fleet.yaml",
                        "line": 10,
                        "column": 12,
                        "path": "nodes[1].owner",
                        "message": "no team named 'visoin'",
                        "hint": "did you mean 'vision'?",
                    },
                ],
            },
        ],
    }


def test_validate_needs_a_file() -> None:
    r = runner.invoke(app, ["validate"])
    assert r.exit_code == 2
    assert "Traceback" not in r.output


def test_an_internal_error_is_one_line(in_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(path: str) -> None:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr(spec_cli, "load_fleet", broken)
    r = run("validate", "fleet.yaml")
    assert r.exit_code == 1
    assert r.stderr == "fleet.yaml: internal error (RuntimeError: boom\\nsecond line); please report this\n"


def test_schema_prints_the_json_schema() -> None:
    r = run("schema")
    assert r.exit_code == 0
    assert json.loads(r.stdout) == fleet_json_schema()


def test_schema_to_a_file(in_tmp: Path) -> None:
    r = run("schema", "-o", "fleet.schema.json")
    assert (r.exit_code, r.stdout) == (0, "")
    assert json.loads((in_tmp / "fleet.schema.json").read_text()) == fleet_json_schema()


def test_schema_to_a_file_that_cannot_be_written(in_tmp: Path) -> None:
    r = run("schema", "-o", "no/such/dir/schema.json")
    assert r.exit_code == 1
    assert r.stderr == "no/such/dir/schema.json: cannot write: No such file or directory\n"


# ---- as a real process ----------------------------------------------------------------------


def _registered() -> bool:
    from gpuops.cli.main import COMMANDS

    return any(entry.name == "validate" for entry in COMMANDS)


needs_registration = pytest.mark.skipif(
    not _registered(),
    reason="validate is not yet listed in COMMANDS of gpuops/cli/main.py",
)


def _gpuops(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
    )


@needs_registration
def test_python_m_gpuops_validate(in_tmp: Path) -> None:
    (in_tmp / "fleet.yaml").write_text(EXAMPLE.read_text())
    (in_tmp / "bad.yaml").write_text(BAD)
    ok = _gpuops("validate", "fleet.yaml", cwd=in_tmp)
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "fleet.yaml: OK \u2014 8 nodes, 4 teams\n", "")
    bad = _gpuops("validate", "bad.yaml", cwd=in_tmp)
    assert bad.returncode == 1 and bad.stdout == ""
    assert (
        bad.stderr.splitlines()[0] == "bad.yaml:7:11: nodes[0].port: must be between 1 and 65535 (got 70000)"
    )
    missing = _gpuops("validate", "nope.yaml", cwd=in_tmp)
    assert (missing.returncode, missing.stderr) == (1, "nope.yaml: no such file\n")
    ascii_only = _gpuops("validate", "fleet.yaml", cwd=in_tmp, PYTHONIOENCODING="ascii")
    assert (ascii_only.returncode, ascii_only.stdout) == (0, "fleet.yaml: OK - 8 nodes, 4 teams\n")
    schema = _gpuops("schema", cwd=in_tmp)
    assert schema.returncode == 0 and json.loads(schema.stdout)["title"] == "gpuops fleet.yaml"


DRIVER_FLEET = """\
version: 1
teams: {{vision: {{users: [alice]}}, nlp: {{users: [bob]}}}}
nodes:
  - {{name: gpu-a-01, host: h1, labels: {{model: h100-80gb}}}}
carve:
  - select: {{nodes: gpu-a-01}}
    limiter:
      tenants:
        vision: {{memory: {vision}, compute: 50%}}
        nlp: {{memory: {nlp}, compute: 50%}}
"""


def test_validate_warns_of_caps_that_add_up_to_more_than_the_driver_leaves(in_tmp: Path) -> None:
    """An H100 has 79.65 GiB; its driver keeps 480 MiB (docs/gpu-runs/2026-11-26b): caps adding up
    to 79.5 GiB each fit the card alone, but together promise memory no program can have. Said (a
    cap is a ceiling, not a reservation: over-subscribing stays the operator's choice)."""
    (in_tmp / "over.yaml").write_text(DRIVER_FLEET.format(vision="40GiB", nlp="39.5GiB"))
    r = run("validate", "over.yaml")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.splitlines() == [
        "warning: over.yaml:9:9: carve[0].limiter.tenants: the memory caps add up to 79.5GiB (vision 40GiB, "
        "nlp 39.5GiB), more than the 79.18GiB the driver leaves of the H100-80GB (79.65GiB less 480MiB it "
        "reserves, default: H100 80GB, driver 580.159.04): they are no promise, the tenant that allocates "
        "last can meet the driver's out-of-memory error under its cap, on the GPUs of gpu-a-01; each cap "
        "includes its processes' CUDA contexts (518MiB each) and '*' counts once; lower the caps for each "
        "to hold on a full GPU"
    ]
    (in_tmp / "fits.yaml").write_text(DRIVER_FLEET.format(vision="40GiB", nlp="39GiB"))
    ok = run("validate", "fits.yaml")
    assert ok.exit_code == 0, ok.stderr
    assert ok.stderr == ""


def test_validate_warns_of_a_cap_smaller_than_one_context(in_tmp: Path) -> None:
    """A cap of 256 MiB cannot hold an H100's CUDA context (518 MiB): said, the file still valid."""
    (in_tmp / "small.yaml").write_text(DRIVER_FLEET.format(vision="256MiB", nlp="1GiB"))
    r = run("validate", "small.yaml")
    assert r.exit_code == 0, r.stderr
    assert r.stderr.splitlines() == [
        "warning: small.yaml:9:26: carve[0].limiter.tenants.vision.memory: a cap of 256MiB is less than one "
        "CUDA context on the H100-80GB (518MiB, default: H100 80GB, driver 580.159.04): no program of vision "
        "can start there, on the GPUs of gpu-a-01; a cap bounds the tenant's whole footprint, its processes' "
        "contexts included"
    ]
    doc = json.loads(run("validate", "--json", "small.yaml").stdout)
    assert doc["ok"] and len(doc["files"][0]["warnings"]) == 1
