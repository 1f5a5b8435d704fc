"""Where each process's tenant came from, as the operator sees it in the TUI (Textual's Pilot).

A simulated node (the real SimBackend, its processes with unix users and groups) under a
fleet.yaml with teams, a per-GPU owner and `attribution:` naming a plugin found through a real
entry point (a dist-info on sys.path): the node's process table shows every source — limiter,
the plugin, user, group, owner — and `- (none)` for a process nobody claims, and the tenants
screen counts that one.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from rich.console import Console
from textual.pilot import Pilot

from gpuops import attributors
from gpuops.fleet.source import LIVE, FleetEvent, FleetSnapshot, NodeView
from gpuops.node.backends.sim import SimBackend
from gpuops.spec import parse_fleet
from gpuops.tenancy.ownership import Ownership
from gpuops.tui.app import GpuopsApp
from gpuops.tui.screens.detail import DetailScreen
from gpuops.tui.screens.tenants import COLUMNS as TENANT_COLUMNS
from gpuops.tui.screens.tenants import TenantsScreen
from gpuops.tui.table import LiveTable
from gpuops.views.feed import Feed
from tests.tui.conftest import NOON, Clock

pytestmark = pytest.mark.timeout(60)

SPEC = {
    "hostname": "sim-attr-01",
    "users": {"alice": 1001, "bob": 1002, "carol": 1003, "eve": 1004, "svc-embed": 1005},
    "groups": {"linguists": ["carol"], "staff": ["alice", "bob", "carol", "eve"]},
    "tenants": {"vision": ["alice"], "nlp": ["bob"]},
    "gpus": [
        {"model": "A100-SXM4-80GB", "count": 1, "owner": "vision"},
        {"model": "A100-SXM4-80GB", "count": 1},
    ],
    "workloads": [
        {"name": "limited", "kind": "training", "tenant": "nlp", "user": "bob", "gpu": 0, "limiter": True},
        {"name": "service", "kind": "training", "user": "svc-embed", "gpu": 0, "command": "python serve.py"},
        {"name": "alice-train", "kind": "training", "user": "alice", "gpu": 0},
        {"name": "carol-train", "kind": "training", "user": "carol", "gpu": 0},
        {"name": "eve-owned", "kind": "training", "user": "eve", "gpu": 0},
        {"name": "eve-unowned", "kind": "training", "user": "eve", "gpu": 1},
    ],
}

FLEET = """\
version: 1
teams:
  vision: {users: [alice]}
  nlp: {users: [bob], groups: [linguists]}
  platform: {}
nodes:
  - {host: sim-attr-01, gpus: {"0": vision}}
attribution:
  order: [limiter, services, user, group, owner]
"""

PLUGIN = '''
from gpuops.tenancy import Attribution


class Services:
    """Service accounts (svc-*) are the platform team's."""

    name = "services"

    def __init__(self, settings):
        pass

    def attribute(self, process, context):
        if isinstance(process.user, str) and process.user.startswith("svc-"):
            return Attribution("platform", "services", "service account")
        return None
'''


@pytest.fixture
def services_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    (tmp_path / "tui_services_attributor.py").write_text(textwrap.dedent(PLUGIN))
    info = tmp_path / "tui_services_attributor-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tui-services-attributor\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[gpuops.attributors]\nservices = tui_services_attributor:Services\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    attributors.refresh()
    yield
    attributors.refresh()


class OneNode:
    """A FleetSource of one simulated node, sampled once."""

    def __init__(self, clock: Clock) -> None:
        backend = SimBackend(spec=SPEC, clock=clock)
        now = clock()
        self.view = NodeView(
            "sim-attr-01",
            "sim:sim-attr-01",
            LIVE,
            since=now,
            last_seen=now,
            inventory=backend.inventory(),
            sample=backend.sample(),
        )

    label = "one simulated node (test)"
    interval = 1.0

    def start(self) -> None:
        pass

    async def stop(self) -> None:
        pass

    def snapshot(self, now: float) -> FleetSnapshot:
        return FleetSnapshot(now, 1.0, (self.view,))

    def events(self) -> Sequence[FleetEvent]:
        return ()

    async def wait_changed(self, timeout: float | None = None) -> bool:
        await asyncio.sleep(timeout or 0)
        return False


def _cell(value: object) -> str:
    console = Console(width=200, color_system=None, record=True)
    console.print(value)
    return console.export_text().strip()


def _rows(app: GpuopsApp, selector: str) -> list[list[str]]:
    table = app.screen.query_one(selector, LiveTable)
    return [[_cell(c) for c in table.get_row_at(i)] for i in range(table.row_count)]


@pytest.mark.usefixtures("services_plugin")
def test_the_process_table_shows_each_tenant_and_its_source() -> None:
    clock = Clock(NOON)
    source = OneNode(clock)
    ownership = Ownership.from_fleet(parse_fleet(FLEET, "fleet.yaml"))
    assert ownership.chain is not None and ownership.chain.problems == ()
    app = GpuopsApp(Feed(source, ownership, clock, 3600.0))
    seen: dict[str, list[list[str]]] = {}

    async def script(pilot: Pilot[None]) -> None:
        await pilot.pause()
        await pilot.press("colon", *"nodes", "enter")
        await pilot.pause()
        await pilot.press("enter")  # the node's detail
        await pilot.pause()
        assert isinstance(app.screen, DetailScreen) and app.screen.node == "sim-attr-01"
        await pilot.press("a")  # processes of every GPU
        await pilot.pause()
        seen["procs"] = _rows(app, "#proc-table")
        await pilot.press("colon", *"tenants", "enter")
        await pilot.pause()
        assert isinstance(app.screen, TenantsScreen)
        seen["tenants"] = _rows(app, "#tenants-table")

    async def main() -> None:
        async with app.run_test(size=(160, 45)) as pilot:
            await script(pilot)

    asyncio.run(asyncio.wait_for(main(), 60))

    # GPU, MIG, PID, User, Tenant, Memory, Command
    by_user_gpu = {(row[3], row[0]): row[4] for row in seen["procs"]}
    assert by_user_gpu == {
        ("bob", "0"): "nlp (limiter)",  # the limiter region's label, though bob's team says the same
        ("svc-embed", "0"): "platform (services)",  # the plugin
        ("alice", "0"): "vision (user)",
        ("carol", "0"): "nlp (group)",  # carol is in no team; her group linguists is nlp's
        ("eve", "0"): "vision (owner)",  # nobody claims eve: the GPU's owner does
        ("eve", "1"): "- (none)",  # ... and on an unowned GPU she is unattributed, still listed
    }
    tenants = {row[0]: row for row in seen["tenants"]}
    processes = [c.key for c in TENANT_COLUMNS].index("procs")
    assert tenants["-"][processes] == "1"
    assert {t: int(tenants[t][processes]) for t in ("nlp", "vision", "platform")} == {
        "nlp": 2,
        "vision": 2,
        "platform": 1,
    }
