"""`gpuops agent --metrics ADDRESS`: the node exporter, a long-running service.

One sampling loop (node/sampler.py) at `--interval` on the agent's single backend thread;
/metrics renders its latest sample, the limiter's regions and the MPS daemons
(node/metrics.py) without asking NVML again, however often it is scraped. With `--record` the
same samples feed the history (node/history.py), so a node that keeps history and exports
metrics samples once.

prometheus-client is imported only here, only when the exporter runs: the zipapp pushed over SSH
for agentless monitoring has no exporter (docs/metrics.md, "Node side").

Standard library only at module level; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import signal
import sys
from typing import Any, Callable, Dict, List, Optional

from gpuops.core.listen import ListenError, bind_error, exposure_warning, parse_listen
from gpuops.node.health import HealthMonitor
from gpuops.node.metrics import NodeCollector, parse_process_metrics
from gpuops.node.metrics_http import DEFAULT_PORT, MetricsServer, prometheus_render
from gpuops.node.sampler import Sampler

log = logging.getLogger("gpuops.agent")

EXIT_OK = 0
EXIT_FAIL = 1
EXIT_USAGE = 2
DEFAULT_INTERVAL = 1.0
MIN_INTERVAL = 0.05
MAX_INTERVAL = 60.0


def _error(message: str, code: int) -> int:
    print("error: %s" % message, file=sys.stderr)
    return code


def run_exporter(
    listen: str,
    backend_name: str = "nvml",
    sim_spec: Optional[str] = None,
    interval: float = DEFAULT_INTERVAL,
    process_metrics: Optional[str] = None,
    log_level: str = "WARNING",
    state_dir: Optional[str] = None,
    limiter_dir: Optional[str] = None,
    mps_control: Optional[str] = None,
    history_dir: Optional[str] = None,
    record: bool = False,
    dcgm_compat: bool = False,
) -> int:
    """Serve /metrics on `listen` until SIGTERM or SIGINT (exit 0). Bad options, a used port or
    a backend that cannot start: one line on stderr, exit 1 (2 for a malformed option)."""
    from gpuops.node.logs import log_to_stderr

    log_to_stderr(log_level)
    if not (isinstance(interval, (int, float)) and MIN_INTERVAL <= interval <= MAX_INTERVAL):
        return _error(
            "--interval must lie between %g and %g seconds" % (MIN_INTERVAL, MAX_INTERVAL), EXIT_USAGE
        )
    try:
        host, port = parse_listen(listen, "--metrics", DEFAULT_PORT)
    except ListenError as exc:
        return _error(str(exc), EXIT_FAIL)
    top = 0
    if process_metrics is not None:
        try:
            top = parse_process_metrics(process_metrics)
        except ValueError as exc:
            return _error(str(exc), EXIT_USAGE)
    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        return _error(
            "--metrics needs the prometheus-client package, which this Python lacks (%s): install "
            "gpuops with its dependencies on the node (the pushed zipapp has no exporter)" % sys.executable,
            EXIT_FAIL,
        )
    if state_dir is None:
        from gpuops.node.state import default_state_dir

        state_dir = default_state_dir()
    if limiter_dir is None:
        from gpuops.node.limiter import DEFAULT_DIR

        limiter_dir = DEFAULT_DIR
    service = _Service(host, port, backend_name, sim_spec, interval, top, state_dir, limiter_dir, mps_control)
    service.dcgm_compat = dcgm_compat
    try:
        history = (history_dir or os.path.join(state_dir, "history")) if record else None
        return asyncio.run(service.main(history))
    except KeyboardInterrupt:
        return EXIT_OK


class _Service:
    def __init__(
        self,
        host: str,
        port: int,
        backend_name: str,
        sim_spec: Optional[str],
        interval: float,
        top: int,
        state_dir: str,
        limiter_dir: str,
        mps_control: Optional[str],
    ) -> None:
        self.host = host
        self.port = port
        self.backend_name = backend_name
        self.sim_spec = sim_spec
        self.interval = interval
        self.top = top
        self.state_dir = state_dir
        self.limiter_dir = limiter_dir
        self.mps_control = mps_control
        self.dcgm_compat = False
        # NVML handles are not documented as thread-safe: every backend call, sampling and the
        # MPS reading of a scrape alike, runs on this one thread (as in the agent).
        self.worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gpuops-backend")

    async def _on_worker(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_event_loop().run_in_executor(self.worker, fn)

    async def main(self, history_dir: Optional[str]) -> int:
        server = MetricsServer(
            lambda _accept: (b"", "text/plain"), self.host, self.port, offload=self._on_worker
        )
        try:
            await server.start()  # first: a used port fails before NVML is touched
        except OSError as exc:
            return _error(bind_error(self.host, self.port, exc, "--metrics"), EXIT_FAIL)
        recorder = None
        backend = None
        health = HealthMonitor()
        try:
            from gpuops.node.backends.registry import open_backend

            backend, reason = await self._on_worker(lambda: open_backend(self.backend_name, self.sim_spec))
            if backend is None:
                return _error(reason, EXIT_FAIL)
            if history_dir is not None:
                recorder, problem = _recorder(history_dir, self.state_dir, self.interval)
                if recorder is None:
                    return _error(problem, EXIT_FAIL)
            await self._on_worker(lambda: health.start(backend))
            return await self._serve(server, backend, recorder, health)
        finally:
            await server.close()
            if recorder is not None:
                recorder.close()
            # The event set goes before the library it belongs to (a bounded wait).
            if not await asyncio.get_event_loop().run_in_executor(None, health.stop):
                log.warning("the health thread did not stop in time")
            if backend is not None:
                await self._on_worker(backend.close)
            self.worker.shutdown(wait=False)

    async def _serve(self, server: MetricsServer, backend: Any, recorder: Any, health: HealthMonitor) -> int:
        from gpuops.node.backends.base import BackendError
        from gpuops.node.limiter_tags import LimiterTagger

        tagger = LimiterTagger(self.limiter_dir)
        sampler = Sampler(lambda: health.attach(tagger.tag(backend.sample())), self.interval)
        if recorder is not None:
            sampler.listeners.append(recorder.add)
        try:
            driver = (await self._on_worker(backend.inventory)).driver_version
        except BackendError as exc:
            log.warning("inventory failed: %s", exc)
            driver = ""
        collector = NodeCollector(
            sampler.latest,
            driver_version=driver,
            limiter_dir=self.limiter_dir,
            mps=self._mps(backend),
            process_top=self.top,
            dcgm_compat=self.dcgm_compat,
        )
        server.render = prometheus_render(collector)
        print(
            "gpuops-agent: serving metrics on %s (sampling every %gs)" % (server.url, self.interval),
            file=sys.stderr,
            flush=True,
        )
        exposed = exposure_warning(self.host, server.port, "--metrics")
        if exposed is not None:
            print(exposed, file=sys.stderr, flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_event_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        sampling = asyncio.ensure_future(sampler.run(self._on_worker))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait([sampling, stopping], return_when=asyncio.FIRST_COMPLETED)
        for task in (sampling, stopping):
            task.cancel()
        failed = sampling.exception() if sampling.done() and not sampling.cancelled() else None
        if failed is not None:
            return _error("sampling stopped: %s: %s" % (type(failed).__name__, failed), EXIT_FAIL)
        return EXIT_OK

    def _mps(self, backend: Any) -> Callable[[], List[Dict[str, Any]]]:
        """The node's MPS daemons, read at each scrape (as the agent's `config` request does)."""
        from gpuops.node.backends.base import BackendError
        from gpuops.node.mps import BinaryMpsControl
        from gpuops.node.mps_apply import MpsRecord, live_config

        control: Any = None
        why = ""
        if self.mps_control:
            control = BinaryMpsControl(self.mps_control)
        else:
            try:
                control = backend.mps_control()
            except BackendError as exc:
                why = str(exc)
        record = MpsRecord(self.state_dir)
        return lambda: live_config(backend.user_name, control, record, why)


def _recorder(history_dir: str, state_dir: str, interval: float) -> Any:
    """(Recorder, "") or (None, why not), as `agent --record` opens it."""
    from gpuops.node.history.recorder import Recorder, RecorderBusy

    try:
        return Recorder(history_dir, interval=interval), ""
    except RecorderBusy as exc:
        return None, str(exc)
    except OSError as exc:
        return None, "cannot record into %s: %s" % (history_dir, exc.strerror or exc)
