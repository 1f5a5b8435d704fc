"""Builds the limiter, the fake driver and the test programs, and runs real processes under
LD_PRELOAD against a fake GPU shared by all of them."""

from __future__ import annotations

import fcntl
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Optional, Sequence

import pytest

from tests.native.fakegpu import FakeGpu

ROOT = Path(__file__).resolve().parents[2]
NATIVE = ROOT / "native"
BUILD = NATIVE / "build"
TEST_BUILD = BUILD / "tests"
LIB = BUILD / "libgpuops-limiter.so"
MIB = 1 << 20


@dataclass(frozen=True)
class Built:
    lib: Path
    fake_dir: Path
    cudaprog: Path
    layout: Path


@pytest.fixture(scope="session")
def built() -> Built:
    # Other test sessions may build at the same time: one make at a time.
    BUILD.mkdir(parents=True, exist_ok=True)
    with open(BUILD / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        subprocess.run(["make", "-s", "-C", str(NATIVE)], check=True)
        fakes = ["make", "-s", "-C", str(ROOT / "tests" / "native"), f"BUILD={TEST_BUILD}"]
        subprocess.run(fakes, check=True)
    return Built(LIB, TEST_BUILD, TEST_BUILD / "cudaprog", BUILD / "gpuops-limiter-layout")


def parse(out: str) -> dict[str, list[list[str]]]:
    """'alloc 0' lines -> {'alloc': [['0'], ...]}."""
    result: dict[str, list[list[str]]] = {}
    for line in out.splitlines():
        parts = line.split()
        if parts:
            result.setdefault(parts[0], []).append(parts[1:])
    return result


class Lab:
    """One isolated node: a limiter directory, a fake GPU, and a way to run programs on it."""

    def __init__(
        self,
        built: Built,
        root: Path,
        memory: int = 1024 * MIB,
        devices: int = 1,
        context_bytes: int = 0,
        reserved: int = 0,
    ) -> None:
        self.built = built
        self.dir = root / "limiter"
        self.dir.mkdir()
        self.state = root / "fakegpu.state"
        self.memory = memory
        self.devices = devices
        # What each CUDA context costs on the fake GPU and what its driver reserves of the card:
        # none by default, so that tests of the accounting of allocations see exact figures; the
        # fake driver's own default is the H100's (tests/native/fake/fakegpu_state.c), which
        # tests of context memory ask for (test_context_memory.py).
        self.context_bytes = context_bytes
        self.reserved = reserved
        self.fake = FakeGpu(self.state)
        self.procs: list[subprocess.Popen[str]] = []

    def write_table(self, text: str) -> None:
        tmp = self.dir / "tenants.tmp"
        tmp.write_text(text)
        os.replace(tmp, self.dir / "tenants")

    def table(self, *lines: str, generation: int = 1) -> None:
        body = "\n".join(lines)
        self.write_table(f"gpuops-limiter-table 1\ngeneration {generation}\n{body}\n")

    def env(self, tenant: Optional[str] = "a", preload: bool = True, **extra: str) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPUOPS_", "CUDA_DEVICE_", "LD_PRELOAD", "FAKECUDA_"))
        }
        env.update(
            FAKECUDA_STATE=str(self.state),
            FAKECUDA_MEMORY=str(self.memory),
            FAKECUDA_DEVICES=str(self.devices),
            FAKECUDA_CONTEXT_BYTES=str(self.context_bytes),
            FAKECUDA_RESERVED=str(self.reserved),
            GPUOPS_LIMITER_DIR=str(self.dir),
            LD_LIBRARY_PATH=str(self.built.fake_dir),
        )
        if tenant is not None:
            env["GPUOPS_TENANT"] = tenant
        if preload:
            env["LD_PRELOAD"] = str(self.built.lib)
        env.update(extra)
        return env

    def run(
        self, *args: str, via: str = "linked", timeout: float = 60, wrap: Sequence[str] = (), **kw: object
    ) -> tuple[dict[str, list[list[str]]], str]:
        """Runs cudaprog (after wrap: a command that ends by exec-ing its arguments)."""
        env = self.env(**kw)  # type: ignore[arg-type]
        cmd = [*wrap, str(self.built.cudaprog), "--via", via, *args]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        assert p.returncode == 0, f"{cmd} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
        return parse(p.stdout), p.stderr

    def start(self, *args: str, via: str = "linked", **kw: object) -> subprocess.Popen[str]:
        env = self.env(**kw)  # type: ignore[arg-type]
        p = subprocess.Popen(
            [str(self.built.cudaprog), "--via", via, *args],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait()
            for f in (p.stdin, p.stdout, p.stderr):
                if f:
                    f.close()


def read_until(p: subprocess.Popen[str], word: str, timeout: float = 30) -> list[str]:
    """Lines printed by p up to and including the first that starts with word."""
    assert p.stdout is not None
    lines = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            raise AssertionError(f"process ended before printing {word!r}: {lines}")
        lines.append(line.strip())
        if line.startswith(word):
            return lines
    raise AssertionError(f"timeout waiting for {word!r}: {lines}")


def step(p: subprocess.Popen[str]) -> None:
    """Releases a process blocked in its 'wait' command."""
    assert p.stdin is not None
    p.stdin.write("go\n")
    p.stdin.flush()


@pytest.fixture
def lab(built: Built, tmp_path: Path) -> Iterator[Lab]:
    lab = Lab(built, tmp_path)
    yield lab
    lab.close()
