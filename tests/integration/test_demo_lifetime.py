"""`gpuops demo` never outlives its terminal (issue 18 item 6): without a terminal it refuses before
starting anything; when the terminal hangs up (SIGHUP) or the demo is killed outright, its
simulated fleet ends and its /tmp/gpuops-demo-* directory goes. A real `gpuops demo` process,
on a real pseudo-terminal, with TMPDIR pointed at the test's own directory."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(120)


def _env(tmp: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(tmp), "COLUMNS": "120", "LINES": "40", "TERM": "xterm-256color"}


def _assert_removed(directory: Path, within: float) -> None:
    """The fleet's directory is gone within `within` seconds (its fleet removes it)."""
    deadline = time.monotonic() + within
    while directory.exists():
        if time.monotonic() >= deadline:
            left = sorted(p.name for p in directory.iterdir()) if directory.exists() else []
            raise AssertionError(f"{directory} left behind: {left}")
        time.sleep(0.1)


def _fleet_of(demo: int, deadline_s: float) -> tuple[int, Path]:
    """The demo's fleet process (its child running simfleet serve) and its --dir, once started."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        found = subprocess.run(["pgrep", "-P", str(demo), "-f", "gpuops.simfleet serve"], capture_output=True)
        for pid in found.stdout.split():
            argv = Path(f"/proc/{int(pid)}/cmdline").read_bytes().split(b"\0")
            return int(pid), Path(argv[argv.index(b"--dir") + 1].decode())
        time.sleep(0.05)
    pytest.fail(f"no simulated fleet under pid {demo} within {deadline_s:g}s")


def _ended(pid: int, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return True
        if state == "Z":  # ended, not yet reaped by its (re)parent
            return True
        time.sleep(0.1)
    return False


def _drain(fd: int, seconds: float) -> bytes:
    """Read what the demo draws, so it never blocks on a full terminal."""
    out = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                out += os.read(fd, 1 << 16)
            except OSError:
                break
    return out


def _demo_on_a_pty(tmp: Path, *args: str) -> tuple[subprocess.Popen[bytes], int]:
    master, slave = os.openpty()
    demo = subprocess.Popen(
        [sys.executable, "-m", "gpuops", "demo", "-n", "2", *args],
        stdin=slave,
        stdout=slave,
        stderr=slave,
        cwd=REPO,
        env=_env(tmp),
        start_new_session=True,
    )
    os.close(slave)
    return demo, master


def test_demo_without_a_terminal_refuses_and_leaves_nothing(tmp_path: Path) -> None:
    # As reported: stdout redirected, stdin and stderr still the terminal.
    master, slave = os.openpty()
    try:
        demo = subprocess.run(
            [sys.executable, "-m", "gpuops", "demo", "-n", "2"],
            stdin=slave,
            stdout=subprocess.PIPE,
            stderr=slave,
            cwd=REPO,
            env=_env(tmp_path),
            timeout=60,
        )
        said = _drain(master, 0.5).decode(errors="replace")
    finally:
        os.close(slave)
        os.close(master)
    assert demo.returncode == 2, said
    assert demo.stdout == b""
    lines = [line for line in said.splitlines() if line.strip()]
    assert len(lines) == 1, said
    assert "stdout is not a terminal" in lines[0] and "gpuops demo --plain" in lines[0]
    assert list(tmp_path.iterdir()) == []
    # Nothing at all is a terminal (CI): the same.
    piped = subprocess.run(
        [sys.executable, "-m", "gpuops", "demo", "-n", "2"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env=_env(tmp_path),
        timeout=60,
    )
    assert piped.returncode == 2 and piped.stdout == b""
    assert piped.stderr.decode().strip().count("\n") == 0 and "gpuops demo --plain" in piped.stderr.decode()
    assert list(tmp_path.iterdir()) == []


def test_demo_help_says_plain_is_needed_without_a_terminal(tmp_path: Path) -> None:
    # The help called --plain "the default without a terminal", where the demo refuses instead.
    shown = subprocess.run(
        [sys.executable, "-m", "gpuops", "demo", "--help"],
        capture_output=True,
        stdin=subprocess.DEVNULL,
        cwd=REPO,
        env={**_env(tmp_path), "COLUMNS": "200"},
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    (line,) = [line for line in shown.stdout.decode().splitlines() if "--plain" in line]
    words = " ".join(line.strip("│ ").split())
    assert "the default without a terminal" not in words
    assert "without a terminal the demo refuses to start unless given --plain" in words


@pytest.mark.parametrize("when", ["starting", "on screen"])
def test_hang_up_ends_the_fleet_and_removes_its_directory(tmp_path: Path, when: str) -> None:
    demo, master = _demo_on_a_pty(tmp_path)
    try:
        fleet, directory = _fleet_of(demo.pid, 30)
        assert directory.parent == tmp_path and directory.name.startswith("gpuops-demo-")
        if when == "on screen":
            seen = b""
            deadline = time.monotonic() + 40
            while b"sim-" not in seen.split(b"loopback", 1)[-1]:
                assert time.monotonic() < deadline, seen[-2000:]
                seen += _drain(master, 0.2)
        # The terminal closes: its side goes away and the session gets SIGHUP.
        os.close(master)
        master = -1
        demo.send_signal(signal.SIGHUP)
        demo.wait(timeout=30)
        assert _ended(fleet, 20), f"fleet pid {fleet} still runs after the demo's SIGHUP"
        _assert_removed(directory, 10)
    finally:
        if master >= 0:
            os.close(master)
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def test_a_killed_demo_takes_its_fleet_along(tmp_path: Path) -> None:
    """SIGKILL leaves the demo no chance to clean up: the fleet notices and does it."""
    demo, master = _demo_on_a_pty(tmp_path)
    try:
        fleet, directory = _fleet_of(demo.pid, 30)
        _drain(master, 3)
        demo.kill()
        demo.wait(timeout=10)
        assert _ended(fleet, 20), f"fleet pid {fleet} outlived the killed demo"
        _assert_removed(directory, 30)
    finally:
        os.close(master)


# What a demo's launching thread may do: start the tied fleet and end while the process goes on.
_LAUNCH_FROM_A_THREAD = """
import sys, threading, time
from pathlib import Path
from gpuops.simfleet import launch
started = []
worker = threading.Thread(target=lambda: started.append(launch(Path(sys.argv[1]), "silos", 2, tied=True)))
worker.start()
worker.join()
print(started[0].pid, flush=True)
time.sleep(600)
"""


def test_the_fleet_is_tied_to_the_process_not_to_the_thread_that_started_it(tmp_path: Path) -> None:
    """The cause of the killed demo's leftover directory: PR_SET_PDEATHSIG signals the death of
    the *thread* that forked the fleet. A SIGKILLed demo's threads end one by one; when its main
    thread went first, the fleet got SIGTERM while its parent (a surviving thread of the same
    process) still ran, so it stopped without removing the directory, thinking the demo would.
    Here the launching thread ends for good while its process lives: the fleet must go on, and
    go (with its directory) when the process is killed."""
    directory = tmp_path / "fleet"
    holder = subprocess.Popen(
        [sys.executable, "-c", _LAUNCH_FROM_A_THREAD, str(directory)],
        stdout=subprocess.PIPE,
        cwd=REPO,
        env=_env(tmp_path),
    )
    try:
        assert holder.stdout is not None
        fleet = int(holder.stdout.readline())
        assert not _ended(fleet, 2), "the fleet stopped when the thread that launched it ended"
        assert (directory / "fleet.yaml").exists()
        holder.kill()
        holder.wait(timeout=10)
        assert _ended(fleet, 20), f"fleet pid {fleet} outlived the killed process"
        _assert_removed(directory, 30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


# A demo that stops its tied fleet and is SIGKILLed just after the fleet has exited, before its
# own clean-up runs (the terminal's whole process group killed while `stop` waits).
_KILLED_WHILE_STOPPING = """
import os, signal, sys
from pathlib import Path
from gpuops.simfleet import launch, runner
directory = Path(sys.argv[1])
started = launch(directory, "silos", 2, tied=True)
real = runner._terminate

def terminate_then_die(pid, timeout):
    real(pid, timeout)  # SIGTERM, and wait until the fleet has exited
    os.kill(os.getpid(), signal.SIGKILL)

runner._terminate = terminate_then_die
runner.stop(directory)
"""


def test_a_demo_killed_while_it_stops_its_fleet_leaves_no_directory(tmp_path: Path) -> None:
    """The fleet used to check its lifeline as it exited, while the demo (stopping it) still held
    the other end, and left the directory to the demo; killed right then, nobody removed it. The
    demo now lets go of the lifeline before SIGTERM: the fleet removes its directory itself."""
    directory = tmp_path / "fleet"
    demo = subprocess.run(
        [sys.executable, "-c", _KILLED_WHILE_STOPPING, str(directory)],
        cwd=REPO,
        env=_env(tmp_path),
        capture_output=True,
        timeout=120,
    )
    assert demo.returncode == -signal.SIGKILL, demo.stderr
    _assert_removed(directory, 30)
