"""The Pool screen (`:pool`): silos and the shared pool per team, GPUs moved by hand or by the
planner, the plan reviewed and applied.

The pilot tests drive the TUI by keys against the simulated `silos` fleet over real SSH on
loopback (7 days of history per node, recorded and served by each node's agent): mark two GPUs
of the idle robotics silo, move them into the pool, review the plan, confirm, and see the new
layout — in the screen, in fleet.yaml and in the limiter table the node's agent reports — then
move one back. --readonly refuses moving and applying. The steps below the screen
(`gpuops.views.pool`) are tested on a small fleet.yaml with hand-made evidence.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import shutil
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import cast

import pytest
from rich.console import Console
from textual.pilot import Pilot
from textual.widgets import Static

from gpuops.cli.tui import fleet_source
from gpuops.core.driver_memory import DriverMemory
from gpuops.core.history import History
from gpuops.core.model import Gpu, GpuInfo, NodeSample
from gpuops.fleet.targets import node_targets
from gpuops.plan.apply import NodeResult
from gpuops.plan.live import NodeLive, read_live
from gpuops.simfleet import Launched, launch, stop
from gpuops.spec import load_fleet, parse_fleet
from gpuops.tenancy.accounting import Evidence, team_sides
from gpuops.tenancy.rebalance import GpuRef, without
from gpuops.tui.app import GpuopsApp
from gpuops.tui.keys import GLOBAL_KEYS
from gpuops.tui.screens.confirm import ConfirmScreen
from gpuops.tui.screens.help import HelpScreen
from gpuops.tui.screens.pool import PoolScreen
from gpuops.tui.table import LiveTable
from gpuops.tui.widgets import StatusBar, TopBar
from gpuops.views.feed import Feed
from gpuops.views.pool import (
    DEFAULT_WINDOW,
    Applied,
    PoolError,
    PoolSource,
    PoolView,
    Review,
    draft_moves,
    draft_planner,
    fleet_text,
    pool_gpus,
    write_fleet,
)
from tests.tenancy_helpers import NOW, steady_evidence

SIZE = (160, 60)


def text_of(widget: Static) -> str:
    console = Console(width=400, record=True, color_system=None)
    console.print(widget.content)
    return console.export_text()


def rows(app: GpuopsApp, selector: str) -> dict[str, list[str]]:
    table = app.screen.query_one(selector, LiveTable)
    return {table.rows[i][0]: [str(c) for c in table.get_row_at(i)] for i in range(table.row_count)}


# ---- the screen over the simulated fleet, by keys ----------------------------------------------------


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    directory = tmp_path_factory.mktemp("pool-silos")
    started = launch(directory, "silos", timeout=90)
    try:
        yield started
    finally:
        stop(directory)


def own_copy(sim: Launched, tmp_path: Path) -> Path:
    """The fleet's fleet.yaml, copied: the screen rewrites it."""
    path = tmp_path / "fleet.yaml"
    shutil.copyfile(sim.dir / "fleet.yaml", path)
    return path


def pool_app(path: Path, readonly: bool = False) -> GpuopsApp:
    source, ownership = fleet_source(path, "1s", "simulated silos fleet (pool test)")
    return GpuopsApp(Feed(source, ownership, period=1.0), readonly=readonly, pool=PoolSource(path))


def run(
    app: GpuopsApp,
    script: Callable[[Pilot[None]], object],
    timeout: float = 240,
    size: tuple[int, int] = SIZE,
) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await script(pilot)  # type: ignore[misc]

    asyncio.run(asyncio.wait_for(main(), timeout))


async def settled(pilot: Pilot[None], screen: PoolScreen, timeout: float = 90) -> None:
    """Until the screen's step is done (the worker finished and the screen drew its result)."""
    deadline = time.monotonic() + timeout
    await pilot.pause(0.1)
    while True:
        while screen.job:
            if time.monotonic() > deadline:
                raise AssertionError(f"still {screen.job} after {timeout}s")
            await pilot.pause(0.2)
        await pilot.pause()
        if not screen.job:  # else a step that started once the last ended (the history after an apply)
            break
    assert not screen.error, screen.error


async def open_pool(pilot: Pilot[None]) -> PoolScreen:
    await pilot.press("colon", *"pool", "enter")
    await pilot.pause()
    screen = pilot.app.screen
    assert isinstance(screen, PoolScreen)
    await settled(pilot, screen)
    assert screen.view is not None
    return screen


def status(app: GpuopsApp) -> str:
    return text_of(app.screen.query_one(StatusBar))


def review_text(app: GpuopsApp) -> str:
    return text_of(app.screen.query_one("#pool-review-text", Static))


def limiter_of(path: Path, node: str) -> NodeLive:
    target = next(t for t in node_targets(load_fleet(path)) if t.name == node)
    return asyncio.run(read_live(target))


def test_mark_move_review_apply_and_see_the_new_layout(sim: Launched, tmp_path: Path) -> None:
    path = own_copy(sim, tmp_path)
    original = path.read_bytes()
    app = pool_app(path)
    robotics = [f"sim-robotics-01:{i}" for i in range(8)]

    async def script(pilot: Pilot[None]) -> None:
        screen = await open_pool(pilot)
        assert " pool " in text_of(app.screen.query_one(TopBar))
        head = text_of(screen.query_one("#pool-head", Static))
        assert "pool shared" in head and "not in fleet.yaml yet" in head
        assert "evidence: 24h (hour buckets) from 8 of 8 nodes" in head
        teams = rows(app, "#pool-teams")
        # robotics: 8 idle GPUs in its silo, nothing in the pool
        assert teams["robotics"][1:4] == ["8", "0", "8"] and teams["robotics"][5:7] == ["0", "0"]
        assert float(teams["vision"][2]) > 10  # the busy training team uses its silo
        gpus = rows(app, "#pool-gpus")
        assert len(gpus) == 48 and all(gpus[k][4] == "silo" and gpus[k][5] == "0%" for k in robotics)
        assert gpus["sim-vision-01:0"][8].startswith("vision ")

        # mark two GPUs of the idle robotics silo (space marks and moves down), move them in
        table = screen.query_one("#pool-gpus", LiveTable)
        table.move_to_key("sim-robotics-01:0")
        await pilot.press("space", "space")
        assert screen.marked == {"sim-robotics-01:0", "sim-robotics-01:1"}
        assert rows(app, "#pool-gpus")["sim-robotics-01:0"][0] == "●"
        await pilot.press("m")
        await settled(pilot, screen)
        assert screen.review is not None and screen.marked == set()
        gpus = rows(app, "#pool-gpus")
        assert [gpus[k][4] for k in robotics[:3]] == ["silo → pool shared", "silo → pool shared", "silo"]
        teams = rows(app, "#pool-teams")
        assert teams["robotics"][1] == "8 → 6" and teams["robotics"][5] == "0 → 2"
        # vision (saturated) needs 74 GiB, more than these 40 GiB cards: not placed there (issue 18)
        assert teams["(all teams)"][6] == "0"
        text = review_text(app)
        assert "Moved by hand: 2 GPUs into pool shared" in text
        assert "sim-robotics-01:0 (robotics's silo) joins pool shared, moved by hand" in text
        assert "guaranteed 2 GPUs of the pool" not in text
        assert "vision: 2 GPUs of its guarantee left out: its memory need" in text
        # the plan: the limiter lines of those two GPUs, nothing else
        plan = "\n".join(screen.review.lines)
        assert "node sim-robotics-01" in plan and "GPU 0 " in plan and "GPU 1 " in plan
        assert "GPU 2 " not in plan and plan.count("node ") == 1
        assert "+ limiter tenant" in plan and "Plan: 2 to add, 0 to change, 0 to remove on 2 GPU(s)" in text
        assert "a: apply" in text
        assert path.read_bytes() == original  # nothing written yet

        # apply: a question first; n changes nothing, y applies
        await pilot.press("a")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        body = text_of(app.screen.query_one("#confirm-body", Static))
        assert "is rewritten first" in body and "2 to add" in body and "2 GPUs of 1 node are applied" in body
        await pilot.press("n")
        await pilot.pause()
        assert screen.is_current and screen.review is not None and "nothing applied" in status(app)
        await pilot.press("a")
        await pilot.pause()
        await pilot.press("y")
        await settled(pilot, screen)
        applied = screen.applied
        assert applied is not None and applied.ok and screen.review is None
        assert [(r.name, r.status) for r in applied.results] == [("sim-robotics-01", "changed")]
        text = review_text(app)
        assert "node sim-robotics-01: changed" in text and "limiter tenant lines written" in text
        assert applied.backup is not None and applied.backup.read_bytes() == original

        # the new layout, in the screen: membership read back from fleet.yaml, the limiter
        # table read back from the node
        gpus = rows(app, "#pool-gpus")
        assert [gpus[k][4] for k in robotics[:3]] == ["pool shared", "pool shared", "silo"]
        assert all("limiter " in gpus[k][9] and "* best-effort" in gpus[k][9] for k in robotics[:2])
        assert gpus[robotics[2]][9] == ""
        teams = rows(app, "#pool-teams")
        assert teams["robotics"][1] == "6" and teams["robotics"][5] == "2"
        head = text_of(screen.query_one("#pool-head", Static))
        assert "pool shared · 2 GPUs · burst-share · limiter carving" in head
        # ... and in the live views: the two GPUs in the pool, its guarantees no longer borrowing
        version = app.feed.version
        while app.feed.version == version:
            await pilot.pause(0.2)
        live = {r.team: r for r in app.feed.state.tenants}
        silo, pool = live["robotics"], live["pool shared"]
        assert (silo.owned, silo.silo, silo.pooled, silo.guaranteed) == (8, 6, 2, 6)
        assert silo.idle == 6  # its silo's idle GPUs; the two in the pool are the pool's
        assert (pool.pool, pool.owned, pool.guaranteed) == ("shared", 2, 0)
        assert 0 <= pool.idle <= 2  # the simulated queue may already run work there
        teams = [r for r in live.values() if r.pool is None]
        assert sum(r.guaranteed for r in teams) == pytest.approx(46)  # 46 in silos, none in the pool

        # ... and one of them back to the silo: its limiter lines go with it
        table.move_to_key("sim-robotics-01:1")
        await pilot.press("b")
        await settled(pilot, screen)
        assert screen.review is not None
        plan = "\n".join(screen.review.lines)
        assert "GPU 1 " in plan and "- limiter tenant" in plan and "GPU 0 " not in plan
        assert "pool's limiter lines are removed" in review_text(app)
        assert rows(app, "#pool-teams")["robotics"][1] == "6 → 7"
        await pilot.press("a")
        await pilot.pause()
        await pilot.press("y")
        await settled(pilot, screen)
        assert screen.applied is not None and screen.applied.ok
        gpus = rows(app, "#pool-gpus")
        assert [gpus[k][4] for k in robotics[:2]] == ["pool shared", "silo"]
        assert gpus[robotics[1]][9] == ""

        # :tenants has the pool's row (one GPU now); Enter on it opens the Pool screen
        await pilot.press("colon", *"tenants", "enter")
        version = app.feed.version
        while app.feed.version == version:
            await pilot.pause(0.2)
        await pilot.pause()
        tenants = rows(app, "#tenants-table")
        assert tenants["pool shared"][1] == "1" and tenants["robotics"][1] == "8"
        await pilot.press("N")  # by name: platform, then the pool's row
        app.screen.query_one("#tenants-table", LiveTable).move_to_key("platform")
        await pilot.press("down")
        await pilot.pause()
        panel = text_of(app.screen.query_one("#tenant-panel", Static))
        assert "pool shared  1 GPU " in panel and "guarantees" in panel, panel
        assert "idle capacity" in panel and "GPU-time share" not in panel, panel  # its capacity only
        await pilot.press("enter")
        await pilot.pause()
        assert app.screen is screen
        await pilot.press("q")

    run(app, script)

    # fleet.yaml: the pool as the screen wrote it, loaded by the ordinary loader
    fleet = load_fleet(path)
    assert [fleet.pool_of("sim-robotics-01", i) for i in range(3)] == ["shared", None, None]
    assert "sim-robotics-01" in path.read_text() and "pool: shared" in path.read_text()
    assert len(list(tmp_path.glob("fleet.yaml.bak-*"))) == 2
    # the limiter table the node's agent reports (the `config` request)
    live = limiter_of(path, "sim-robotics-01")
    assert live.ok and live.limiter is not None
    gpus = {g.info.index: g for g in live.gpus}
    assert {line.name for line in live.limiter if line.applies_to(gpus[0].info.index, gpus[0].info.uuid)} >= {
        "*"
    }
    assert not [line for line in live.limiter if line.applies_to(gpus[1].info.index, gpus[1].info.uuid)]
    assert not [line for line in live.limiter if line.applies_to(gpus[2].info.index, gpus[2].info.uuid)]


class CountingPoolSource(PoolSource):
    """Notes, for each read of the screen, whether it read the nodes' history; once the test
    sets `gate`, a read of the history waits for it to open."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.history_reads: list[bool] = []
        self.gate: asyncio.Event | None = None

    async def load(
        self,
        window_text: str = DEFAULT_WINDOW,
        pool: str | None = None,
        histories: Mapping[str, History | str] | None = None,
        now: float | None = None,
    ) -> PoolView:
        self.history_reads.append(histories is None)
        if histories is None and self.gate is not None:
            await self.gate.wait()
        return await super().load(window_text, pool, histories, now)


def test_an_apply_that_changed_something_reads_the_history_again(sim: Launched, tmp_path: Path) -> None:
    """After an apply that changed something, the nodes' history is read again in the background
    (as r reads it), so the window's figures follow the new layout; the apply's result stays."""
    path = own_copy(sim, tmp_path)
    source, ownership = fleet_source(path, "1s", "simulated silos fleet (pool test)")
    pool = CountingPoolSource(path)
    app = GpuopsApp(Feed(source, ownership, period=1.0), pool=pool)

    async def script(pilot: Pilot[None]) -> None:
        screen = await open_pool(pilot)
        assert pool.history_reads == [True]
        screen.query_one("#pool-gpus", LiveTable).move_to_key("sim-robotics-01:3")
        await pilot.press("m")
        await settled(pilot, screen)
        before, jobs = screen.view, screen.jobs
        assert before is not None
        pool.gate = asyncio.Event()
        await pilot.press("a")
        await pilot.pause()
        await pilot.press("y")
        deadline = time.monotonic() + 90
        while not screen.job.startswith("reading"):  # the apply, then the history read again
            assert time.monotonic() < deadline and not screen.error, (screen.job, screen.error)
            await pilot.pause(0.05)
        assert screen.applied is not None and screen.jobs == jobs + 1
        assert "⟳ reading…" in status(app)
        assert "the window's figures follow once the nodes' history is read again" in review_text(app)
        pool.gate.set()
        await settled(pilot, screen)
        # opened; the apply's new layout (the same history); the history read again
        assert pool.history_reads == [True, False, True] and screen.jobs == jobs + 2
        after = screen.view
        assert after is not None and after.histories is not before.histories
        assert after.read_at > before.read_at
        assert rows(app, "#pool-gpus")["sim-robotics-01:3"][4] == "pool shared"
        assert screen.applied is not None and "node sim-robotics-01: changed" in review_text(app)
        await pilot.press("q")

    run(app, script)


def test_an_apply_says_whether_it_changed_something(tmp_path: Path) -> None:
    review = cast(Review, None)
    nothing = Applied(review, None, (NodeResult("a"), NodeResult("b", status="failed", error="gone")))
    assert not nothing.changed
    assert Applied(review, tmp_path / "fleet.yaml.bak", ()).changed
    assert Applied(review, None, (NodeResult("a"), NodeResult("b", status="changed", done=["x"]))).changed
    assert Applied(review, None, (NodeResult("a", status="partial", done=["x"], refused=["y"]),)).changed


def test_readonly_refuses_moving_and_applying(sim: Launched, tmp_path: Path) -> None:
    """Also: a node that cannot be reached is one line, the rest is shown; `:pool FILTER`."""
    path = own_copy(sim, tmp_path)
    gone = "  - {name: sim-gone-01, host: 127.0.0.1, port: 1, owner: robotics}\n"
    path.write_text(path.read_text().replace("\nnodes:\n", "\nnodes:\n" + gone, 1))
    original = path.read_bytes()
    app = pool_app(path, readonly=True)

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("colon", *"pool robotics", "enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, PoolScreen)
        await settled(pilot, screen)
        head = text_of(screen.query_one("#pool-head", Static))
        assert "READONLY: moving GPUs and applying are disabled" in head
        assert "from 8 of 9 nodes" in head
        gone_lines = [line for line in head.splitlines() if "sim-gone-01" in line]
        assert len(gone_lines) == 1 and gone_lines[0].startswith("✖ sim-gone-01: ")
        assert sorted(rows(app, "#pool-gpus")) == [f"sim-robotics-01:{i}" for i in range(8)]  # the filter
        screen.query_one("#pool-gpus", LiveTable).move_to_key("sim-robotics-01:0")
        await pilot.press("space", "m")
        await pilot.pause()
        assert "read-only: move into pool is disabled" in status(app)
        assert screen.review is None and not screen.job
        await pilot.press("b")
        await pilot.pause()
        assert "read-only: move back to silo is disabled" in status(app)
        # the planner's proposal and its plan can be looked at, not applied
        await pilot.press("p")
        await settled(pilot, screen)
        assert screen.review is not None and "The planner's proposal for pool shared" in review_text(app)
        assert "node sim-gone-01: cannot plan" in review_text(app)
        assert "READONLY: applying is disabled" in review_text(app)
        await pilot.press("a")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert "read-only: apply pool change is disabled" in status(app)
        # another window: the history read again, the change under review dropped
        await pilot.press("w")
        await settled(pilot, screen)
        assert "evidence: 7d (hour buckets) from 8 of 9 nodes" in text_of(
            screen.query_one("#pool-head", Static)
        )
        assert screen.review is None and len(rows(app, "#pool-gpus")) == 8
        await pilot.press("q")

    run(app, script)
    assert path.read_bytes() == original and not list(tmp_path.glob("fleet.yaml.bak-*"))


def test_the_status_line_at_80_columns(sim: Launched, tmp_path: Path) -> None:
    """At 80x24 the evidence line keeps to one line (its keys short); the status line keeps the
    marks, the change under review or the step under way, and their keys (the fleet
    figures give way); the review panel has room."""
    path = own_copy(sim, tmp_path)
    app = pool_app(path)

    def line() -> str:
        text = status(app).rstrip("\n")
        assert len(text) <= 80 and text.rstrip().endswith("? help  q quit"), text
        return text

    async def script(pilot: Pilot[None]) -> None:
        screen = await open_pool(pilot)
        assert "space mark · p propose" in line()
        await settled(pilot, screen)
        head = text_of(screen.query_one("#pool-head", Static)).splitlines()
        evidence = next(h for h in head if h.startswith("evidence:"))
        assert len(evidence.rstrip()) <= 78 and evidence.rstrip().endswith("w · r"), head  # keys kept short
        screen.query_one("#pool-gpus", LiveTable).move_to_key("sim-robotics-01:4")
        await pilot.press("space", "space")
        assert "● 2 marked · m in · b back" in line()
        deadline = time.monotonic() + 20  # the live feed's first samples of all 8 nodes
        while "●8 " not in line() and time.monotonic() < deadline:
            await pilot.pause(0.2)
        assert " live " not in line() and "●8 " in line()  # the fleet figures in their short form
        await pilot.press("m")
        await settled(pilot, screen)
        assert "change: 2 in · a apply · c drop" in line()
        panel = screen.query_one("#pool-review")
        assert panel.region.height >= 6, panel.region  # the plan has room at 24 lines
        await pilot.press("space")  # marks and a change under review together
        assert "● 1 marked · m in · b back │ change: 2 in · a apply · c drop" in line()
        await pilot.press("c")
        await pilot.pause()
        assert "dropped the change under review" in line()  # the answer to a key stays too
        await pilot.press("p")
        await settled(pilot, screen)
        deadline = time.monotonic() + 6  # until the answer to c has gone (4 s)
        while screen.message and time.monotonic() < deadline:
            await pilot.pause(0.2)
        assert re.search(r"│ proposal: \d+ in · a apply · c drop ", line()), line()
        await pilot.press("c", "q")

    run(app, script, size=(80, 24))


class GatedPoolSource(PoolSource):
    """Applies only once the test opens the gate, so that keys can be pressed while it runs."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.gate = asyncio.Event()
        self.applying = asyncio.Event()

    async def apply(self, review: Review, now: float | None = None) -> Applied:
        self.applying.set()
        await self.gate.wait()
        return await super().apply(review, now)


def test_quitting_while_an_apply_runs_waits_for_its_result(sim: Launched, tmp_path: Path) -> None:
    """q (and :q) while the apply runs asks first; n stays; y quits only once the apply has
    ended, and its result (what it changed, refused or failed) is printed in the terminal."""
    path = own_copy(sim, tmp_path)
    source, ownership = fleet_source(path, "1s", "simulated silos fleet (pool test)")
    pool = GatedPoolSource(path)
    app = GpuopsApp(Feed(source, ownership, period=1.0), pool=pool)
    seen: dict[str, str] = {}

    async def script(pilot: Pilot[None]) -> None:
        screen = await open_pool(pilot)
        screen.query_one("#pool-gpus", LiveTable).move_to_key("sim-robotics-01:6")
        await pilot.press("space", "space", "m")
        await settled(pilot, screen)
        await pilot.press("a")
        await pilot.pause()
        await pilot.press("y")
        await asyncio.wait_for(pool.applying.wait(), 30)
        await pilot.pause()
        assert screen.job.startswith("applying")
        await pilot.press("q")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        seen["question"] = text_of(app.screen.query_one("#confirm-title", Static)) + text_of(
            app.screen.query_one("#confirm-body", Static)
        )
        await pilot.press("n")
        await pilot.pause()
        assert app.screen is screen and not app._exit and "not quitting" in status(app)
        # :q asks too; y: the app stays until the apply has ended
        await pilot.press("colon", "q", "enter")
        await pilot.pause()
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await pilot.pause(0.3)
        assert app.screen is screen and not app._exit
        assert "quitting when the apply has ended" in status(app)
        await pilot.press("ctrl+c")  # once more: still waits
        await pilot.pause(0.3)
        assert not app._exit and "cannot be cut off" in status(app)
        pool.gate.set()
        deadline = time.monotonic() + 60
        while not app._exit:
            assert time.monotonic() < deadline, "the app did not quit after the apply"
            await pilot.pause(0.1)
        assert screen.applied is not None and screen.applied.ok

    run(app, script)
    assert "An apply is running" in seen["question"] and "y: quit as soon as it has ended" in seen["question"]
    summary = app.apply_summary
    assert summary is not None
    console = Console(width=200, record=True, color_system=None)
    console.print(summary)
    text = console.export_text()
    assert "the apply to pool shared has ended" in text
    assert "node sim-robotics-01: changed" in text and "GPU 6: limiter tenant lines written" in text
    assert "Apply: 1 node(s) changed" in text
    assert load_fleet(path).pool_of("sim-robotics-01", 6) == "shared"


def test_help_lists_the_pool_keys_and_a_local_view_has_no_pool() -> None:
    from gpuops.simfleet.source import SimSource

    source = SimSource.scenario("silos", 3, label="in-process")
    source.sample()
    app = GpuopsApp(Feed(source, source.ownership(), period=3600))

    async def script(pilot: Pilot[None]) -> None:
        await pilot.press("colon", *"pool", "enter")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, PoolScreen)
        assert "needs a fleet.yaml" in text_of(screen.query_one("#pool-head", Static))
        await pilot.press("m")
        await pilot.pause()
        assert "needs a fleet.yaml" in status(app)
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        text = text_of(app.screen.query_one("#help-text", Static))
        bound = {b.key for b in screen.BINDINGS} | {b.key for b in GpuopsApp.BINDINGS}  # type: ignore[union-attr]
        labels = {k.keys: k.label for k in (*screen.help_keys(), *GLOBAL_KEYS)}
        for key in bound:
            assert key in labels and labels[key] in text, key
        for word in (":pool", "move the marked GPUs", "ask the planner", "apply the change"):
            assert word in text
        await pilot.press("escape", "q")

    run(app, script, timeout=60)


# ---- the steps under the screen, on a small fleet.yaml -----------------------------------------------

FLEET = """\
# our fleet: keep this comment
version: 1
teams:
  vision: {users: [alice]}
  robotics: {users: [judy]}
nodes:
  - {name: gpu-a-01, host: 10.0.0.1, owner: robotics}   # the idle one
  - {name: gpu-b-01, host: 10.0.0.2, owner: vision}
  - {name: gpu-b-02, host: 10.0.0.3, owner: vision}
carve:
  - select: {nodes: gpu-b-01}
    limiter: {tenants: {vision: {compute: 100%}}}
"""
A100 = "NVIDIA A100-SXM4-80GB"
MIB = 1 << 20


def evidence(busy: dict[tuple[str, int], float], fleet_text_: str = FLEET) -> Evidence:
    """Each GPU busy at a steady rate, all of it its owner's work."""
    fleet = parse_fleet(fleet_text_)
    use = {key: {owner: value} if (owner := fleet.gpu_owner(*key)) else {} for key, value in busy.items()}
    return steady_evidence(fleet, use, A100)


def view_of(text: str, busy: dict[tuple[str, int], float], tmp_path: Path, pool: str = "shared") -> PoolView:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    fleet = load_fleet(path)
    ev = evidence(busy, text)
    return PoolView(
        file=path,
        data=path.read_bytes(),
        fleet=fleet,
        pool=pool,
        window=ev.window,
        read_at=NOW,
        histories={},
        evidence=ev,
        lives={},
        teams=team_sides(ev, fleet, pool),
        gpus=pool_gpus(ev),
        missing={},
    )


BUSY = {
    **{("gpu-a-01", i): 0.0 for i in range(4)},
    **{("gpu-b-01", i): 0.97 for i in range(2)},
    **{("gpu-b-02", i): 0.97 for i in range(2)},
}


def test_moves_by_hand_keep_the_file_and_grant_the_saturated_team(tmp_path: Path) -> None:
    view = view_of(FLEET, BUSY, tmp_path)
    draft = draft_moves(view, None, join=[("gpu-a-01", 1), ("gpu-a-01", 0)])
    assert draft.joined == (("gpu-a-01", 0), ("gpu-a-01", 1)) and draft.left == () and draft.changed
    pool = draft.data["pools"]["shared"]
    assert pool["gpus"] == [{"nodes": "gpu-a-01", "gpus": "0-1"}]
    assert pool["guarantees"] == {"vision": {"share": "100%"}}  # saturated: granted the 2 GPUs
    # the planner moved nothing of its own (GPUs 2, 3 are idle too), and says what was done
    assert [(m.index, m.by_hand) for m in draft.proposal.moves] == [(0, True), (1, True)]
    assert not draft.proposal.automatic
    assert "no other moves (none asked for): pool shared has 2 GPUs" in draft.explanation
    assert not any(line.startswith("no GPU to move") for line in draft.explanation)
    robotics = {t.team: t for t in draft.teams}["robotics"]
    assert (robotics.silo_gpus, robotics.pool_gpus, robotics.silo_idle) == (2, 2, 2.0)
    assert draft.explanation[0].startswith("gpu-a-01:0 (robotics's silo) joins pool shared, moved by hand")
    text, preserved = fleet_text(view, draft)
    assert preserved and text.startswith("# our fleet: keep this comment\n") and "# the idle one" in text
    assert "limiter: {tenants: {vision: {compute: 100%}}}" in text  # other entries as written
    again = parse_fleet(text, base_dir=tmp_path)
    assert [again.pool_of("gpu-a-01", i) for i in range(4)] == ["shared", "shared", None, None]
    assert again.desired_for("gpu-a-01", 0).limiter is not None

    # on top of it: one more in, one back out (the draft builds on the draft)
    second = draft_moves(view, draft, join=[("gpu-a-01", 3)], leave=[("gpu-a-01", 0)])
    assert second.joined == (("gpu-a-01", 1), ("gpu-a-01", 3)) and second.left == ()
    assert (
        second.explanation[0] == "on top of the change under review: gpu-a-01:0, gpu-a-01:1 into pool shared"
    )
    assert second.data["pools"]["shared"]["gpus"] == [
        {"nodes": "gpu-a-01", "gpus": "1"},
        {"nodes": "gpu-a-01", "gpus": "3"},
    ]
    # GPU 0 never had the pool's limiter lines (not on disk, not live): no entry to clear them
    assert not any(e.get("limiter", {}).get("enabled") is False for e in second.data["carve"])


def test_the_pool_screens_planner_says_what_the_driver_takes_as_the_nodes_observed(tmp_path: Path) -> None:
    """Issue 37: a change drafted on the Pool screen lays caps on what the driver leaves of each
    card, from what the nodes observed (their live state), and its explanation says how much of the
    GPUs goes to the driver."""
    observed = DriverMemory(600 * MIB, 512 * MIB, "13.0")

    def live(node: str, count: int) -> NodeLive:
        gpus = tuple(
            Gpu(info=GpuInfo(i, f"GPU-{node}-{i}", A100, "", 0, 80 << 30, True, driver_memory=observed))
            for i in range(count)
        )
        return NodeLive(node, sample=NodeSample(node, NOW, gpus))

    view = dataclasses.replace(
        view_of(FLEET, BUSY, tmp_path),
        lives={"gpu-a-01": live("gpu-a-01", 4), "gpu-b-01": live("gpu-b-01", 2)},
    )
    assert view.driver_memory[("gpu-a-01", 3)] == observed
    draft = draft_moves(view, None, join=[("gpu-a-01", 0)])
    (line,) = [x for x in draft.explanation if x.startswith("driver overhead on gpu-a-01:0")]
    assert "512MiB of each card reserved by the driver (observed)" in line, line
    assert "each process's CUDA context, 600MiB (observed under CUDA 13.0), counts inside" in line, line


def test_taking_gpus_out_expands_a_selection_and_clears_their_lines(tmp_path: Path) -> None:
    pooled = FLEET.replace(
        "carve:\n",
        "pools:\n  shared:\n    gpus: [{nodes: 'gpu-a-*'}]\n    guarantees: {vision: 50%}\ncarve:\n",
    )
    pooled += (
        "  - select: {nodes: gpu-a-01}\n    pool: shared\n"
        "    limiter: {policy: burst-share, tenants: {vision: {compute: 50%}}}\n"
    )
    view = view_of(pooled, BUSY, tmp_path)
    assert view.members == 4
    draft = draft_moves(view, None, leave=[("gpu-a-01", 2)])
    assert draft.left == (("gpu-a-01", 2),)
    assert draft.data["pools"]["shared"]["gpus"] == [{"nodes": "gpu-a-01", "gpus": "0-1,3"}]
    # the entry that clears its lines is the pool's, and first: the owner's own entries win over it
    reset = {"select": {"nodes": "gpu-a-01", "gpus": "2"}, "pool": "shared", "limiter": {"enabled": False}}
    assert draft.data["carve"][0] == reset
    assert (
        "gpu-a-01:2 leaves pool shared for robotics's silo, moved by hand; "
        "the pool's limiter lines are removed" in draft.explanation
    )
    assert not draft.proposal.moves and draft.proposal.returns[0].cleared
    fleet = draft.fleet
    assert fleet.pool_of("gpu-a-01", 2) is None
    desired = fleet.desired_for("gpu-a-01", 2)
    assert desired.limiter is not None and not desired.limiter.enabled
    assert fleet.desired_for("gpu-a-01", 3).limiter is not None  # the others keep the pool's lines
    text, preserved = fleet_text(view, draft)
    assert preserved and "# our fleet: keep this comment" in text

    # A selection that also selects a node whose GPUs nobody knows cannot be expanded.
    more = pooled.replace(
        "  - {name: gpu-b-01", "  - {name: gpu-a-02, host: 10.0.0.9, owner: robotics}\n  - {name: gpu-b-01"
    )
    view2 = view_of(more, BUSY, tmp_path)
    with pytest.raises(PoolError, match="also selects gpu-a-02, whose GPUs are not known"):
        draft_moves(view2, None, leave=[("gpu-a-01", 2)])
    # ... unless its GPUs are known (from the live inventories)
    known = [GpuRef("gpu-a-02", i, f"GPU-gpu-a-02-{i}", A100) for i in range(2)]
    selects = without(
        view2.fleet,
        "shared",
        [{"nodes": "gpu-a-*"}],
        {("gpu-a-01", 2)},
        [GpuRef(g.node, g.index, g.uuid, g.name) for g in view2.gpus] + known,
    )
    assert selects == [{"nodes": "gpu-a-01", "gpus": "0-1,3"}, {"nodes": "gpu-a-02", "gpus": "0-1"}]


def test_a_member_selection_that_needs_quotes_keeps_the_file(tmp_path: Path) -> None:
    """`?pu-a-01` (a node glob) written bare inside `{...}` is not YAML: the edit quotes it, so
    the file keeps its comments instead of being written anew."""
    pooled = FLEET.replace(
        "carve:\n", "pools:\n  shared:\n    gpus: [{nodes: '?pu-a-01', gpus: '0'}]\ncarve:\n"
    )
    view = view_of(pooled, BUSY, tmp_path)
    draft = draft_moves(view, None, join=[("gpu-a-01", 1)])
    assert {"nodes": "?pu-a-01", "gpus": "0"} in draft.data["pools"]["shared"]["gpus"]
    text, preserved = fleet_text(view, draft)
    assert preserved and "# our fleet: keep this comment" in text and "'?pu-a-01'" in text
    again = parse_fleet(text, base_dir=tmp_path)
    assert [again.pool_of("gpu-a-01", i) for i in range(4)] == ["shared", "shared", None, None]


def test_wrong_moves_are_one_line_errors(tmp_path: Path) -> None:
    view = view_of(FLEET, BUSY, tmp_path)
    with pytest.raises(PoolError, match="not in pool shared"):
        draft_moves(view, None, leave=[("gpu-a-01", 0)])
    draft = draft_moves(view, None, join=[("gpu-a-01", 0)])
    with pytest.raises(PoolError, match="gpu-a-01:0 is in pool shared already"):
        draft_moves(view, draft, join=[("gpu-a-01", 0)])
    with pytest.raises(PoolError, match="mark GPUs"):
        draft_moves(view, None)


def test_the_planner_moves_idle_gpus(tmp_path: Path) -> None:
    view = view_of(FLEET, BUSY, tmp_path)
    draft = draft_planner(view)
    assert draft.kind == "planner" and len(draft.joined) == 4 and draft.changed
    assert draft.explanation[0].startswith("gpu-a-01:0 (robotics's silo) joins the pool")


def test_write_fleet_keeps_a_backup_and_refuses_a_changed_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(FLEET)
    path.chmod(0o640)
    read = path.read_bytes()
    backup = write_fleet(path, read, FLEET + "# new\n", NOW)
    assert backup.name == "fleet.yaml.bak-20260302-140000" and backup.read_bytes() == read
    assert path.read_text().endswith("# new\n") and (path.stat().st_mode & 0o777) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fleet.yaml", backup.name]  # no temporary left
    second = write_fleet(path, path.read_bytes(), FLEET, NOW)
    assert second.name == "fleet.yaml.bak-20260302-140000-2"
    with pytest.raises(PoolError, match="changed since it was read: nothing written or applied"):
        write_fleet(path, read + b"x", FLEET, NOW)


def test_the_gpu_list_fits_80_columns(sim: Launched, tmp_path: Path) -> None:
    """At 80 columns the GPU list leaves out what its team table or the GPU's own screen shows
    (model, mean busy, owner) instead of scrolling sideways; a wide terminal shows every column."""
    path = own_copy(sim, tmp_path)
    widths: dict[int, tuple[int, int, tuple[str, ...]]] = {}

    for size in ((80, 24), (200, 50)):
        app = pool_app(path)

        async def script(pilot: Pilot[None], size: tuple[int, int] = size) -> None:
            screen = await open_pool(pilot)
            await settled(pilot, screen)
            await pilot.pause()
            table = screen.query_one("#pool-gpus", LiveTable)
            labels = tuple(c.label for c in table.columns)
            widths[size[0]] = (table.virtual_size.width, table.size.width, labels)
            await pilot.press("q")

        run(app, script, size=size)
    narrow, room, labels = widths[80]
    assert narrow <= room, widths  # no sideways scroll
    assert {"GPU", "In", "p95", "Now", "Used by", "Live carving"} <= set(labels), labels
    assert not {"Model", "Owner", "Mean busy"} & set(labels), labels
    wide, room, labels = widths[200]
    assert "Model" in labels and "Mean busy" in labels and wide <= room, widths


def test_a_move_under_review_keeps_the_wide_gpu_list(sim: Launched, tmp_path: Path) -> None:
    """A terminal a little wider than the GPU list: a GPU under review ("silo → pool shared", 14
    cells more) must not switch the list to its narrow columns; the free text at the end (who used
    it, the carving) gives up the room first. Before, the list lost Model, Owner and Mean busy as
    soon as a move widened it past the screen, and its columns jumped under the operator's eyes
    (a CI run at 160 columns read "0%" where it expected the In column)."""
    path = own_copy(sim, tmp_path)
    app = pool_app(path)
    seen: dict[str, object] = {}

    async def script(pilot: Pilot[None]) -> None:
        screen = await open_pool(pilot)
        table = screen.query_one("#pool-gpus", LiveTable)
        full = tuple(c.label for c in table.columns)
        await pilot.resize_terminal(table.virtual_size.width + 10, 50)
        await pilot.pause()
        await pilot.pause()
        before = tuple(c.label for c in table.columns)
        table.move_to_key("sim-robotics-01:0")
        await pilot.press("m")
        await settled(pilot, screen)
        seen.update(
            full=full,
            before=before,
            after=tuple(c.label for c in table.columns),
            widths=(table.virtual_size.width, table.size.width),
            where=rows(app, "#pool-gpus")["sim-robotics-01:0"],
        )
        await pilot.press("q")

    run(app, script, size=(200, 50))
    assert seen["full"] == seen["before"] == seen["after"] and "Model" in seen["after"], seen  # type: ignore[operator]
    wide, room = seen["widths"]  # type: ignore[misc]
    assert wide <= room, seen
    assert seen["where"][4] == "silo → pool shared", seen  # type: ignore[index]
