"""One rule for partial results (docs/cli.md, issue 18 item 5), through the real CLI against the
simulated `silos` fleet over SSH on loopback with one node made unreachable (its port closed):
reports (tenants) print what was read and exit 3; verdicts (assert) exit 1 and never say "no
changes" or "matches" about nodes they could not read; documents (export) write nothing partial."""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuops.simfleet import Launched, launch, stop
from tests.integration.test_plan_apply import gpuops

pytestmark = pytest.mark.timeout(300)

DOWN = "sim-robotics-01"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    directory = tmp_path_factory.mktemp("partial") / "fleet"
    started = launch(directory, "silos", nodes=3, timeout=60)
    try:
        yield started
    finally:
        stop(directory)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # nobody listens once it is closed


@pytest.fixture(scope="module")
def one_down(fleet: Launched) -> Path:
    """The fleet's own fleet.yaml with DOWN's port pointing where nothing listens."""
    text = (fleet.dir / "fleet.yaml").read_text()
    text, n = re.subn(
        rf"(- name: {DOWN}\n    host: 127\.0\.0\.1\n    port: )\d+", rf"\g<1>{_closed_port()}", text
    )
    assert n == 1, text
    path = fleet.dir / "one-down.yaml"
    path.write_text(text)
    return path


def test_tenants_with_an_unreachable_node_is_partial(one_down: Path) -> None:
    table = gpuops("tenants", "-f", str(one_down), "--window", "1h")
    assert table.returncode == 3, table.stdout + table.stderr
    assert "vision" in table.stdout and f"{DOWN}: " in table.stdout + table.stderr
    doc = gpuops("tenants", "-f", str(one_down), "--window", "1h", "--json")
    assert doc.returncode == 3, doc.stderr
    assert DOWN in json.loads(doc.stdout)["missing"]


def test_assert_with_an_unreachable_node_gives_no_verdict_on_it(one_down: Path, fleet: Launched) -> None:
    # Every reachable node matches its own export, so only the unreachable one is in doubt.
    whole = gpuops("export", "-f", str(fleet.dir / "fleet.yaml"), "-o", str(fleet.dir / "exported.yaml"))
    assert whole.returncode == 0, whole.stderr
    exported = (fleet.dir / "exported.yaml").read_text()
    port = re.search(rf"- name: {DOWN}\n    host: 127\.0\.0\.1\n    port: (\d+)", one_down.read_text())
    assert port
    target = fleet.dir / "exported-one-down.yaml"
    target.write_text(
        re.sub(
            rf"(- name: {DOWN}\n    host: 127\.0\.0\.1\n    port: )\d+", rf"\g<1>{port.group(1)}", exported
        )
    )
    result = gpuops("assert", str(target))
    out = result.stdout + result.stderr
    assert result.returncode == 1, out
    for verdict in ("No changes:", "The live state matches", "does not match"):
        assert verdict not in out, out
    # one verdict (issue 19 item 4): not a plan summary followed by a second sentence saying it again
    assert "the plan is incomplete" not in out, out
    verdict = (
        f"Cannot tell whether the live state matches fleet.yaml: 1 node(s) could not be read ({DOWN}); "
        "the 2 node(s) read match."
    )
    assert verdict in out, out
    assert out.count("could not be read") == 1, out
    assert f"node {DOWN}: cannot plan:" in out, out


def test_export_of_a_fleet_with_an_unreachable_node_writes_nothing(one_down: Path, tmp_path: Path) -> None:
    target = tmp_path / "out.yaml"
    result = gpuops("export", "-f", str(one_down), "-o", str(target))
    assert result.returncode == 1, result.stdout + result.stderr
    assert not target.exists()
    printed = gpuops("export", "-f", str(one_down))
    assert printed.returncode == 1 and printed.stdout == ""
    lines = printed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {DOWN}: not exported ("), printed.stderr


def test_export_on_a_host_without_nvml_prints_no_document() -> None:
    result = gpuops("export", env={"GPUOPS_NVML_LIBRARY": "/nonexistent/libnvidia-ml.so.1"})
    assert result.returncode == 1, result.stdout
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "not exported (NVML is unavailable" in lines[0], result.stderr
