"""The node's history (gpuops/node/history/): recorder figures worked out by hand, bounds,
files that are garbage, retention, a recorder killed mid-run, the service mode and the agent's
`history` request."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuops.core import protocol as proto
from gpuops.core.history import HOUR, MINUTE, OTHER_USER, history_from_json
from gpuops.core.model import (
    Gpu,
    GpuInfo,
    GpuInstance,
    GpuProcess,
    GpuSample,
    MigState,
    NodeSample,
    NotAvailable,
)
from gpuops.node.agent import Agent
from gpuops.node.history.files import MINUTES_FILE, bucket_text, day_of, hours_file, read_file
from gpuops.node.history.reader import read_history
from gpuops.node.history.recorder import Recorder
from tests.agent_helpers import REPO

GIB = 1 << 30
T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC
NA = NotAvailable("NOT_SUPPORTED")


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _info(index: int = 0, mig_model: str | None = None) -> GpuInfo:
    return GpuInfo(
        index, f"GPU-{index}", "NVIDIA A100-SXM4-80GB", "0000:01:00.0", 0x20B210DE, 80 * GIB, True, mig_model
    )


def _gpu(t: float, util: object, used: int, processes: tuple[GpuProcess, ...], index: int = 0) -> Gpu:
    sample = GpuSample(t, util, NA, used, 80 * GIB, NA, NA, NA, NA)  # type: ignore[arg-type]
    return Gpu(info=_info(index), sample=sample, processes=processes, owner="vision")


def _two_users(t: float) -> NodeSample:
    procs = (
        GpuProcess(11, 30 * GIB, user="alice", groups=("vision",)),
        GpuProcess(12, 10 * GIB, user="bob", groups=("speech",), tenant="speech", tenant_source="limiter"),
    )
    return NodeSample("n1", t, (_gpu(t, 80.0, 40 * GIB, procs), _gpu(t, 0.0, 0, (), index=1)))


def test_two_users_on_one_gpu_by_hand(tmp_path: Path) -> None:
    clock = Clock(T0 + 600)
    rec = Recorder(str(tmp_path), interval=10, clock=clock)
    # Samples every 10 s from 00:09:40 to 00:10:20: the first counts nothing (no previous
    # sample), the next four count 10 s each; the minute boundary at 00:10 splits them.
    for i in range(5):
        rec.add(_two_users(T0 + 580 + 10 * i))
    rec.close()
    (hour,) = read_history(str(tmp_path), "hour", T0, T0 + HOUR, now=clock.t).buckets
    assert hour.start == T0 and hour.span == HOUR
    g0, g1 = hour.gpus
    assert (g0.index, g0.uuid, g0.name, g0.owner, g0.mig) == (
        0,
        "GPU-0",
        "NVIDIA A100-SXM4-80GB",
        "vision",
        False,
    )
    assert g0.memory_total == 80 * GIB
    assert g0.seconds == 40.0 and g0.busy == pytest.approx(0.8 * 40)
    assert g0.memory == 40 * GIB * 40.0 and g0.memory_max == 40 * GIB
    alice, bob = g0.users
    assert (alice.user, alice.groups, alice.tenant, alice.tenant_source, alice.gpu_instance_id) == (
        "alice",
        ("vision",),
        None,
        "",
        None,
    )
    # alice holds 30 of the 40 GiB: three quarters of the GPU, and of its busy time
    assert alice.seconds == 40.0 and alice.held == pytest.approx(30.0) and alice.busy == pytest.approx(24.0)
    assert alice.memory == 30 * GIB * 40.0 and alice.memory_max == alice.process_max == 30 * GIB
    assert alice.processes == 1
    assert (bob.user, bob.tenant, bob.tenant_source) == ("bob", "speech", "limiter")
    assert bob.held == pytest.approx(10.0) and bob.busy == pytest.approx(8.0)
    assert g1.seconds == 40.0 and g1.busy == 0.0 and g1.users == ()
    minutes = read_history(str(tmp_path), "minute", T0, T0 + HOUR, now=clock.t).buckets
    assert [(b.start, b.gpus[0].seconds, b.gpus[0].users[0].held) for b in minutes] == [
        (T0 + 540, 20.0, 15.0),
        (T0 + 600, 20.0, 15.0),
    ]


def test_gaps_and_hour_boundaries(tmp_path: Path) -> None:
    clock = Clock(T0 + 2 * HOUR)
    rec = Recorder(str(tmp_path), interval=10, clock=clock)
    for t in (T0 + HOUR - 15, T0 + HOUR - 5, T0 + HOUR + 5, T0 + HOUR + 100, T0 + HOUR + 110):
        rec.add(_two_users(t))
    rec.close()
    h = read_history(str(tmp_path), "hour", T0, T0 + 2 * HOUR, now=clock.t)
    # 10 s before 01:00, 5 + 5 around it, the 95 s gap (more than 2 intervals) not counted, 10 s
    assert [(b.start, b.gpus[0].seconds) for b in h.buckets] == [(T0, 15.0), (T0 + HOUR, 15.0)]
    assert h.oldest == T0 and h.recording is False  # written "now" by the file's clock, not the test's
    assert (
        read_history(str(tmp_path), "hour", T0 + HOUR, T0 + 2 * HOUR, now=clock.t).buckets[0].start
        == T0 + HOUR
    )


def test_mig_instances_by_hand(tmp_path: Path) -> None:
    gis = (
        GpuInstance(1, 9, "3g.40gb", 0, 4, 40 * GIB, 42),
        GpuInstance(9, 19, "1g.10gb", 6, 1, 10 * GIB, 14),
        GpuInstance(10, 19, "1g.10gb", 7, 1, 10 * GIB, 14),
    )

    def sample(t: float) -> NodeSample:
        gpu = Gpu(
            info=_info(0, "A100-80GB"),
            mig=MigState(True, True, gis),
            sample=GpuSample(t, NA, NA, 26 * GIB, 80 * GIB, NA, NA, NA, NA),
            processes=(
                GpuProcess(1, 15 * GIB, user="carol", gpu_instance_id=1, compute_instance_id=0),
                GpuProcess(2, 5 * GIB, user="carol", gpu_instance_id=1, compute_instance_id=0),
                GpuProcess(3, 6 * GIB, user="erin", gpu_instance_id=9, compute_instance_id=0),
            ),
        )
        return NodeSample("n1", t, (gpu,))

    rec = Recorder(str(tmp_path), interval=10, clock=Clock(T0 + 60))
    for i in range(8):  # 70 s counted
        rec.add(sample(T0 + 10 * i))
    rec.close()
    (b,) = read_history(str(tmp_path), "hour", T0, T0 + HOUR, now=T0).buckets
    (g,) = b.gpus
    assert g.mig and g.seconds == 70.0 and g.busy == pytest.approx(70 * 4 / 7)
    carol, erin = g.users
    assert (carol.user, carol.gpu_instance_id, erin.gpu_instance_id) == ("carol", 1, 9)
    assert carol.held == pytest.approx(30.0) and carol.busy == carol.held  # 3/7 of the GPU
    assert carol.processes == 2 and carol.memory_max == 20 * GIB and carol.process_max == 15 * GIB
    assert erin.held == pytest.approx(10.0) and erin.busy == erin.held  # 1/7


def test_at_most_64_keys_per_gpu_and_bucket(tmp_path: Path) -> None:
    def sample(t: float) -> NodeSample:
        # 100 processes of 512 MiB: 50 GiB of the 80 (more than the GPU has would be a bucket
        # whose figures cannot be true, which the reader leaves out)
        procs = tuple(GpuProcess(100 + u, GIB // 2, user=f"u{u:03d}") for u in range(100))
        return NodeSample("n1", t, (_gpu(t, 100.0, 50 * GIB, procs),))

    rec = Recorder(str(tmp_path), interval=10, clock=Clock(T0))
    rec.add(sample(T0))
    rec.add(sample(T0 + 10))
    rec.close()
    (b,) = read_history(str(tmp_path), "hour", T0, T0 + HOUR, now=T0).buckets
    users = b.gpus[0].users
    assert len(users) == 64
    other = users[-1]
    assert other.user == OTHER_USER and other.groups == () and other.tenant is None
    assert other.processes == 37 and other.seconds == 10.0
    assert other.held == pytest.approx(3.7) and sum(u.held for u in users) == pytest.approx(10.0)
    assert other.memory_max == 37 * GIB // 2 and other.process_max == GIB // 2


def test_garbage_files_are_skipped_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    rec = Recorder(str(tmp_path), interval=10, clock=Clock(T0 + 120))
    for i in range(6):
        rec.add(_two_users(T0 + 10 * i))
    rec.close()
    (tmp_path / hours_file("20251231")).write_bytes(b"\x00garbage{")
    (tmp_path / hours_file("20251230")).write_text(json.dumps({"format": "gpuops-history", "version": 1}))
    (tmp_path / hours_file("20251229")).write_text("[" * 100000)
    caplog.set_level(logging.ERROR, logger="gpuops.history")
    h = read_history(str(tmp_path), "hour", T0 - 5 * 86400, T0 + HOUR, now=T0)
    assert [b.start for b in h.buckets] == [T0] and h.oldest == T0
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "20251231.json: not JSON" in logged and "20251230.json: holds None buckets" in logged
    assert "20251229.json" in logged
    # minutes.json garbage: the reader skips it; a new recorder moves it aside and starts over
    (tmp_path / MINUTES_FILE).write_text(
        '{"format": "gpuops-history", "version": 1, "resolution": "minute", "buckets": [1]}'
    )
    assert read_history(str(tmp_path), "minute", T0, T0 + HOUR, now=T0).buckets == ()
    caplog.clear()
    rec = Recorder(str(tmp_path), interval=10, clock=Clock(T0 + 120))
    assert "buckets[0]: expected an object" in caplog.text
    assert (tmp_path / (MINUTES_FILE + ".corrupt")).exists()
    rec.add(_two_users(T0 + 100))
    rec.add(_two_users(T0 + 110))
    rec.close()
    assert len(read_file(str(tmp_path / MINUTES_FILE), "minute")) == 1


def test_a_restart_goes_on_with_the_hour(tmp_path: Path) -> None:
    clock = Clock(T0 + 200)
    rec = Recorder(str(tmp_path), interval=10, clock=clock)
    for i in range(4):
        rec.add(_two_users(T0 + 10 * i))
    rec.close()
    rec = Recorder(str(tmp_path), interval=10, clock=clock)
    for i in range(4):  # the first sample after a restart counts nothing
        rec.add(_two_users(T0 + 100 + 10 * i))
    rec.close()
    (b,) = read_history(str(tmp_path), "hour", T0, T0 + HOUR, now=clock.t).buckets
    assert b.gpus[0].seconds == 60.0 and b.gpus[0].users[0].held == pytest.approx(45.0)


def test_retention_and_minute_window(tmp_path: Path) -> None:
    clock = Clock(T0 - 40 * 86400)
    rec = Recorder(str(tmp_path), interval=1800, clock=clock, durable=False, flush_every=86400)
    t = T0 - 40 * 86400
    while t <= T0:
        clock.t = t
        rec.add(_two_users(t))
        t += 1800
    rec.close()
    days = sorted(p.name for p in tmp_path.glob("hours-*.json"))
    # The last sample (at T0, midnight) counts for the 30 minutes before: today has no bucket.
    assert days[0] == hours_file(day_of(T0 - 35 * 86400)) and days[-1] == hours_file(day_of(T0 - 1))
    assert len(days) == 35
    minutes = read_file(str(tmp_path / MINUTES_FILE), "minute")
    assert minutes[0].start >= T0 - 120 * MINUTE and minutes[-1].start == T0 - MINUTE
    h = read_history(str(tmp_path), "hour", 0, T0 + 1, now=T0)
    assert h.oldest == T0 - 35 * 86400 and len(h.buckets) == 35 * 24
    assert all(b.gpus[0].seconds == HOUR for b in h.buckets)


def test_the_oldest_day_is_read_once_until_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`oldest` is in every reply; a long-lived agent reads the oldest day file for it once, and
    again only when that file changes or goes."""
    import gpuops.node.history.reader as node_reader

    clock = Clock(T0 - 3 * 86400)
    rec = Recorder(str(tmp_path), interval=1800, clock=clock, durable=False, flush_every=86400)
    t = T0 - 3 * 86400
    while t <= T0:
        clock.t = t
        rec.add(_two_users(t))
        t += 1800
    rec.close()
    days = sorted(tmp_path.glob("hours-*.json"))
    reads: list[str] = []
    real = node_reader.read_buckets

    def counted(path: str, resolution: str) -> Any:
        reads.append(os.path.basename(path))
        return real(path, resolution)

    monkeypatch.setattr(node_reader, "read_buckets", counted)
    window = (T0 - 3600, T0 + 1)  # the last hour: only the newest day file overlaps it
    first = read_history(str(tmp_path), "hour", *window, now=T0)
    assert first.oldest == T0 - 3 * 86400 and days[0].name in reads
    reads.clear()
    again = read_history(str(tmp_path), "hour", *window, now=T0)
    assert again.oldest == first.oldest and days[0].name not in reads
    days[0].unlink()  # pruned: the next oldest day answers
    assert read_history(str(tmp_path), "hour", *window, now=T0).oldest == T0 - 2 * 86400
    assert days[1].name in reads


def test_the_reply_is_bounded_newest_first(tmp_path: Path) -> None:
    rec = Recorder(str(tmp_path), interval=600, clock=Clock(T0))
    for i in range(6 * 24 + 1):
        rec.add(_two_users(T0 - 86400 + 600 * i))
    rec.close()
    full = read_history(str(tmp_path), "hour", T0 - 86400, T0 + HOUR, now=T0)
    assert len(full.buckets) == 24
    cut = read_history(str(tmp_path), "hour", T0 - 86400, T0 + HOUR, now=T0, max_bytes=5000)
    assert 0 < len(cut.buckets) < 24
    assert cut.buckets == full.buckets[-len(cut.buckets) :] and cut.since == cut.buckets[0].start


# ---- a recorder killed mid-run -------------------------------------------------------------------

_KILLED = r"""
import sys, time
from gpuops.node.backends.sim import SimBackend
from gpuops.node.history.recorder import Recorder
t = [float(sys.argv[2])]
backend = SimBackend("mixed-node", clock=lambda: t[0])
rec = Recorder(sys.argv[1], interval=10.0, flush_every=60.0, clock=lambda: t[0])
print("ready", flush=True)
while True:  # 10 simulated seconds per sample, as fast as it goes
    rec.add(backend.sample())
    t[0] += 10.0
    if rec.samples % 50 == 0:
        print(t[0], rec.writes, flush=True)
"""


def test_a_recorder_killed_with_sigkill_leaves_files_that_parse(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=REPO)
    start = T0 + 1800
    child = subprocess.Popen(
        [sys.executable, "-c", _KILLED, str(tmp_path), str(start)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ready"
    last = ""
    for _ in range(40):  # ~2000 samples: 5.5 simulated hours, many writes, then the kill
        last = child.stdout.readline()
    child.send_signal(signal.SIGKILL)
    child.wait(10)
    reached = float(last.split()[0])  # the simulated time the child had at least reached
    days = sorted(tmp_path.glob("hours-*.json"))
    buckets = [b for d in days for b in read_file(str(d), "hour")]
    covered = sum(b.gpus[0].seconds for b in buckets)
    # No hole and nothing twice: the buckets cover [start, end of the last write] exactly ...
    end = buckets[-1].start + buckets[-1].gpus[0].seconds
    assert covered == pytest.approx(end - start)
    # ... and at most one flush interval (60 s of the clock, plus a sample) is lost.
    assert end >= reached - 60.0 - 10.0
    minutes = read_file(str(tmp_path / MINUTES_FILE), "minute")
    assert minutes[-1].start + minutes[-1].gpus[0].seconds == pytest.approx(end)
    # A new recorder takes over: cleans the temporary files, goes on.
    rec = Recorder(str(tmp_path), interval=10, clock=Clock(reached))
    rec.close()
    assert not list(tmp_path.glob(".*.tmp"))


# ---- service mode and the agent's request --------------------------------------------------------


def _node(*args: str, **kwargs: object) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuops.node", "agent", *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
        **kwargs,  # type: ignore[call-overload]
    )


def test_service_mode_writes_what_a_stdio_agent_serves(tmp_path: Path) -> None:
    history = tmp_path / "h"
    recorder = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuops",
            "agent",
            "--record",
            "--backend",
            "sim",
            "--history-dir",
            str(history),
            "--record-interval",
            "0.1",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO,
    )
    try:
        deadline = time.monotonic() + 30
        while not (history / "recorder.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)
        second = _node("--record", "--backend", "sim", "--history-dir", str(history))
        _out, err = second.communicate(timeout=30)
        assert second.returncode == 1
        lines = err.decode().strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"error: another recorder writes {history} (recorder pid"
        )
    finally:
        recorder.send_signal(signal.SIGTERM)
        _out, err = recorder.communicate(timeout=30)
    assert recorder.returncode == 0, err
    agent = _node("--stdio", "--backend", "sim", "--history-dir", str(history))
    requests = [
        proto.request(1, "history", {"resolution": "minute"}),
        proto.request(2, "history", {"resolution": "hour", "since": 0, "until": time.time() + 60}),
        proto.request(3, "history", {"resolution": "week"}),
        proto.request(4, "history", {"since": 10, "until": 5}),
        proto.request(5, "history", {"since": "yesterday"}),
        proto.request(6, "history", {"until": float("1e12")}),
        proto.request(7, "history", {"step": 60}),
    ]
    out, err = agent.communicate(b"".join(requests), timeout=60)
    replies = {m["id"]: m for m in map(json.loads, out.decode().splitlines())}
    minute = history_from_json(replies[1]["result"])
    assert minute.resolution == "minute" and minute.recording
    seconds = sum(b.gpus[0].seconds for b in minute.buckets)
    assert 1.0 < seconds < 60.0
    hour = history_from_json(replies[2]["result"])
    assert sum(b.gpus[0].seconds for b in hour.buckets) == pytest.approx(seconds, abs=0.01)
    assert hour.oldest == hour.buckets[0].start
    # the demo node's first GPU runs training at ~90% for alice
    g = hour.buckets[-1].gpus[0]
    assert g.users[0].user == "alice" and g.busy / g.seconds > 0.5
    for rid in (3, 4, 5, 6, 7):
        assert replies[rid]["ok"] is False and replies[rid]["error"]["code"] == proto.INVALID_ARGS, replies[
            rid
        ]


def test_the_agent_reads_its_history_dir_and_runs_the_hook(tmp_path: Path) -> None:
    rec = Recorder(str(tmp_path / "state" / "history"), interval=10, clock=Clock(T0 + 60))
    for i in range(3):
        rec.add(_two_users(T0 + 10 * i))
    rec.close()
    called: list[int] = []

    async def hook() -> None:
        called.append(1)

    async def run() -> dict[str, object]:
        agent = Agent(None, "sim", "no backend", state_dir=str(tmp_path / "state"), before_history=hook)
        reader = asyncio.StreamReader()
        reader.feed_data(proto.request(1, "history", {"since": T0, "until": T0 + HOUR}))
        reader.feed_eof()
        out: list[bytes] = []

        class Writer:
            def write(self, data: bytes) -> None:
                out.append(data)

            async def drain(self) -> None:
                return None

        await agent.serve(reader, Writer())
        return json.loads(b"".join(out))  # type: ignore[no-any-return]

    reply = asyncio.run(run())
    assert reply["ok"] is True and called == [1]
    h = history_from_json(reply["result"])
    assert (
        h.since == T0
        and h.until == T0 + HOUR
        and len(h.buckets) == 1
        and h.buckets[0].gpus[0].seconds == 20.0
    )


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["-m", "gpuops.node", "agent"], "give one of --stdio"),
        (["-m", "gpuops.node", "agent", "--stdio", "--record"], "give one of --stdio"),
        (["-m", "gpuops", "agent"], "--stdio"),
        (["-m", "gpuops", "agent", "--stdio", "--record"], "not both"),
        (["-m", "gpuops.node", "agent", "--record", "--record-interval", "0"], "--record-interval must lie"),
    ],
)
def test_agent_mode_usage_errors(argv: list[str], says: str, tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, *argv, "--history-dir", str(tmp_path / "h")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert done.returncode == 2, done
    assert says in done.stderr and "Traceback" not in done.stderr


def _reply_sizes(buckets: tuple[Any, ...]) -> list[int]:
    from gpuops.core.history import bucket_to_json

    return [len(json.dumps(bucket_to_json(b), separators=(",", ":"))) + 1 for b in buckets]


def test_the_bound_holds_for_files_that_grow_when_written_again(tmp_path: Path) -> None:
    """read_history skips measuring the buckets when the files are 5 times smaller than the
    budget; a file whose numbers and names grow most when encoded again must still fit."""
    rec = Recorder(str(tmp_path), interval=600, clock=Clock(T0))
    for i in range(6 * 24 + 1):
        rec.add(_two_users(T0 - 86400 + 600 * i))
    rec.close()
    path = tmp_path / hours_file(day_of(T0 - 1))
    doc = json.loads(path.read_text())
    for b in doc["buckets"]:
        for g in b["gpus"]:
            for u in g["users"]:
                u["user"] = "\U0001f600" * 8  # 4 bytes of UTF-8 each, 12 once escaped
                u["memory"] = 1e13  # byte-seconds: less than 10 GiB for 3000 s, so it can be true
    # Written by hand: raw UTF-8 and "1e13" (the reply says "\ud83d\ude00" and "10000000000000.0").
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":")).replace("1e+13", "1e13")
    path.write_text(text, encoding="utf-8")
    full = read_history(str(tmp_path), "hour", T0 - 86400, T0 + HOUR, now=T0)
    assert len(full.buckets) == 24 and full.buckets[0].gpus[0].users[0].memory == 1e13
    sizes = _reply_sizes(full.buckets)
    file_bytes = len(text.encode("utf-8"))
    assert file_bytes < sum(sizes) < 5 * file_bytes  # it did grow, less than the bound says
    skipped = 5 * file_bytes + 24  # from here on nothing is measured
    for max_bytes in sorted(
        {*range(0, sum(sizes) + 2000, 997), *(sum(sizes[k:]) for k in range(24)), skipped, skipped - 1}
    ):
        cut = read_history(str(tmp_path), "hour", T0 - 86400, T0 + HOUR, now=T0, max_bytes=max_bytes)
        n = len(cut.buckets)
        assert sum(sizes[24 - n :]) <= max_bytes if n else True
        assert n == 24 or sum(sizes[24 - n - 1 :]) > max_bytes  # the most recent that fit, all of them
        assert cut.buckets == full.buckets[24 - n :]


def test_the_reply_is_the_files_json_and_decodes_to_the_same_history(tmp_path: Path) -> None:
    from gpuops.core.history import bucket_to_json, history_to_json

    rec = Recorder(str(tmp_path), interval=600, clock=Clock(T0))
    for i in range(6 * 24 + 1):
        rec.add(_two_users(T0 - 86400 + 600 * i))
    rec.close()
    h = read_history(str(tmp_path), "hour", T0 - 86400, T0 + HOUR, now=T0)
    on_disk = json.loads((tmp_path / hours_file(day_of(T0 - 1))).read_text())["buckets"]
    assert [bucket_to_json(b) for b in h.buckets] == on_disk
    line = proto.reply(1, history_to_json(h))
    decoded = history_from_json(proto.parse_message(line, json.loads).result)
    assert decoded == h and decoded.buckets[3].gpus[0].users[1].user == "bob"


def _serve_history(state: Path, since: float, until: float) -> bytes:
    async def run() -> bytes:
        agent = Agent(None, "sim", "no backend", state_dir=str(state))
        reader = asyncio.StreamReader()
        reader.feed_data(proto.request(1, "history", {"resolution": "hour", "since": since, "until": until}))
        reader.feed_eof()
        out: list[bytes] = []

        class Writer:
            def write(self, data: bytes) -> None:
                out.append(data)

            async def drain(self) -> None:
                return None

        await agent.serve(reader, Writer())
        return b"".join(out)

    return asyncio.run(run())


def test_the_agent_answers_history_with_the_files_bucket_lines(tmp_path: Path) -> None:
    """Hour files hold one bucket per line; the agent splices those lines into its reply instead
    of encoding the buckets again (issue 22), and the reply decodes to what read_history reads."""
    from gpuops.core.history import history_to_json

    directory = tmp_path / "state" / "history"
    rec = Recorder(str(directory), interval=600, clock=Clock(T0))
    for i in range(6 * 24 + 1):
        rec.add(_two_users(T0 - 86400 + 600 * i))
    rec.close()
    path = directory / hours_file(day_of(T0 - 1))
    lines = path.read_text().split("\n")
    assert lines[0].endswith('"buckets":[') and lines[-2:] == ["]}", ""] and len(lines) == 24 + 3
    expected = read_history(str(directory), "hour", T0 - 86400, T0 + HOUR, now=T0)
    line = _serve_history(tmp_path / "state", T0 - 86400, T0 + HOUR)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    for bucket_line in lines[1:-2]:
        assert bucket_line.rstrip(",").encode() in line  # as the file has it
    reply = proto.parse_message(line, json.loads)
    got = history_from_json(reply.result)
    assert got.buckets == expected.buckets and got.since == expected.since and got.until == expected.until
    spliced = json.loads(line)["result"]
    encoded = json.loads(proto.reply(1, history_to_json(expected)))["result"]
    spliced.pop("recording"), encoded.pop("recording")  # the agent's clock against the test's
    assert spliced == encoded
    # A file of an earlier agent (one line) is read and answered as before.
    path.write_text(json.dumps(json.loads(path.read_text()), separators=(",", ":")) + "\n")
    again = history_from_json(
        proto.parse_message(_serve_history(tmp_path / "state", T0 - 86400, T0 + HOUR), json.loads).result
    )
    assert again.buckets == expected.buckets


def test_a_bucket_line_that_is_not_one_bucket_is_a_bad_file(tmp_path: Path) -> None:
    rec = Recorder(str(tmp_path), interval=600, clock=Clock(T0))
    for i in range(6 * 3):
        rec.add(_two_users(T0 - 3 * HOUR + 600 * i))
    rec.close()
    path = tmp_path / hours_file(day_of(T0 - 1))
    before = read_file(str(path), "hour")
    lines = path.read_text().split("\n")
    # A bucket cut in two after a comma, each part ending its line with one: every line ends as
    # the layout's do and the file is still JSON as a whole, but a line is not one bucket. It is
    # read as a whole, and no line is kept to be sliced into a reply.
    cut = lines[2].index(",") + 1
    odd = [lines[0], lines[1], lines[2][:cut], lines[2][cut:], *lines[3:]]
    path.write_text("\n".join(odd))
    after = read_file(str(path), "hour")
    assert after == before and all(bucket_text(b) is None for b in after)
    assert all(bucket_text(b) is not None for b in before)


def test_a_name_orjson_refuses_is_read_as_the_standard_library_reads_it(tmp_path: Path) -> None:
    """The node parses its bucket lines with orjson when it has it; a user name that is not valid
    UTF-8 (kept by Python as a lone surrogate, written escaped) is refused by orjson and read by
    the standard library, so the file is read the same with or without orjson, lines kept."""
    odd = "build\udcff"  # a name byte Python could not decode (surrogateescape)
    procs = (GpuProcess(11, 30 * GIB, user=odd, groups=("vision",)),)
    rec = Recorder(str(tmp_path), interval=600, clock=Clock(T0))
    for i in range(6 * 2):
        rec.add(NodeSample("n1", T0 - 2 * HOUR + 600 * i, (_gpu(T0, 80.0, 30 * GIB, procs),)))
    rec.close()
    path = tmp_path / hours_file(day_of(T0 - 1))
    assert "\\udcff" in path.read_text()
    buckets = read_file(str(path), "hour")
    assert buckets and {u.user for b in buckets for g in b.gpus for u in g.users} == {odd}
    assert all(bucket_text(b) is not None for b in buckets)  # each line still sliced as it is


def test_the_operator_asks_for_deflated_history_and_reads_the_same_buckets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent lists `history-zlib` in its hello; the operator's client then asks for the reply
    deflated (issue 22: a week of a node's hours, ~18 times smaller) and decodes the same history
    as the uncompressed reply gives; an agent asked without `compress` answers as before."""
    import socket

    from gpuops.fleet.agent_client import AgentClient

    directory = tmp_path / "state" / "history"
    rec = Recorder(str(directory), interval=600, clock=Clock(T0))
    for i in range(6 * 24 + 1):
        rec.add(_two_users(T0 - 86400 + 600 * i))
    rec.close()
    expected = read_history(str(directory), "hour", T0 - 86400, T0 + HOUR, now=T0)
    deflated: list[int] = []
    real = proto.deflate_history

    def counting(text: str) -> dict[str, str]:
        out = real(text)
        deflated.append(len(out["zlib"]) * 100 // len(text))
        return out

    monkeypatch.setattr(proto, "deflate_history", counting)

    async def run() -> None:
        left, right = socket.socketpair()
        agent = Agent(None, "sim", "no backend", state_dir=str(tmp_path / "state"))
        a_reader, a_writer = await asyncio.open_unix_connection(sock=left)
        serving = asyncio.create_task(agent.serve(a_reader, a_writer))
        c_reader, c_writer = await asyncio.open_unix_connection(sock=right)
        client = AgentClient(c_reader, c_writer, "n1")
        hello = await client.start()
        assert proto.HISTORY_ZLIB in hello.capabilities
        got = await client.history("hour", T0 - 86400, T0 + HOUR)
        assert got.buckets == expected.buckets and got.since == expected.since
        await client.close()
        await asyncio.wait_for(serving, 10)
        a_writer.close()

    asyncio.run(run())
    assert len(deflated) == 1 and deflated[0] < 30  # base64 of the deflated text, in percent
    plain = history_from_json(
        proto.parse_message(_serve_history(tmp_path / "state", T0 - 86400, T0 + HOUR), json.loads).result
    )
    assert plain.buckets == expected.buckets and len(deflated) == 1
