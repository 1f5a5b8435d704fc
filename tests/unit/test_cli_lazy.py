"""Command modules are imported only when their command runs (gpuops/cli/main.py), and `gpuops
agent` becomes the node's own entry: what each start pays for, checked in real processes."""

from __future__ import annotations

import json
import os
import pkgutil
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import gpuops.cli
from gpuops.cli.main import COMMANDS, load_module_commands

REPO = Path(__file__).resolve().parents[2]
# The operator side a light command must not pay for at start. pydantic itself is not listed:
# typer (0.2x) coerces every parameter through a pydantic TypeAdapter, so any command with options
# imports it; gpuops.spec is the project's own pydantic models (and ruamel).
HEAVY = ("textual", "asyncssh", "ruamel", "gpuops.spec", "gpuops.fleet", "gpuops.tui", "gpuops.views")
REPORT = (
    "import atexit, json, os, sys\n"
    "atexit.register(lambda: open(os.environ['MODULES_OUT'], 'w').write(json.dumps(sorted(sys.modules))))\n"
    "sys.argv[0] = 'gpuops'\n"
    "from gpuops.cli.main import main\n"
    "main()\n"
)


def _command_modules() -> list[str]:
    """Every module of gpuops/cli that registers commands, whether or not the table names it."""
    names = []
    for info in pkgutil.iter_modules(gpuops.cli.__path__, "gpuops.cli."):
        source = Path(gpuops.cli.__path__[0], info.name.rsplit(".", 1)[1] + ".py").read_text(encoding="utf-8")
        if re.search(r"^def register\(app", source, re.MULTILINE):
            names.append(info.name)
    return names


def _real_commands() -> dict[str, object]:
    commands: dict[str, object] = {}
    for module in _command_modules():
        commands.update(load_module_commands(module))
    return commands


def _gpuops(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuops", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )


def test_the_table_names_every_command_of_every_module() -> None:
    real = _real_commands()
    table = {entry.name: entry.module for entry in COMMANDS}
    assert sorted(table) == sorted(real)
    assert len(table) == len(COMMANDS)  # no name twice
    for entry in COMMANDS:
        assert entry.name in load_module_commands(entry.module), entry


def test_each_summary_is_the_start_of_the_commands_own_help() -> None:
    real = _real_commands()
    for entry in COMMANDS:
        command = real[entry.name]
        own = " ".join((getattr(command, "help", None) or "").split())
        assert own.startswith(entry.summary), (entry.name, own, entry.summary)


def test_help_lists_every_command_with_its_summary() -> None:
    done = _gpuops("--help", COLUMNS="400")
    assert done.returncode == 0, done.stderr
    listed = {}
    for line in done.stdout.splitlines():
        match = re.match(r"^│ (\S+) +(.+?) *│$", line)
        if match and not match.group(1).startswith("-"):
            listed[match.group(1)] = match.group(2)
    assert listed == {entry.name: entry.summary for entry in COMMANDS}
    assert sorted(listed) == sorted(_real_commands())


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["mig", "check", "A100-40GB", "3g.20gb", "3g.20gb"],
        ["agent", "--help"],
        ["limiter", "--help"],
    ],
)
def test_a_light_command_imports_no_operator_side(args: list[str], tmp_path: Path) -> None:
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", REPORT, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MODULES_OUT": str(out)},
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(out.read_text())
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == [], heavy


@pytest.mark.parametrize("command", ["tenants", "inventory", "rebalance", "plan", "assert"])
def test_help_of_a_fleet_command_does_not_load_ssh(command: str, tmp_path: Path) -> None:
    # issue 22: `--help` shows the options; the SSH client (asyncssh, ~90 ms) is for running.
    out = tmp_path / "modules.json"
    done = subprocess.run(
        [sys.executable, "-c", REPORT, command, "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "MODULES_OUT": str(out)},
    )
    assert done.returncode == 0, done.stderr
    loaded = json.loads(out.read_text())
    assert [m for m in loaded if m == "asyncssh" or m.startswith("asyncssh.")] == []


def test_a_command_loads_when_run_and_a_typo_is_still_told() -> None:
    done = _gpuops("spec-check")
    assert done.returncode == 2 and "No such command 'spec-check'" in done.stderr
    done = _gpuops("valdate", "x.yaml")
    assert done.returncode == 2 and "Did you mean 'validate'?" in done.stderr
    done = _gpuops("mig", "check", "A100-40GB", "3g.20gb", "3g.20gb", "3g.20gb")
    assert done.returncode == 1 and "Traceback" not in done.stderr


def _rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+) kB", status).group(1)) / 1024  # type: ignore[union-attr]


@pytest.mark.parametrize("mode", ["--stdio", "--metrics"])
def test_gpuops_agent_is_the_node_entry_and_holds_under_40_mb(mode: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "gpuops", "agent", "--backend", "sim"]
        command += [
            "--state-dir",
            f"{tmp}/state",
            "--limiter-dir",
            f"{tmp}/limiter",
            "--history-dir",
            f"{tmp}/h",
        ]
        if mode == "--stdio":
            proc = subprocess.Popen(
                [*command, "--stdio"],
                cwd=REPO,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(
                b'{"v":1,"id":1,"op":"hello","args":{}}\n{"v":1,"id":2,"op":"sample","args":{}}\n'
            )
            proc.stdin.flush()
            replies = [json.loads(proc.stdout.readline()) for _ in range(2)]
            assert [r["ok"] for r in replies] == [True, True], replies
        else:
            proc = subprocess.Popen(
                [*command, "--metrics", "127.0.0.1:0", "--interval", "0.5"], cwd=REPO, stderr=subprocess.PIPE
            )
            assert proc.stderr is not None
            said = [proc.stderr.readline() for _ in range(1)]
            while said[-1] and b"serving metrics on http://" not in said[-1]:
                said.append(proc.stderr.readline())
            assert said[-1], said
        try:
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
            cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")
            rss = _rss_mb(proc.pid)
        finally:
            proc.kill()
            proc.wait(timeout=20)
    # The same process, become the node's entry: none of the CLI's framework is loaded.
    assert any(b"from gpuops.node.main import main" in part for part in cmdline), cmdline
    assert "pydantic_core" not in maps
    assert rss <= 40.0, rss
