"""Debian's ``prometheus``, started by the tests on 127.0.0.1 with a config and storage they own.

One :class:`Prometheus` is:

* a directory with ``prometheus.yml`` (written here: the test's scrape jobs, rule files, a short
  scrape and evaluation interval), ``data/`` (the TSDB) and ``prometheus.log``;
* ``/usr/bin/prometheus --config.file=... --storage.tsdb.path=... --web.listen-address=
  127.0.0.1:PORT --web.enable-lifecycle`` as a child process of the test, on a free port (retried
  when another process takes it between the probe and the bind);
* its HTTP API through the stdlib (``urllib``): :meth:`Prometheus.query` (instant queries),
  :meth:`Prometheus.wait_for` (until a query returns series, bounded), :meth:`Prometheus.targets`,
  :meth:`Prometheus.wait_targets_up`, :meth:`Prometheus.reload`, :meth:`Prometheus.rules`.

Every wait is bounded: start (until ``/-/ready``) 30 s, each HTTP request 10 s, ``wait_for`` what
the test says (15 s by default), stop 10 s (SIGTERM, then SIGKILL). A started server is
registered: fixture teardown stops it, an ``atexit`` hook stops what is left, and a server started
from the main thread gets ``PR_SET_PDEATHSIG``, so a test process killed with SIGKILL takes it along.
It listens on loopback only and scrapes only the targets the test names (loopback too).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from tests.sshtest.sshd import _pdeathsig_preexec, free_port

PROMETHEUS = "/usr/bin/prometheus"
INSTALL_HINT = "run: bash scripts/install-test-deps.sh"
HOST = "127.0.0.1"


class PrometheusError(RuntimeError):
    """Prometheus did not start, stop or answer as asked; the message has the reason (and log)."""


@cache
def prometheus_binary() -> str | None:
    """The prometheus server binary: Debian's path first, else one on PATH."""
    if os.access(PROMETHEUS, os.X_OK):
        return PROMETHEUS
    return shutil.which("prometheus")


def prometheus_unavailable_reason() -> str | None:
    """Why a test Prometheus cannot run here (a skip reason), or None when it can."""
    if prometheus_binary() is None:
        return f"Debian's prometheus is not installed ({PROMETHEUS} missing); {INSTALL_HINT}"
    return None


@dataclass(frozen=True)
class ScrapeJob:
    """One scrape job: ``targets`` are ``host:port`` on loopback (the test's own servers)."""

    name: str
    targets: Sequence[str]
    metrics_path: str = "/metrics"
    labels: Mapping[str, str] = field(default_factory=dict)

    def config(self) -> dict[str, Any]:
        for target in self.targets:
            host = target.rsplit(":", 1)[0].strip("[]")
            if not (host.startswith("127.") or host in ("localhost", "::1")):
                raise PrometheusError(f"job {self.name}: target {target} is not on loopback")
        group: dict[str, Any] = {"targets": list(self.targets)}
        if self.labels:
            group["labels"] = dict(self.labels)
        return {"job_name": self.name, "metrics_path": self.metrics_path, "static_configs": [group]}


@dataclass(frozen=True)
class Sample:
    """One series of an instant vector: its labels (``__name__`` included when kept) and value."""

    labels: dict[str, str]
    value: float

    @property
    def name(self) -> str:
        return self.labels.get("__name__", "")


def _as_float(text: str) -> float:
    # Prometheus writes NaN and infinities as "NaN", "+Inf", "-Inf"; float() reads all three.
    return float(text)


def parse_vector(data: Mapping[str, Any]) -> list[Sample]:
    """The samples of a query result: a vector as is, a scalar as one sample without labels."""
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "vector" and isinstance(result, list):
        return [Sample(dict(item["metric"]), _as_float(item["value"][1])) for item in result]
    if kind in ("scalar", "string") and isinstance(result, list):
        return [Sample({}, _as_float(result[1]))] if kind == "scalar" else []
    raise PrometheusError(f"expected an instant vector, got resultType {kind!r}")


_LIVE: dict[int, Prometheus] = {}
_LIVE_LOCK = threading.Lock()


def live_servers() -> list[Prometheus]:
    """The Prometheus servers of this process still running (should be none after each test)."""
    with _LIVE_LOCK:
        return list(_LIVE.values())


def stop_all(timeout: float = 5) -> list[str]:
    """Stop every Prometheus this process started and did not stop; returns their directories."""
    leftover = live_servers()
    for server in leftover:
        with contextlib.suppress(Exception):
            server.stop(timeout=timeout)
    return [str(server.workdir) for server in leftover]


atexit.register(stop_all, 2)


class Prometheus:
    """One test Prometheus; see the module documentation.

    ``jobs`` are scraped every ``scrape_interval``; ``rule_files`` are loaded and evaluated every
    ``evaluation_interval``. ``extra_args`` are appended to the command line (e.g.
    ``--query.lookback-delta=10s`` for a test that wants series to go stale quickly).
    """

    def __init__(
        self,
        workdir: Path,
        jobs: Sequence[ScrapeJob] = (),
        rule_files: Sequence[Path] = (),
        scrape_interval: str = "1s",
        evaluation_interval: str = "1s",
        extra_args: Sequence[str] = (),
    ) -> None:
        self.workdir = workdir
        self.jobs = list(jobs)
        self.rule_files = [Path(p).resolve() for p in rule_files]
        self.scrape_interval = scrape_interval
        self.evaluation_interval = evaluation_interval
        self.extra_args = list(extra_args)
        self.port = 0
        self._proc: subprocess.Popen[bytes] | None = None
        self.workdir.mkdir(parents=True, exist_ok=True)

    # ------------------------------------------------------------------ files

    @property
    def config_path(self) -> Path:
        return self.workdir / "prometheus.yml"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def config(self) -> dict[str, Any]:
        """The configuration as a document (JSON is YAML, so no YAML writer is needed)."""
        return {
            "global": {
                "scrape_interval": self.scrape_interval,
                # A timeout longer than the interval is a config error; one interval is enough on loopback.
                "scrape_timeout": self.scrape_interval,
                "evaluation_interval": self.evaluation_interval,
            },
            "rule_files": [str(p) for p in self.rule_files],
            "scrape_configs": [job.config() for job in self.jobs],
        }

    def write_config(self) -> None:
        self.config_path.write_text(json.dumps(self.config(), indent=2) + "\n", encoding="utf-8")

    def logs(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.logs().splitlines()[-lines:])

    # ------------------------------------------------------------------ process

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def argv(self) -> list[str]:
        binary = prometheus_binary()
        if binary is None:
            raise PrometheusError(prometheus_unavailable_reason() or "prometheus missing")
        return [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address={HOST}:{self.port}",
            "--web.enable-lifecycle",
            # Debian's defaults point at /etc/prometheus; nothing of the system's may leak in.
            f"--web.console.templates={self.workdir}/consoles",
            f"--web.console.libraries={self.workdir}/console_libraries",
            *self.extra_args,
        ]

    def start(self, timeout: float = 30) -> Prometheus:
        """Write the config, start prometheus and wait until ``/-/ready``; returns self."""
        if self.running:
            raise PrometheusError(f"prometheus in {self.workdir} is already running (pid {self.pid})")
        self.write_config()
        attempts = 5
        for attempt in range(attempts):
            self.port = free_port(HOST)
            try:
                self._spawn_and_wait(timeout)
            except PrometheusError:
                if attempt + 1 < attempts and "address already in use" in self.log_tail(5):
                    continue
                raise
            return self
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _spawn_and_wait(self, timeout: float) -> None:
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                self.argv(),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_pdeathsig_preexec(),
            )
        with _LIVE_LOCK:
            _LIVE[id(self)] = self
        try:
            self.wait_ready(timeout)
        except PrometheusError:
            self._terminate(timeout=5)
            raise

    def wait_ready(self, timeout: float = 30) -> None:
        """Wait until ``/-/ready`` answers 200 (the TSDB is open and the config loaded)."""
        deadline = time.monotonic() + timeout
        last = "no attempt"
        while time.monotonic() < deadline:
            if not self.running:
                code = self._proc.returncode if self._proc is not None else None
                raise PrometheusError(f"prometheus exited ({code}):\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/-/ready", timeout=1) as response:
                    if response.status == 200:
                        return
                    last = f"HTTP {response.status}"
            except (OSError, urllib.error.URLError) as exc:
                last = str(exc)
            time.sleep(0.05)
        raise PrometheusError(
            f"prometheus on {self.url} not ready in {timeout}s ({last}):\n{self.log_tail()}"
        )

    def _terminate(self, timeout: float) -> bool:
        """SIGTERM, SIGKILL after ``timeout``; True when it had to be killed."""
        proc = self._proc
        killed = False
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                killed = True
                proc.kill()
                proc.wait(timeout)
        with _LIVE_LOCK:
            _LIVE.pop(id(self), None)
        return killed

    def stop(self, timeout: float = 10) -> None:
        """Stop prometheus (SIGTERM; SIGKILL after ``timeout`` s, which is then an error)."""
        if self._terminate(timeout):
            raise PrometheusError(
                f"prometheus on {self.url} ignored SIGTERM for {timeout}s:\n{self.log_tail()}"
            )

    def restart(self, timeout: float = 30) -> Prometheus:
        """Start a stopped server again on the same port and storage (a reader that kept the URL
        sees the same Prometheus come back)."""
        if self.running:
            raise PrometheusError(f"prometheus in {self.workdir} is still running (pid {self.pid})")
        if not self.port:
            raise PrometheusError("restart: this server was never started")
        self._spawn_and_wait(timeout)
        return self

    def __enter__(self) -> Prometheus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ HTTP API

    def _request(self, path: str, params: Mapping[str, str] | None = None, method: str = "GET") -> Any:
        url = f"{self.url}{path}"
        body = None
        if params and method == "GET":
            url += "?" + urllib.parse.urlencode(params)
        elif params:
            body = urllib.parse.urlencode(params).encode()
        request = urllib.request.Request(url, data=body, method=method)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            # The API answers errors (a bad query: 400 bad_data) with a JSON body that says why.
            raw = exc.read()
            try:
                doc = json.loads(raw)
            except ValueError:
                raise PrometheusError(f"{method} {path}: HTTP {exc.code}: {raw[:200]!r}") from None
            raise PrometheusError(f"{path}: {doc.get('errorType')}: {doc.get('error')}") from None
        except (OSError, urllib.error.URLError) as exc:
            raise PrometheusError(f"{method} {url}: {exc}") from None
        if not raw:
            return None
        doc = json.loads(raw)
        if isinstance(doc, dict) and doc.get("status") == "error":
            raise PrometheusError(f"{path}: {doc.get('errorType')}: {doc.get('error')}")
        return doc.get("data") if isinstance(doc, dict) and "data" in doc else doc

    def query_data(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """An instant query's ``data`` as Prometheus returns it (``resultType``, ``result``)."""
        params = {"query": expr}
        if at is not None:
            params["time"] = repr(at)
        data = self._request("/api/v1/query", params, method="POST")
        if not isinstance(data, dict):
            raise PrometheusError(f"query {expr!r}: no data in the answer")
        return data

    def query(self, expr: str, at: float | None = None) -> list[Sample]:
        """An instant query (now, or at the Unix time ``at``): its series and values."""
        return parse_vector(self.query_data(expr, at))

    def wait_for(
        self,
        expr: str,
        timeout: float = 15,
        until: Callable[[list[Sample]], bool] = bool,
        interval: float = 0.25,
    ) -> list[Sample]:
        """Query ``expr`` until ``until(samples)`` holds (default: any series); bounded by ``timeout``."""
        deadline = time.monotonic() + timeout
        samples: list[Sample] = []
        while True:
            samples = self.query(expr)
            if until(samples):
                return samples
            if time.monotonic() >= deadline:
                break
            time.sleep(interval)
        targets = "; ".join(
            f"{t.get('scrapeUrl')} {t.get('health')} {t.get('lastError') or ''}".strip()
            for t in self.targets()
        )
        raise PrometheusError(
            f"query {expr!r} did not return the expected series in {timeout}s "
            f"(last: {samples!r}); targets: {targets or 'none'}"
        )

    def targets(self) -> list[dict[str, Any]]:
        """The active scrape targets with ``health`` (up/down/unknown) and ``lastError``."""
        data = self._request("/api/v1/targets", {"state": "active"})
        return list(data.get("activeTargets", [])) if isinstance(data, dict) else []

    def wait_targets_up(self, timeout: float = 15) -> list[dict[str, Any]]:
        """Wait until every configured target has been scraped successfully at least once."""
        expected = sum(len(job.targets) for job in self.jobs)
        deadline = time.monotonic() + timeout
        targets: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            targets = self.targets()
            if len(targets) >= expected and all(t.get("health") == "up" for t in targets):
                return targets
            time.sleep(0.2)
        states = "; ".join(f"{t.get('scrapeUrl')}: {t.get('health')} {t.get('lastError')}" for t in targets)
        raise PrometheusError(f"targets not all up in {timeout}s: {states or 'none'}")

    def rules(self) -> list[dict[str, Any]]:
        """The loaded rule groups (``/api/v1/rules``): each rule's health and last error."""
        data = self._request("/api/v1/rules")
        return list(data.get("groups", [])) if isinstance(data, dict) else []

    def reload(self) -> None:
        """Rewrite the config from ``jobs``/``rule_files`` and have prometheus load it again."""
        self.write_config()
        self._request("/-/reload", method="POST")


def scalar(samples: Sequence[Sample]) -> float:
    """The one value of a query that must return exactly one series."""
    if len(samples) != 1:
        raise PrometheusError(f"expected one series, got {len(samples)}: {list(samples)!r}")
    return samples[0].value
