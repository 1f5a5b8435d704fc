"""The sim fleet's own Prometheus (`gpuops sim up --prometheus`): Debian's `prometheus` binary,
started by the fleet process, scraping every simulated node's exporter and evaluating gpuops'
rules (deploy/prometheus/gpuops.rules.yml, and gpuops-history.rules.yml for the PromQL history of
`tenants` and `rebalance`), so the PromQL fleet source has a real server to read.

- loopback only: `--web.listen-address=127.0.0.1:PORT` on a free port (probed, retried when
  another process takes it between the probe and the bind);
- its own storage, config and log under `DIR/prometheus/`, emptied at start (a previous fleet's
  series are not this one's) and the TSDB removed at a clean stop;
- a child of the fleet process, which stops it when the fleet stops (`gpuops sim down`); the
  kernel sends it SIGTERM should the fleet process die without stopping it (PR_SET_PDEATHSIG).
  That signal follows the thread that forked, so it is started from the event loop's thread,
  never from a worker thread that ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path

log = logging.getLogger("gpuops.simfleet")

BINARY = "prometheus"
HOST = "127.0.0.1"
SCRAPE_INTERVAL = "1s"  # as the sim fleet samples (exporters.INTERVAL)
JOB = "gpuops-node"
READY_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
PORT_ATTEMPTS = 5
RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = ("gpuops.rules.yml", "gpuops-history.rules.yml")
MISSING = (
    "Prometheus is not installed (no `prometheus` on PATH): install Debian's package "
    "(apt-get install prometheus) or leave out --prometheus"
)


class SimPrometheusError(Exception):
    """The sim fleet's Prometheus did not start; one line for a person."""


def prometheus_binary() -> str | None:
    """The server binary as the shell would find it (Debian installs /usr/bin/prometheus)."""
    return shutil.which(BINARY)


def rules_files() -> list[Path]:
    """gpuops' rules when this is a source checkout (deploy/ is not part of the wheel)."""
    return [RULES_DIR / name for name in RULES if (RULES_DIR / name).is_file()]


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> Callable[[], None] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None
    prctl = getattr(libc, "prctl", None)
    if prctl is None:
        return None

    def preexec() -> None:
        prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG

    return preexec


def config_document(targets: Sequence[str], rules: Sequence[Path]) -> dict[str, object]:
    """prometheus.yml as a document (JSON is YAML): one job over the nodes' exporters."""
    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "scrape_timeout": SCRAPE_INTERVAL,
            "evaluation_interval": SCRAPE_INTERVAL,
        },
        "rule_files": [str(path) for path in rules],
        "scrape_configs": [
            {"job_name": JOB, "static_configs": [{"targets": list(targets)}]},
        ],
    }


class SimPrometheus:
    """One Prometheus in `workdir` scraping `targets` (`127.0.0.1:PORT` each)."""

    def __init__(self, workdir: Path, targets: Sequence[str], rules: Sequence[Path] = ()) -> None:
        self.workdir = workdir
        self.targets = list(targets)
        self.rules = list(rules)
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    def _log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.splitlines()[-lines:] if line.strip())[-400:]

    def _argv(self, binary: str) -> list[str]:
        return [
            binary,
            f"--config.file={self.workdir / 'prometheus.yml'}",
            f"--storage.tsdb.path={self.data_dir}",
            "--storage.tsdb.retention.time=2d",
            f"--web.listen-address={HOST}:{self.port}",
            # Debian's defaults point at /etc/prometheus: nothing of the system's may leak in.
            f"--web.console.templates={self.workdir / 'consoles'}",
            f"--web.console.libraries={self.workdir / 'console_libraries'}",
        ]

    async def start(self, timeout: float = READY_TIMEOUT) -> str:
        """Start it and wait until `/-/ready`; its URL."""
        binary = prometheus_binary()
        if binary is None:
            raise SimPrometheusError(MISSING)
        shutil.rmtree(self.workdir, ignore_errors=True)
        self.workdir.mkdir(mode=0o700, parents=True)
        document = config_document(self.targets, self.rules)
        (self.workdir / "prometheus.yml").write_text(json.dumps(document, indent=1) + "\n")
        for attempt in range(PORT_ATTEMPTS):
            self.port = _free_port()
            with open(self.log_path, "ab") as out:
                self._proc = subprocess.Popen(
                    self._argv(binary),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    start_new_session=True,
                    preexec_fn=_die_with_parent(),
                )
            try:
                await self._wait_ready(timeout)
            except SimPrometheusError:
                await asyncio.to_thread(self._terminate)
                if attempt + 1 < PORT_ATTEMPTS and "address already in use" in self._log_tail(5):
                    continue
                raise
            log.info(
                "prometheus (pid %d) serving %s, scraping %d exporters",
                self._proc.pid,
                self.url,
                len(self.targets),
            )
            return self.url
        raise SimPrometheusError("prometheus found no free port")  # the loop returns or raises first

    async def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer yet"
        while time.monotonic() < deadline:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = proc.returncode if proc is not None else None
                raise SimPrometheusError(f"prometheus exited with status {code}: {self._log_tail()}")
            try:
                last = await asyncio.to_thread(self._ready)
                if not last:
                    return
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            await asyncio.sleep(0.1)
        raise SimPrometheusError(f"prometheus on {self.url} not ready within {timeout:g}s ({last})")

    def _ready(self) -> str:
        """An empty string when ready, else what it answered."""
        with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
            return "" if response.status == 200 else f"HTTP {response.status}"

    def _terminate(self, timeout: float = STOP_TIMEOUT) -> bool:
        """SIGTERM, SIGKILL after `timeout`; True when it ended on SIGTERM."""
        proc = self._proc
        if proc is None or proc.poll() is not None:
            return True
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
            return False

    async def stop(self) -> None:
        clean = await asyncio.to_thread(self._terminate)
        if not clean:
            log.warning("prometheus ignored SIGTERM for %gs and was killed", STOP_TIMEOUT)
        shutil.rmtree(self.data_dir, ignore_errors=True)
        log.info("prometheus stopped")
