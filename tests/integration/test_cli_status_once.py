"""`gpuops status --once` prints one refresh as status prints it (issue 28 item 6): one JSON line
with --json (JSON Lines, as its help says; it printed the document indented over thousands of
lines), the summary line without a terminal (it printed the tables). Real sshd on loopback."""

from __future__ import annotations

import json
from pathlib import Path

from tests.integration.test_cli_fleet import _fleet_yaml, _gpuops
from tests.sshtest.sshd import Sshd


def test_status_once_prints_one_refresh_as_status_does(sshd_loopback: Sshd, tmp_path: Path) -> None:
    fleet = str(_fleet_yaml(tmp_path, sshd_loopback))
    as_json = _gpuops("status", "-f", fleet, "--once", "--json")
    assert as_json.returncode == 0, as_json.stderr
    (line,) = as_json.stdout.splitlines()
    document = json.loads(line)
    assert set(document) == set(json.loads(_gpuops("discover", "-f", fleet, "--json").stdout))
    assert [n["state"] for n in document["nodes"]] == ["live"]
    plain = _gpuops("status", "-f", fleet, "--once")  # stdout is a pipe: no terminal
    assert plain.returncode == 0, plain.stderr
    (summary,) = plain.stdout.splitlines()
    assert "1 nodes: 1 live, 0 stale, 0 unreachable" in summary and "GPUs busy" in summary
