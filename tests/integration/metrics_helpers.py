"""Starting exporters as processes and reading their /metrics, for the exporter tests."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from tests.agent_helpers import REPO

URL_LINE = re.compile(rb"serving metrics on (http://\S+/metrics)")
Series = dict[str, list[tuple[dict[str, str], float]]]


def demo_spec(tmp_path: Path, epoch: float | None = None) -> Path:
    """The built-in demo node with a fixed epoch, so a second SimBackend here reproduces the
    exporter's figures at any time it names."""
    spec = json.loads((Path(REPO) / "gpuops/node/sim/scenarios/demo-node.json").read_text())
    spec["epoch"] = epoch if epoch is not None else float(int(time.time()) - 3600)
    path = tmp_path / "node.json"
    path.write_text(json.dumps(spec))
    return path


@contextmanager
def running_exporter(
    *args: str, entry: tuple[str, ...] = ("gpuops",), env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`gpuops agent --metrics 127.0.0.1:0 ARGS` (or `python -m gpuops.node agent ...`) as a
    process; yields (url, process) once it serves; SIGTERM at the end, which must exit 0."""
    command = [sys.executable, "-m", *entry, "agent", "--metrics", "127.0.0.1:0", *args]
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, cwd=REPO, env=env)
    assert proc.stderr is not None
    try:
        seen = b""
        deadline = time.monotonic() + 30
        url = None
        while url is None:
            line = proc.stderr.readline()
            seen += line
            match = URL_LINE.search(line)
            if match:
                url = match.group(1).decode()
            elif not line or time.monotonic() > deadline:
                raise AssertionError(f"the exporter did not start: {seen.decode(errors='replace')!r}")
        yield url, proc
        proc.terminate()
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()


def scrape(url: str, accept_gzip: bool = False) -> str:
    headers = {"Accept-Encoding": "gzip"} if accept_gzip else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=20) as response:
        assert response.status == 200
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            import gzip

            body = gzip.decompress(body)
        return str(body.decode())


def parse(text: str) -> Series:
    out: Series = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return out


def one(series: Series, name: str, **labels: str) -> float | None:
    """The value of the one series of `name` whose labels include `labels` (None: absent)."""
    found = [v for lbl, v in series.get(name, []) if all(lbl.get(k) == x for k, x in labels.items())]
    assert len(found) <= 1, (name, labels, found)
    return found[0] if found else None


# dcgm-exporter's own label name, kept so its dashboards and joins work (docs/metrics.md): the
# only thing promtool's lint may say about a gpuops scrape.
_ACCEPTED_LINT = re.compile(r"^\S+ label names should be written in 'snake_case' not 'camelCase'$")


def promtool_problems(text: str) -> list[str] | None:
    """What `promtool check metrics` says about a scrape, beyond the camelCase lint that
    dcgm-exporter's `modelName` earns; None when promtool is not installed."""
    promtool = shutil.which("promtool")
    if promtool is None:
        return None
    camel = {n for n in re.findall(r"[{,]([A-Za-z_][A-Za-z0-9_]*)=", text) if re.search(r"[a-z][A-Z]", n)}
    assert camel <= {"modelName"}, camel
    result = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
    )
    lines = [ln for ln in (result.stdout + result.stderr).splitlines() if ln.strip()]
    return [ln for ln in lines if not _ACCEPTED_LINT.match(ln)]
