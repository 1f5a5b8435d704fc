"""A node says which time its history could not be read: a corrupt day file, and a minutes file
the recorder moved aside, through the stdio agent's `history` request (a child process)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from gpuops.core import protocol as proto
from gpuops.core.history import history_from_json
from gpuops.node.history.files import DAY, day_of, day_start, hours_file
from gpuops.node.history.recorder import Recorder
from tests.node.test_history import _node


def test_unreadable_files_are_reported_with_the_time_they_held(tmp_path: Path) -> None:
    history = tmp_path / "h"
    history.mkdir()
    now = time.time()
    yesterday = day_of(now - DAY)
    today = day_start(day_of(now))
    (history / hours_file(yesterday)).write_text('{"format": "gpuops-history", "version": 1')
    (history / "minutes.json").write_text("garbage")
    Recorder(str(history)).close()  # finds minutes.json unreadable: moves it aside, starts afresh
    assert (history / "minutes.json.corrupt").exists()

    agent = _node("--stdio", "--backend", "sim", "--history-dir", str(history))
    requests = [
        proto.request(1, "history", {"resolution": "hour", "since": now - 2 * DAY, "until": now}),
        proto.request(2, "history", {"resolution": "minute", "since": now - 3600, "until": now + 60}),
        # The last ten minutes, but never before today's start: a run in the first minutes after
        # midnight would otherwise ask for a piece of yesterday, whose file is the corrupt one.
        proto.request(3, "history", {"resolution": "hour", "since": max(now - 600, today), "until": now}),
    ]
    out, err = agent.communicate(b"".join(requests), timeout=60)
    replies = {m["id"]: m for m in map(json.loads, out.decode().splitlines())}
    assert all(r["ok"] for r in replies.values()), (replies, err)

    hours = history_from_json(replies[1]["result"])
    (hole,) = hours.unreadable
    assert (hole.since, hole.until) == (day_start(yesterday), day_start(yesterday) + DAY)
    assert hours_file(yesterday) in hole.reason and "not JSON" in hole.reason

    minutes = history_from_json(replies[2]["result"])
    (lost,) = minutes.unreadable
    assert lost.since == now - 3600 and lost.until > now - 60  # the hour asked, up to the move
    assert "moved it aside to minutes.json.corrupt" in lost.reason

    # A reply whose time no unreadable file reaches is what it always was: no `unreadable` key.
    assert "unreadable" not in replies[3]["result"]
