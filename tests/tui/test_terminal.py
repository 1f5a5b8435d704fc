"""The real thing in a real terminal (tmux): `gpuops demo` shows the fleet grid with its nodes and
teams within 10 s, `q` quits, and no simulated-fleet process is left behind; `gpuops tui` on this
host, and its one-line errors."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from tests.agent_helpers import REPO

pytestmark = pytest.mark.timeout(60)


class Tmux:
    """A private tmux server (its own socket) with one window running a command."""

    def __init__(self, command: str, width: int = 160, height: int = 45) -> None:
        self.socket = f"gpuops-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "TERM": "xterm-256color"}
        env.pop("TMUX", None)
        self.env = env
        self._tmux(
            "-f", "/dev/null", "new-session", "-d", "-s", "t", "-x", str(width), "-y", str(height), command
        )
        self._tmux("set-option", "-t", "t", "remain-on-exit", "on")

    def _tmux(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, env=self.env, timeout=10
        )
        if done.returncode != 0:
            raise RuntimeError(f"tmux {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "t")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "t", *keys)

    def dead(self) -> bool:
        return self._tmux("display-message", "-p", "-t", "t", "#{pane_dead}").strip() == "1"

    def wait(self, predicate: str | re.Pattern[str], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            text = self.screen()
            found = predicate.search(text) if isinstance(predicate, re.Pattern) else predicate in text
            if found:
                return text
            if time.monotonic() > deadline:
                raise AssertionError(f"not on screen within {timeout}s: {predicate!r}\n{text}")
            time.sleep(0.2)

    def kill(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=10)


@pytest.fixture
def tmux_session() -> Iterator[list[Tmux]]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed; run: bash scripts/install-test-deps.sh")
    sessions: list[Tmux] = []
    try:
        yield sessions
    finally:
        for session in sessions:
            session.kill()


def _in_repo(command: str) -> str:
    return f"cd {REPO} && exec {sys.executable} -m gpuops {command}"


def test_demo_in_a_real_terminal(tmux_session: list[Tmux]) -> None:
    started = time.monotonic()
    term = Tmux(_in_repo("demo"))
    tmux_session.append(term)
    screen = term.wait(re.compile(r"● sim-vision-01 +\d"), 10)  # a live node with figures
    assert time.monotonic() - started < 10
    for team in ("vision", "speech", "robotics", "chat", "platform", "research", "analytics"):
        assert f"▌{team}" in screen, screen
    for node in ("sim-robotics-01", "sim-platform-01", "sim-speech-01"):
        assert node in screen
    assert "48 GPUs on 8 nodes" in screen and "? help" in screen
    term.wait("8 live", 10)
    term.keys("q")
    deadline = time.monotonic() + 20
    while not term.dead():
        assert time.monotonic() < deadline, term.screen()
        time.sleep(0.2)
    after = term.screen()
    match = re.search(r"simulated fleet in (\S+) \(pid (\d+)\) stopped", after)
    assert match, after
    directory, pid = match.group(1), int(match.group(2))
    assert not Path(f"/proc/{pid}").exists()
    left = subprocess.run(["pgrep", "-f", f"simfleet serve --dir {directory}"], capture_output=True)
    assert left.returncode == 1, left.stdout


def test_demo_stops_its_fleet_when_killed(tmux_session: list[Tmux]) -> None:
    """SIGTERM (kill, a closing session manager) quits like q: the fleet is stopped too."""
    term = Tmux(_in_repo("demo -n 3"), width=120, height=30)
    tmux_session.append(term)
    term.wait(re.compile(r"● sim-\S+ +\d"), 10)
    pid = int(term._tmux("display-message", "-p", "-t", "t", "#{pane_pid}").strip())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 20
    while not term.dead():
        assert time.monotonic() < deadline, term.screen()
        time.sleep(0.2)
    match = re.search(r"simulated fleet in (\S+) \(pid (\d+)\) stopped", term.screen())
    assert match, term.screen()
    assert not Path(f"/proc/{match.group(2)}").exists()


def test_tui_on_this_host_with_the_simulated_backend(tmux_session: list[Tmux]) -> None:
    term = Tmux(_in_repo("tui --local-backend sim --interval 500ms"), width=120, height=40)
    tmux_session.append(term)
    screen = term.wait(re.compile(r"● \S+ +\d"), 15)
    assert "this host" in screen and "every 500ms" in screen
    term.keys(":", "nodes", "Enter")
    term.wait("Reason", 5)
    term.keys("q")
    deadline = time.monotonic() + 10
    while not term.dead():
        assert time.monotonic() < deadline, term.screen()
        time.sleep(0.2)


def _cli() -> typer.Typer:
    from gpuops.cli import tui

    app = typer.Typer()
    tui.register(app)

    @app.command("other")
    def other() -> None:  # a second command, so that typer keeps `tui` as a named command
        pass

    return app


def test_tui_without_a_terminal_says_so() -> None:
    result = CliRunner().invoke(_cli(), ["tui"])
    assert result.exit_code == 2
    assert "needs a terminal" in result.output and "gpuops status -f" in result.output


def test_tui_errors_are_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from gpuops.cli import tui

    monkeypatch.setattr(tui, "is_terminal", lambda: True)
    runner = CliRunner()
    missing = runner.invoke(_cli(), ["tui", "-f", str(tmp_path / "nope.yaml")])
    assert missing.exit_code == 1 and "error:" in missing.output and "Traceback" not in missing.output
    bad = runner.invoke(_cli(), ["tui", "--interval", "soon"])
    assert bad.exit_code == 2 and "--interval" in bad.output
    # No NVML here (or no GPU): one line, and a way to try it anyway.
    nvml = runner.invoke(_cli(), ["tui"])
    if nvml.exit_code == 1:
        assert "cannot read this host's GPUs" in nvml.output and "gpuops demo" in nvml.output
        assert nvml.output.count("\n") <= 2
