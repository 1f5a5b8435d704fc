"""The gpuops TUI application: six views (Textual modes) over one data feed, k9s keys.

The feed runs as a worker on Textual's event loop and hands each new FleetState to the screen in
front only; a screen brought back to the front draws the latest state once. Screens never
collect, compute tenants or talk to nodes: they draw what `gpuops.views` computed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual.actions import SkipAction
from textual.app import App
from textual.binding import BindingType
from textual.screen import Screen

from gpuops.tui.changes import POOL_CHANGES
from gpuops.tui.keys import GLOBAL_KEYS, bindings
from gpuops.tui.screens.base import ViewScreen
from gpuops.tui.screens.confirm import ConfirmScreen
from gpuops.tui.screens.detail import DetailScreen
from gpuops.tui.screens.events import EventsScreen
from gpuops.tui.screens.fleet import FleetScreen
from gpuops.tui.screens.help import HelpScreen
from gpuops.tui.screens.nodes import NodesScreen
from gpuops.tui.screens.processes import ProcessesScreen
from gpuops.tui.screens.tenants import TenantsScreen
from gpuops.views.feed import Feed, FleetState
from gpuops.views.filter import FilterError, parse_filter

if TYPE_CHECKING:
    from gpuops.views.pool import PoolSource

VIEW_ALIASES = {
    "gpus": "gpus",
    "gpu": "gpus",
    "fleet": "gpus",
    "grid": "gpus",
    "nodes": "nodes",
    "node": "nodes",
    "no": "nodes",
    "tenants": "tenants",
    "tenant": "tenants",
    "teams": "tenants",
    "team": "tenants",
    "events": "events",
    "event": "events",
    "ev": "events",
    "pool": "pool",
    "pools": "pool",
    "processes": "processes",
    "process": "processes",
    "procs": "processes",
    "ps": "processes",
}
QUIT = {"q", "quit", "q!", "exit"}
NOT_YET: dict[str, str] = {}  # commands of views still to come: name -> what to say


def _complete(name: str) -> str:
    """A command from a unique prefix ('ten' -> 'tenants'), as k9s accepts."""
    known = set(VIEW_ALIASES) | QUIT | set(NOT_YET) | {"help"}
    if name in known:
        return name
    matches = {VIEW_ALIASES.get(k, k) for k in known if k.startswith(name)}
    return matches.pop() if len(matches) == 1 else name


GC_FREEZE_AT = (1, 10)


def _tune_gc() -> None:
    """Keep the garbage collector's pauses out of the refresh: what exists once the screens are
    up (Textual's DOM, the nodes, the caches) lives as long as the app, so it is moved out of the
    collector's scans (gc.freeze), and young collections run less often. Per update most objects
    die by reference counting anyway. Halves the slow updates at 1000 GPUs (docs/benchmarks.md)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)


# Actions that change the fleet (apply a plan, move GPUs, kill a process); each one added must be
# listed here: --readonly disables them, and they ask for confirmation. The Pool screen's: move
# GPUs into the pool or back (m, b), apply the reviewed change (a, after a y/n question).
DESTRUCTIVE_ACTIONS: frozenset[str] = frozenset(POOL_CHANGES)


def _pool_screen() -> Screen[None]:
    """The Pool screen, imported when first opened: it needs the spec (pydantic, ruamel) and the
    planner, which the other screens do not."""
    from gpuops.tui.screens.pool import PoolScreen

    return PoolScreen()


class GpuopsApp(App[None]):
    CSS = """
    #bottom-bars { dock: bottom; height: auto; }
    #tenants-table { height: auto; max-height: 70%; }
    #tenant-panel { height: auto; max-height: 12; border-top: solid $panel; padding: 0 1; }
    #events-empty { height: auto; padding: 1 2; color: $text-muted; }
    #detail { height: 1fr; }
    #detail > LiveTable { height: auto; max-height: 20; }
    #node-header, #gpu-panel, #proc-title { height: auto; padding: 0 1; }
    #gpu-panel { border-top: solid $panel; border-bottom: solid $panel; }
    """

    BINDINGS: ClassVar[list[BindingType]] = cast(list[BindingType], bindings(GLOBAL_KEYS))
    MODES: ClassVar[dict[str, str | Callable[[], Screen[None]]]] = {
        "gpus": FleetScreen,
        "nodes": NodesScreen,
        "tenants": TenantsScreen,
        "events": EventsScreen,
        "pool": _pool_screen,
        "processes": ProcessesScreen,
    }
    ENABLE_COMMAND_PALETTE = False
    TITLE = "gpuops"

    def __init__(
        self,
        feed: Feed,
        *,
        readonly: bool = False,
        start: str = "gpus",
        destructive: frozenset[str] = DESTRUCTIVE_ACTIONS,
        handle_signals: bool = False,
        tune_gc: bool = False,
        pool: PoolSource | None = None,
    ) -> None:
        super().__init__()
        self.feed = feed
        self.readonly = readonly
        self.start_view = start
        self.destructive = destructive
        self.handle_signals = handle_signals
        self.tune_gc = tune_gc
        self.pool_source = pool  # fleet.yaml for the Pool screen; None: this host, no pools
        self.fleet_state: FleetState | None = None
        self.history: list[str] = []
        self.published = 0
        # The Pool screen's apply: whether one runs, whether quitting waits for it, and its last
        # result in words (printed in the terminal when the app quits after it).
        self.applying = False
        self.quit_after_apply = False
        self.apply_summary: Text | None = None

    # ---- what screens read ------------------------------------------------------------------------

    @property
    def clock(self) -> Callable[[], float]:
        return self.feed.clock

    @property
    def interval(self) -> float:
        return self.feed.source.interval

    @property
    def source_label(self) -> str:
        return self.feed.source.label

    # ---- life --------------------------------------------------------------------------------------

    def on_mount(self) -> None:
        if self.handle_signals:
            # SIGTERM (kill) and SIGHUP (terminal closed) quit like q: the terminal is restored and
            # whoever started us (gpuops demo) gets to stop what it started.
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGHUP):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self.exit)
        self.feed.source.start()
        self.switch_mode(self.start_view)
        self.run_worker(self.feed.run(self.publish), name="feed", group="feed", exclusive=True)
        self.set_interval(1.0, self._tick)

    async def on_unmount(self) -> None:
        await self.feed.source.stop()

    def publish(self, state: FleetState) -> None:
        """A new state: only the view in front draws it."""
        self.fleet_state = state
        self.published += 1
        view = self.front_view()
        if view is not None:
            view.show(state)
        if self.tune_gc and self.published in GC_FREEZE_AT:
            _tune_gc()

    def front_view(self) -> ViewScreen | None:
        """The view screen in front (under a help overlay, the one it covers)."""
        for screen in reversed(self.screen_stack):
            if isinstance(screen, ViewScreen):
                return screen
            if not isinstance(screen, HelpScreen):
                return None
        return None

    def _tick(self) -> None:
        view = self.front_view()
        if view is not None:
            view.draw_status()

    # ---- navigation --------------------------------------------------------------------------------

    def go(self, view: str, filter_text: str | None = None) -> None:
        """Bring a view to the front (its detail screens closed), optionally with a filter."""
        if self.current_mode != view:
            self.history.append(self.current_mode)
            del self.history[:-20]
            self.switch_mode(view)
        screen = self.screen
        if isinstance(screen, ViewScreen) and filter_text is not None:
            try:
                screen.set_filter(parse_filter(filter_text))
            except FilterError as exc:
                screen.flash(f"filter {filter_text!r}: {exc}")

    def open_detail(self, node: str, gpu: int | None) -> None:
        detail = DetailScreen(node, gpu, self.current_mode)
        self.push_screen(detail)

    def run_command(self, text: str) -> str | None:
        """Run a ':' command; returns an error message, or None when done."""
        words = text.strip().lstrip(":").split(None, 1)
        if not words:
            return None
        name, arg = _complete(words[0].lower()), (words[1] if len(words) > 1 else None)
        if name in QUIT:
            self._close_prompt()
            self.request_quit()
            return None
        if name in NOT_YET:
            self._front_flash(NOT_YET[name])
            return None
        if name in ("help", "h", "?"):
            self._close_prompt()
            self.action_help()
            return None
        view = VIEW_ALIASES.get(name)
        if view is None:
            return f"unknown command {name!r}: try gpus, nodes, tenants, processes, events, pool or q"
        self._close_prompt()
        while len(self.screen_stack) > 1 and not isinstance(self.screen, HelpScreen):
            self.pop_screen()
        self.go(view, arg)
        if isinstance(self.screen, ProcessesScreen):
            self.screen.scope(None)  # the command shows every team's; Enter on :tenants scopes
        return None

    def team_processes(self, team: str) -> None:
        """The drill-down from a `:tenants` row: that team's processes across the fleet."""
        self.go("processes")
        screen = self.screen
        if isinstance(screen, ProcessesScreen):
            screen.set_filter(None)
            screen.scope(team)

    def _close_prompt(self) -> None:
        view = self.front_view()
        if view is not None and view.prompt.is_open:
            view.close_prompt(cancel=False)

    def _front_flash(self, message: str) -> None:
        view = self.front_view()
        if view is not None:
            view.flash(message)

    # ---- global keys -------------------------------------------------------------------------------

    def action_help(self) -> None:
        view = self.front_view()
        if view is None or isinstance(self.screen, HelpScreen):
            return
        name = view.title_text
        self.push_screen(HelpScreen(name, view.help_keys(), self.readonly, view.COLUMN_HELP))

    # ':' and '/' are priority keys, so that what is typed right after them (a fast typist, a
    # terminal delivering several keys at once) lands in the bar; inside the bar they are text.
    def action_command(self) -> None:
        self._open_prompt(":")

    def action_filter(self) -> None:
        self._open_prompt("/")

    def _open_prompt(self, mode: str) -> None:
        view = self.front_view()
        if view is None or self.screen is not view or view.prompt.is_open:
            raise SkipAction()
        view.open_prompt(mode)

    async def action_back(self) -> None:
        """esc: leave the bar, else clear the filter, else close the detail, else the previous view."""
        screen = self.screen
        if isinstance(screen, HelpScreen):
            screen.dismiss()
            return
        if isinstance(screen, ViewScreen):
            if screen.prompt.is_open:
                screen.close_prompt(cancel=True)
                return
            if screen.filter is not None:
                screen.set_filter(None)
                return
        if len(self.screen_stack) > 1:
            self.pop_screen()
            return
        if self.history:
            self.switch_mode(self.history.pop())

    async def action_quit(self) -> None:
        self.request_quit()

    # ---- quitting while the Pool screen applies a change --------------------------------------------

    def request_quit(self) -> None:
        """q, :q, ctrl-c. Quitting while an apply runs would cut it off between nodes and lose
        what it changed, refused or failed; so ask, and quit only once it has ended, with its
        result printed in the terminal after the screen closes."""
        if not self.applying:
            self.exit()
            return
        if self.quit_after_apply:
            self._front_flash("quitting when the apply has ended; it cannot be cut off from here")
            return
        if isinstance(self.screen, ConfirmScreen):
            return  # the question is open already (ctrl-c reaches the app through it)
        body = Text(
            "Quitting now would cut the apply off between nodes, and its result (what it changed, "
            "refused or failed) would be lost.\n\n"
            "y: quit as soon as it has ended; its result is printed in the terminal.\n"
            "n, esc or q: stay; the result shows in the Pool screen."
        )

        def answered(yes: bool | None) -> None:
            if not yes:
                self._front_flash("not quitting; the apply goes on")
            elif self.applying:
                self.quit_after_apply = True
                self._front_flash("quitting when the apply has ended (its result is printed)")
            else:  # it ended while the question was open
                self.exit(message=self.apply_summary)

        self.push_screen(
            ConfirmScreen("An apply is running: quit when it has ended?", body, "y: quit after it"),
            answered,
        )

    def apply_started(self) -> None:
        self.applying = True
        self.apply_summary = None

    def apply_ended(self, summary: Text) -> None:
        """The Pool screen's apply has ended (done, refused or failed): quit now if asked to."""
        self.applying = False
        self.apply_summary = summary
        if self.quit_after_apply:
            self.quit_after_apply = False
            self.exit(message=summary)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        return not (self.readonly and action in self.destructive)

    def allowed(self, action: str) -> bool:
        """Whether an action that changes the fleet may run; says why not in the status line."""
        if self.readonly and action in self.destructive:
            self._front_flash(f"read-only: {action.replace('_', ' ')} is disabled (started with --readonly)")
            return False
        return True
