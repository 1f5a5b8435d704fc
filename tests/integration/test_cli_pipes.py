"""The fleet commands with their standard output on a pipe, as scripts run them (`| jq .`).

A real `gpuops` process against the simulated demo fleet (8 nodes over real SSH on loopback):
its `discover --json` is about 150 kB, more than a pipe holds, so the command has to wait for
its reader, which is where output used to be lost. PYTHONUNBUFFERED=1 is set as on the machines
that reported it: Python's unbuffered stdout drops the rest of a short write, the buffered one
writes it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.simfleet import launch, running_pid, stop
from tests.agent_helpers import REPO

PIPE_CAPACITY = 65536  # Linux's default: output beyond it waits for the reader
READ_DEADLINE = 90.0  # seconds for one command and its slow reader, end to end


@pytest.fixture(scope="module")
def demo_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    directory = tmp_path_factory.mktemp("demo-fleet")
    launch(directory, "silos", timeout=60)
    try:
        yield directory / "fleet.yaml"
    finally:
        stop(directory)
        assert running_pid(directory) is None


def _start(*args: str, stdout: int = subprocess.PIPE) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuops", *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        cwd=REPO,
        env={**os.environ, "COLUMNS": "200", "PYTHONUNBUFFERED": "1"},
    )


def _read_slowly(process: subprocess.Popen[bytes], wait_first: float, fd: int | None = None) -> bytes:
    """All of `process`'s stdout (or of `fd`), read as a slow consumer does: nothing for
    `wait_first` seconds, then 4 KiB at a time with a pause after each read, within READ_DEADLINE."""
    if fd is None:
        assert process.stdout is not None
        fd = process.stdout.fileno()
    deadline = time.monotonic() + READ_DEADLINE
    time.sleep(wait_first)
    chunks = []
    while time.monotonic() < deadline:
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        time.sleep(0.002)
    process.kill()
    pytest.fail(f"output not finished within {READ_DEADLINE:.0f}s")


def _finish(process: subprocess.Popen[bytes]) -> tuple[int, str]:
    assert process.stderr is not None
    stderr = process.stderr.read().decode(errors="replace")
    return process.wait(timeout=30), stderr


@pytest.mark.parametrize("wait_first", [3.0, 0.0, 0.5])
def test_discover_json_reaches_a_slow_reader_whole(demo_fleet: Path, wait_first: float) -> None:
    """Reading late (the whole document is written into a full pipe) and reading all along (the
    write waits for the reader again and again): every byte arrives, exit 0."""
    process = _start("discover", "-f", str(demo_fleet), "--json", "--timeout", "60")
    out = _read_slowly(process, wait_first)
    code, stderr = _finish(process)
    assert code == 0, stderr
    document = json.loads(out)  # cut short, it does not parse
    assert len(document["nodes"]) == 8
    assert len(out) > PIPE_CAPACITY, "the document must not fit in the pipe, or nothing is tested"


def test_a_pipe_left_non_blocking_still_gets_everything(demo_fleet: Path) -> None:
    """O_NONBLOCK belongs to the open pipe, not to one process: any other writer sharing it (a
    child, a shell's other job) can set it. The command then waits for the reader all the same."""
    read_end, write_end = os.pipe()
    try:
        os.set_blocking(write_end, False)
        process = _start("discover", "-f", str(demo_fleet), "--json", "--timeout", "60", stdout=write_end)
        os.close(write_end)
        write_end = -1
        out = _read_slowly(process, 3.0, fd=read_end)
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    code, stderr = _finish(process)
    assert code == 0, stderr
    assert len(json.loads(out)["nodes"]) == 8


def test_a_reader_that_leaves_ends_the_command_quietly_non_zero(demo_fleet: Path) -> None:
    """`| head -c 100`: the command stops at the broken pipe, without a traceback, and does not
    claim success for output nobody read."""
    process = _start("discover", "-f", str(demo_fleet), "--json", "--timeout", "60")
    assert process.stdout is not None
    time.sleep(3.0)
    assert len(process.stdout.read(100)) == 100
    process.stdout.close()
    code, stderr = _finish(process)
    assert code == 1
    assert stderr == ""


def test_a_failed_write_is_one_line_and_exit_1() -> None:
    """/dev/full: the write fails with ENOSPC; one line says so, no traceback."""
    with open("/dev/full", "wb") as full:
        result = subprocess.run(
            [sys.executable, "-m", "gpuops", "discover", "--local", "--backend", "sim", "--json"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert lines == ["error: cannot write to standard output: No space left on device"], result.stderr
