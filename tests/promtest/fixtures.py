"""pytest fixtures for tests against a real Prometheus. A test module imports the ones it uses::

    from tests.promtest.fixtures import (  # noqa: F401  (pytest finds them by their fixture names)
        PrometheusFactory,
        prometheus_factory_fixture,
        promtool_path_fixture,
    )

    def test_something(prometheus_factory: PrometheusFactory) -> None:
        prom = prometheus_factory([ScrapeJob("node", ["127.0.0.1:9835"])])
        prom.wait_for('gpuops_node_up == 1')

* ``prometheus_factory(jobs, rule_files=(), **kwargs)`` -> a started
  :class:`~tests.promtest.prometheus.Prometheus` on 127.0.0.1 (free port), its directory under
  the test's ``tmp_path``; every one is stopped at teardown, pass or fail, and the tail of its log
  printed (pytest shows it for a failed test). Teardown fails if one had to be killed.
* ``promtool_path`` -> the promtool binary.

Both skip the test, with the reason, where Debian's prometheus package is not installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.promtest.prometheus import Prometheus, ScrapeJob, prometheus_unavailable_reason
from tests.promtest.promtool import promtool_binary, promtool_unavailable_reason

PrometheusFactory = Callable[..., Prometheus]


@pytest.fixture(name="prometheus_factory")
def prometheus_factory_fixture(tmp_path: Path) -> Iterator[PrometheusFactory]:
    """Make started Prometheus servers on 127.0.0.1; all stopped at teardown."""
    reason = prometheus_unavailable_reason()
    if reason is not None:
        pytest.skip(reason)
    servers: list[Prometheus] = []

    def make(jobs: Sequence[ScrapeJob] = (), rule_files: Sequence[Path] = (), **kwargs: Any) -> Prometheus:
        server = Prometheus(tmp_path / f"prometheus-{len(servers)}", jobs, rule_files, **kwargs)
        servers.append(server)
        return server.start()

    try:
        yield make
    finally:
        errors: list[str] = []
        for server in servers:
            try:
                server.stop()
            except Exception as exc:
                errors.append(str(exc))
            print(
                f"--- prometheus {server.url} ({server.workdir}) log, last lines ---\n{server.log_tail(20)}"
            )
        if errors:
            raise AssertionError("test prometheus did not stop: " + "; ".join(errors))


@pytest.fixture(name="promtool_path")
def promtool_path_fixture() -> str:
    """The promtool binary (skips the test when it is not installed)."""
    binary = promtool_binary()
    if binary is None:
        pytest.skip(promtool_unavailable_reason() or "promtool missing")
    return binary
