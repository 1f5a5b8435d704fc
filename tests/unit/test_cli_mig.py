"""`gpuops mig ...` through the real typer app, and once as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpuops.cli.main import app
from gpuops.core.mig.catalog import MODELS

runner = CliRunner()

ISSUE_LAYOUT = [
    "  2g.10gb  id 14  slices 0-1  (start 0, size 2)",
    "  1g.5gb   id 19  slice 2     (start 2, size 1)",
    "  1g.5gb   id 19  slice 3     (start 3, size 1)",
    "  3g.20gb  id 9   slices 4-7  (start 4, size 4)",
    "  [0 0 1 2 3 3 3 3]",
]


def run(*args: str):  # type: ignore[no-untyped-def]
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_check_prints_the_placement() -> None:
    r = run("mig", "check", "A100-40GB", "3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb")
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert lines[0] == "A100-SXM4-40GB: 4 instances fit (8/8 memory slices, 7/7 compute slices)"
    assert lines[1:6] == ISSUE_LAYOUT
    assert lines[6] == "  create: nvidia-smi mig -cgi 14:0,19:2,19:3,9:4 -C"
    assert r.stderr == ""


def test_check_is_order_independent_and_takes_ids() -> None:
    a = run("mig", "check", "A100-40GB", "3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb")
    b = run("mig", "check", "a100-sxm4-40gb", "1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb")
    c = run("mig", "check", "NVIDIA A100-SXM4-40GB", "19", "9", "19", "14")
    assert a.exit_code == b.exit_code == c.exit_code == 0
    assert a.stdout == b.stdout == c.stdout


def test_check_refuses_with_one_line_reason() -> None:
    r = run("mig", "check", "A100-40GB", "4g.20gb", "4g.20gb")
    assert r.exit_code == 1
    assert r.stdout == ""
    assert r.stderr == "error: 4g.20gb: at most 1 per GPU (asked for 2)\n"


def test_check_pinned_placements() -> None:
    r = run("mig", "check", "A100-40GB", "3g.20gb:0", "3g.20gb")
    assert r.exit_code == 0, r.output
    assert "  3g.20gb  id 9   slices 0-3  (start 0, size 4)  pinned" in r.stdout
    assert "  3g.20gb  id 9   slices 4-7  (start 4, size 4)\n" in r.stdout
    r = run("mig", "check", "A100-40GB", "3g.20gb:0", "2g.10gb", "1g.5gb", "1g.5gb")
    assert r.exit_code == 1
    assert r.stderr.startswith("error: no arrangement of 2g.10gb, 1g.5gb x2 fits around 3g.20gb@0")
    assert r.stderr.count("\n") == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["3g.20gb:2"], "error: 3g.20gb cannot start at memory slice 2 (allowed starts 0, 4)"),
        (
            ["3g.20gb:x"],
            "error: '3g.20gb:x': the start after ':' must be a memory-slice number, e.g. 3g.20gb:0",
        ),
        (["3g.20gb:-1"], "error: '3g.20gb:-1': the start after ':' must be a memory-slice number"),
        (
            ["3g.40gb"],
            "error: unknown profile '3g.40gb' for A100-SXM4-40GB; valid: 1g.5gb (19), 1g.5gb+me (20)",
        ),
        (["[/]"], "error: unknown profile '[/]' for A100-SXM4-40GB"),
        (["1g.5gb:0", "1g.5gb:0"], "error: 1g.5gb@0 overlaps 1g.5gb@0 (memory slice 0)"),
        (["7g.40gb", "1g.5gb"], "error: needs 9 memory slices (7g.40gb: 8, 1g.5gb: 1), the GPU has 8"),
        ([":3"], "error: unknown profile '' for A100-SXM4-40GB"),
    ],
)
def test_check_bad_input_is_one_line(args: list[str], message: str) -> None:
    r = run("mig", "check", "A100-40GB", *args)
    assert r.exit_code == 1
    assert r.stderr.startswith(message), r.stderr
    assert r.stderr.count("\n") == 1


def test_unknown_model_lists_the_known_ones() -> None:
    r = run("mig", "check", "V100", "1g.5gb")
    assert r.exit_code == 1
    assert r.stderr.startswith("error: unknown GPU model 'V100'; known: ")
    for key in MODELS:
        assert key in r.stderr
    assert r.stderr.count("\n") == 1
    r = run("mig", "profiles", "[bold]x")
    assert r.exit_code == 1 and "'[bold]x'" in r.stderr


def test_missing_arguments_are_usage_errors() -> None:
    assert run("mig", "check", "A100-40GB").exit_code == 2
    assert run("mig", "check").exit_code == 2
    assert run("mig", "profiles").exit_code == 2


def test_check_json() -> None:
    r = run("mig", "check", "A100-40GB", "3g.20gb:4", "2g.10gb", "1g.5gb", "1g.5gb", "--json")
    assert r.exit_code == 0
    doc = json.loads(r.stdout)
    assert doc["ok"] is True and doc["reason"] == "" and doc["model"] == "A100-SXM4-40GB"
    assert [
        (p["profile"], p["profile_id"], p["start"], p["size"], p["pinned"]) for p in doc["placements"]
    ] == [
        ("2g.10gb", 14, 0, 2, False),
        ("1g.5gb", 19, 2, 1, False),
        ("1g.5gb", 19, 3, 1, False),
        ("3g.20gb", 9, 4, 4, True),
    ]
    assert doc["slice_map"] == [0, 0, 1, 2, 3, 3, 3, 3]
    assert doc["memory_slices"] == {"used": 8, "total": 8}
    assert doc["compute_slices"] == {"used": 7, "total": 7}

    r = run("mig", "check", "A100-40GB", "4g.20gb", "4g.20gb", "--json")
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and doc["reason"] == "4g.20gb: at most 1 per GPU (asked for 2)"
    assert doc["placements"] == [] and doc["slice_map"] == []


def test_check_a30_and_free_slices() -> None:
    r = run("mig", "check", "A30", "2g.12gb", "1g.6gb")
    assert r.exit_code == 0
    assert "A30-24GB: 2 instances fit (3/4 memory slices, 3/4 compute slices)" in r.stdout
    assert "  [0 0 1 .]" in r.stdout


@pytest.mark.parametrize("key", list(MODELS))
def test_profiles_table(key: str) -> None:
    model = MODELS[key]
    for spelling in model.names:
        r = run("mig", "profiles", spelling)
        assert r.exit_code == 0, r.output
        assert r.stdout.startswith(model.key)
        for p in model.profiles:
            assert p.name in r.stdout
            assert str(p.memory_mib) in r.stdout


def test_profiles_json_is_the_catalog() -> None:
    for model in MODELS.values():
        r = run("mig", "profiles", model.key, "--json")
        assert r.exit_code == 0
        doc = json.loads(r.stdout)
        assert doc["model"] == model.key
        assert doc["pci_device_ids"] == [f"0x{i:08X}" for i in model.pci_device_ids]
        for got, p in zip(doc["profiles"], model.profiles, strict=True):
            assert (got["id"], got["enum"], got["name"], got["memory_mib"]) == (
                p.id,
                p.enum,
                p.name,
                p.memory_mib,
            )
            assert got["multiprocessor_count"] == p.multiprocessor_count
            assert got["placements"] == list(p.placements)
            assert got["engines"]["ofa"] == p.engines.ofa
            assert got["inferred"] == p.inferred
            assert [c["name"] for c in got["compute_profiles"]] == [c.name for c in p.compute_profiles]


def test_profiles_shows_a100_rows() -> None:
    r = run("mig", "profiles", "A100-40GB")
    rows = {line.split()[1]: line.split() for line in r.stdout.splitlines() if line[:3].strip().isdigit()}
    assert rows["1g.5gb"][:8] == ["19", "1g.5gb", "1/1", "4864", "14", "0/1/0/0", "7", "0-6"]
    assert rows["3g.20gb"][:8] == ["9", "3g.20gb", "3/4", "19968", "42", "2/3/0/0", "2", "0,4"]
    assert rows["7g.40gb"][:8] == ["0", "7g.40gb", "7/8", "40192", "98", "5/7/1/1", "1", "0"]


def test_models() -> None:
    r = run("mig", "models")
    assert r.exit_code == 0
    for key in MODELS:
        assert key in r.stdout


def test_help() -> None:
    r = run("mig", "--help")
    assert r.exit_code == 0
    for cmd in ("check", "profiles", "models"):
        assert cmd in r.stdout


# ------------------------------------------------------------------------------------------
# A real process: `python -m gpuops mig check ...`.


def _gpuops(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "100", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


def test_subprocess_check() -> None:
    ok = _gpuops("mig", "check", "A100-40GB", "1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.splitlines()[1:6] == ISSUE_LAYOUT
    assert ok.stderr == ""

    bad = _gpuops("mig", "check", "A100-40GB", "4g.20gb", "4g.20gb")
    assert bad.returncode == 1
    assert bad.stderr == "error: 4g.20gb: at most 1 per GPU (asked for 2)\n"
    assert bad.stdout == ""

    unknown = _gpuops("mig", "check", "Z9000", "1g.5gb")
    assert unknown.returncode == 1
    assert "Traceback" not in unknown.stderr
    assert unknown.stderr.startswith("error: unknown GPU model 'Z9000'; known: A100-SXM4-40GB")

    js = _gpuops("mig", "check", "H100-80GB", "1g.10gb:6", "3g.40gb", "--json")
    assert js.returncode == 0
    doc = json.loads(js.stdout)
    assert [(p["profile"], p["start"]) for p in doc["placements"]] == [("3g.40gb", 0), ("1g.10gb", 6)]


def test_models_lists_every_id_nvidia_configs_name() -> None:
    r = run("mig", "models")
    rows = {line.split()[0]: line for line in r.stdout.splitlines() if line.strip()}
    assert "2321 233A" in rows["H100-NVL-94GB"] and "2348" in rows["GH200-144GB"]
    assert "2BB5" in rows["RTX-PRO-6000-96GB"] and "4/4" in rows["RTX-PRO-6000-96GB"]
    for key, device in (("B200", "2901"), ("GB200", "2941"), ("B300", "3182"), ("GB300", "31C2")):
        assert device in rows[key]


def test_check_on_the_rtx_pro_6000_counts_media_engines() -> None:
    assert run("mig", "check", "RTX-PRO-6000", "1g.24gb-me", "1g.24gb-me", "2g.48gb+me.all").exit_code == 0
    r = run("mig", "check", "RTX-PRO-6000", "1g.24gb+me.all", "1g.24gb", "2g.48gb")
    assert (
        r.exit_code == 1
        and r.stderr == "error: needs 7 decoders (2g.48gb: 2, 1g.24gb: 1, 1g.24gb+me.all: 4), the GPU has 4\n"
    )
