"""The node exporter as an operator runs it: `gpuops agent --metrics` (and the node's own
`python -m gpuops.node agent --metrics`) as a process, scraped over HTTP on loopback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from gpuops.core.model import NotAvailable
from gpuops.node.backends.sim import SimBackend
from tests.agent_helpers import REPO
from tests.integration.metrics_helpers import (
    demo_spec,
    one,
    parse,
    promtool_problems,
    running_exporter,
    scrape,
)

GPU_SET = ("gpu", "UUID", "device", "modelName", "pci_bus_id", "Hostname", "node")


def _at(t: float) -> Callable[[], float]:
    """A clock stopped at t: the simulated node as it was at that moment."""
    return lambda: t


def _dirs(tmp_path: Path) -> list[str]:
    return ["--state-dir", str(tmp_path / "state"), "--limiter-dir", str(tmp_path / "limiter")]


@pytest.mark.parametrize("entry", [("gpuops",), ("gpuops.node",)], ids=["gpuops", "node"])
def test_metrics_are_the_sample_the_agent_took(tmp_path: Path, entry: tuple[str, ...]) -> None:
    spec = demo_spec(tmp_path)
    args = ["--backend", "sim", "--sim-spec", str(spec), "--interval", "0.5", *_dirs(tmp_path)]
    with running_exporter(*args, entry=entry) as (url, _proc):
        text = scrape(url, accept_gzip=True)
        discovered = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuops",
                "discover",
                "--local",
                "--backend",
                "sim",
                "--sim-spec",
                str(spec),
                "--json",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert discovered.returncode == 0, discovered.stderr
    series = parse(text)
    (taken,) = [v for _, v in series["gpuops_node_sample_timestamp_seconds"]]
    assert one(series, "gpuops_node_up") == 1.0
    # The simulated node's figures are a function of time: its state at the sample's moment.
    expected = SimBackend(spec=str(spec), clock=_at(taken)).sample()
    node = json.loads(discovered.stdout)
    assert len(series["gpuops_gpu_info"]) == len(expected.gpus) == len(node["gpus"])
    for gpu, seen in zip(expected.gpus, node["gpus"], strict=True):
        info = gpu.info
        labels = {"gpu": str(info.index), "UUID": info.uuid}
        ((info_labels, value),) = [
            (lbl, v) for lbl, v in series["gpuops_gpu_info"] if lbl["UUID"] == info.uuid
        ]
        assert value == 1.0
        # Identity as `discover --json` says it at the same moment.
        assert info_labels == {
            "gpu": str(seen["info"]["index"]),
            "UUID": seen["info"]["uuid"],
            "device": f"nvidia{seen['info']['index']}",
            "modelName": seen["info"]["name"],
            "pci_bus_id": seen["info"]["pci_bus_id"],
            "Hostname": node["hostname"],
            "node": node["hostname"],
            "driver_version": node["driver_version"],
            "mig_mode": "enabled" if seen["mig"]["current"] else "disabled",
        }
        s = gpu.sample
        assert s is not None
        for name, figure, scale in (
            ("gpuops_gpu_utilization_ratio", s.utilization_gpu_percent, 0.01),
            ("gpuops_gpu_memory_used_bytes", s.memory_used_bytes, 1),
            ("gpuops_gpu_memory_total_bytes", s.memory_total_bytes, 1),
            ("gpuops_gpu_power_watts", s.power_watts, 1),
            ("gpuops_gpu_temperature_celsius", s.temperature_celsius, 1),
        ):
            got = one(series, name, **labels)
            if isinstance(figure, NotAvailable):  # e.g. utilization with MIG on: no series, not 0
                assert got is None, (name, labels)
            else:
                assert got == pytest.approx(figure * scale, abs=1e-9), (name, labels)
        profiles = {gi.id: gi.profile_name for gi in gpu.mig.gpu_instances} if gpu.mig else {}
        for mig in gpu.mig_samples:
            got = one(
                series,
                "gpuops_mig_instance_memory_used_bytes",
                GPU_I_ID=str(mig.gpu_instance_id),
                GPU_I_PROFILE=profiles[mig.gpu_instance_id],
                **labels,
            )
            assert got == mig.memory_used_bytes
        # Each GPU instance's processes: a slice's busy evidence where NVML has no utilization.
        for gi in gpu.mig.gpu_instances if gpu.mig and gpu.mig.current else ():
            got = one(
                series,
                "gpuops_mig_instance_processes",
                GPU_I_ID=str(gi.id),
                GPU_I_PROFILE=gi.profile_name,
                **labels,
            )
            assert got == sum(1 for p in gpu.processes if p.gpu_instance_id == gi.id), (gi, labels)
    assert any(g.mig_samples for g in expected.gpus)  # the demo node has MIG slices to check
    assert any(v > 0 for _, v in series["gpuops_mig_instance_processes"])
    assert any(v == 0 for _, v in series["gpuops_mig_instance_processes"])
    assert any(isinstance(g.sample.utilization_gpu_percent, NotAvailable) for g in expected.gpus if g.sample)
    for name, values in series.items():
        if name.startswith("gpuops_gpu_"):
            assert all(set(GPU_SET) <= set(lbl) for lbl, _ in values), name
    assert "gpuops_process_gpu_memory_used_bytes" not in series  # off unless asked for
    problems = promtool_problems(text)
    assert not problems, problems


def test_scrapes_read_the_sampling_loop_not_the_backend(tmp_path: Path) -> None:
    """Many scrapes within one interval are one sample: NVML's cost is the loop's, not the
    scrapes'."""
    args = ["--backend", "sim", "--sim-spec", str(demo_spec(tmp_path)), "--interval", "30", *_dirs(tmp_path)]
    with running_exporter(*args) as (url, _proc):
        stamps = {one(parse(scrape(url)), "gpuops_node_sample_timestamp_seconds") for _ in range(20)}
    assert len(stamps) == 1 and None not in stamps


def _churn_spec(tmp_path: Path, count: int, starts_in: float) -> tuple[Path, float]:
    """A node that starts and ends `count` short processes, ~30 alive at any time."""
    epoch = time.time() + starts_in
    step, life = 0.01, 0.3
    spec = {
        "version": 1,
        "hostname": "churn",
        "epoch": epoch,
        "users": {"u": 1000},
        "gpus": [{"model": "A100-SXM4-40GB", "count": 2}],
        "workloads": [
            {
                "name": f"job-{i}",
                "kind": "training",
                "user": "u",
                "gpu": i % 2,
                "memory": f"{512 + i}MiB",
                "start": step * i,
                "duration": life,
            }
            for i in range(count)
        ],
    }
    path = tmp_path / "churn.json"
    path.write_text(json.dumps(spec))
    return path, epoch + step * count + life


@pytest.mark.slow
def test_process_series_stay_bounded_through_a_thousand_short_processes(tmp_path: Path) -> None:
    top = 5
    spec, all_done = _churn_spec(tmp_path, 1000, starts_in=3.0)
    args = ["--backend", "sim", "--sim-spec", str(spec), "--interval", "0.05", *_dirs(tmp_path)]
    seen: set[str] = set()
    with running_exporter(*args, "--process-metrics", f"top:{top}") as (url, _proc):
        while time.time() < all_done + 1.0:
            series = parse(scrape(url))
            procs = series.get("gpuops_process_gpu_memory_used_bytes", [])
            assert len(procs) <= top
            taken = one(series, "gpuops_node_sample_timestamp_seconds")
            assert taken is not None
            # The N largest of the sample the agent took, none other.
            expected = SimBackend(spec=str(spec), clock=_at(taken)).sample()
            biggest = sorted(
                (
                    (p.used_memory_bytes, p.pid)
                    for g in expected.gpus
                    for p in g.processes
                    if isinstance(p.used_memory_bytes, int)
                ),
                key=lambda mp: (-mp[0], mp[1]),
            )[:top]
            assert sorted((v, int(lbl["pid"])) for lbl, v in procs) == sorted(biggest)
            seen |= {lbl["pid"] for lbl, _ in procs}
            time.sleep(0.05)
        final = parse(scrape(url))
    assert len(seen) > 10 * top  # processes came and went through the bound
    assert final.get("gpuops_process_gpu_memory_used_bytes", []) == []  # all ended: no series left


def _run_agent(*args: str, entry: str = "gpuops") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", entry, "agent", *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )


@pytest.mark.parametrize("entry", ["gpuops", "gpuops.node"])
def test_a_used_port_is_one_line_and_exit_1(tmp_path: Path, entry: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = _run_agent(
            "--metrics", f"127.0.0.1:{port}", "--backend", "sim", *_dirs(tmp_path), entry=entry
        )
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines == [f"error: --metrics 127.0.0.1:{port}: cannot listen: Address already in use"]


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("999.1.1.1:9835", "'999.1.1.1' is not an IP address"),
        ("gpu-node.example:9835", "is not an IP address"),
        ("127.0.0.1:99999", "the port must be a number from 0 to 65535"),
        ("127.0.0.1:http", "the port must be a number from 0 to 65535"),
        (":9835", "say which address to bind"),
        ("[::1:9835", "unclosed '['"),
        ("192.0.2.1:9835", "cannot listen: Cannot assign requested address"),
    ],
)
def test_a_bad_address_is_one_line_and_exit_1(tmp_path: Path, address: str, says: str) -> None:
    for entry in ("gpuops", "gpuops.node"):
        result = _run_agent("--metrics", address, "--backend", "sim", *_dirs(tmp_path), entry=entry)
        assert result.returncode == 1, (entry, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: --metrics "), (entry, result.stderr)
        assert says in lines[0], (entry, lines)


def test_without_prometheus_client_the_node_side_says_so(tmp_path: Path) -> None:
    """The node side alone (what a pushed zipapp has): no prometheus-client, a clear line."""
    result = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            "-c",
            f"import sys; sys.path.insert(0, {REPO!r}); "
            "from gpuops.node.main import main; sys.exit(main(sys.argv[1:]))",
            "agent",
            "--metrics",
            "127.0.0.1:0",
            "--backend",
            "sim",
            *_dirs(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs the prometheus-client package" in lines[0], result.stderr


def test_metrics_with_stdio_is_refused(tmp_path: Path) -> None:
    for entry in ("gpuops", "gpuops.node"):
        result = _run_agent("--stdio", "--metrics", "127.0.0.1:0", "--backend", "sim", entry=entry)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr
        assert "not with --stdio" in result.stderr


def test_bad_process_metrics_is_one_line(tmp_path: Path) -> None:
    result = _run_agent(
        "--metrics", "127.0.0.1:0", "--process-metrics", "all", "--backend", "sim", *_dirs(tmp_path)
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --process-metrics 'all': give top:N, N from 1 to 10000 (the N processes holding the "
        "most GPU memory)"
    ]


def test_the_exporter_answers_only_what_it_serves(tmp_path: Path) -> None:
    import urllib.error
    import urllib.request

    args = ["--backend", "sim", *_dirs(tmp_path)]
    with running_exporter(*args) as (url, _proc):
        base = url.rsplit("/", 1)[0]
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "/secrets", timeout=10)
        assert missing.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as posted:
            urllib.request.urlopen(urllib.request.Request(url, data=b"x", method="POST"), timeout=10)
        assert posted.value.code == 405
        with socket.create_connection(("127.0.0.1", int(url.split(":")[2].split("/")[0])), timeout=10) as s:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Big: " + b"a" * 20000 + b"\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.1 431 ")
        assert "gpuops_node_up" in scrape(url)  # still serving


def test_record_and_metrics_share_one_sampling_loop(tmp_path: Path) -> None:
    from gpuops.node.history.reader import read_history

    history = tmp_path / "history"
    args = ["--backend", "sim", "--sim-spec", str(demo_spec(tmp_path)), "--interval", "0.2", *_dirs(tmp_path)]
    began = time.time()
    with running_exporter(*args, "--record", "--history-dir", str(history)) as (url, _proc):
        time.sleep(1.5)
        assert one(parse(scrape(url)), "gpuops_node_up") == 1.0
        # A second recorder of the same history is refused, as `agent --record` refuses it.
        second = _run_agent("--record", "--history-dir", str(history), "--backend", "sim", *_dirs(tmp_path))
        assert second.returncode == 1 and len(second.stderr.strip().splitlines()) == 1, second.stderr
    recorded = read_history(str(history), "minute", began - 60, time.time() + 60)
    seconds = sum(g.seconds for b in recorded.buckets for g in b.gpus)
    # ~1.5 s of samples at 0.2 s on 8 GPUs: the exporter's samples went into the history.
    assert recorded.buckets and seconds >= 8 * 1.0, recorded
