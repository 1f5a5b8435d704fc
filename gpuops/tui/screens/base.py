"""What every view screen shares: title bar, status line, the ':' and '/' bar, sorting, filtering,
and being told about new data only while it is the screen in front."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import BindingType
from textual.containers import Vertical
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Input

from gpuops.tui.keys import Key, bindings, sort_keys
from gpuops.tui.widgets import PromptBar, StatusBar, TopBar
from gpuops.views.feed import FleetState
from gpuops.views.filter import Filter, FilterError, parse_filter

if TYPE_CHECKING:
    from gpuops.tui.app import GpuopsApp


class ViewScreen(Screen[None]):
    """A screen that draws FleetStates. Subclasses set the class variables and `draw`."""

    VIEW: ClassVar[str] = ""  # the view it belongs to (top bar)
    TITLE: ClassVar[str] = ""
    KEYS: ClassVar[tuple[Key, ...]] = ()  # its own keys (help lists them all)
    SORTS: ClassVar[dict[str, tuple[str, str]]] = {}  # shift-letter -> (sort, what it sorts by)
    DEFAULT_SORT: ClassVar[str] = ""
    FILTER_HINT: ClassVar[str] = ""  # what a filter matches, for the bar
    # What each column (or part of the screen) shows, for `?`: (column, meaning)
    COLUMN_HELP: ClassVar[tuple[tuple[str, str], ...]] = ()

    def __init__(self) -> None:
        super().__init__()
        self.state: FleetState | None = None
        self.shown_version = -1
        self.filter: Filter | None = None
        self.sort = self.DEFAULT_SORT
        self.reverse = False
        self.renders = 0  # states drawn (tests check that hidden screens draw nothing)
        self.message = ""
        self.view_name = self.VIEW

    # ---- structure -------------------------------------------------------------------------------

    @property
    def gapp(self) -> GpuopsApp:
        return cast("GpuopsApp", self.app)

    def compose(self) -> ComposeResult:
        yield TopBar()
        with Vertical(id="bottom-bars"):
            yield PromptBar()
            yield StatusBar()
        yield from self.compose_body()

    def compose_body(self) -> ComposeResult:
        yield from ()

    def main_widget(self) -> Widget | None:
        """The widget that has the focus when no bar is open."""
        return None

    @property
    def title_text(self) -> str:
        return self.TITLE

    @classmethod
    def help_keys(cls) -> tuple[Key, ...]:
        return cls.KEYS + sort_keys(cls.SORTS)

    # ---- data ------------------------------------------------------------------------------------

    def show(self, state: FleetState) -> None:
        """Draw a new state (the app calls this only while the screen is in front)."""
        self.state = state
        self.shown_version = state.version
        self.renders += 1
        self.draw(state)
        self.draw_bars()

    def redraw(self) -> None:
        if self.state is not None:
            self.show(self.state)
        else:
            self.draw_bars()

    def draw(self, state: FleetState) -> None:
        raise NotImplementedError

    def on_screen_resume(self) -> None:
        state = self.gapp.fleet_state
        if state is not None and state.version != self.shown_version:
            self.show(state)
        else:
            self.draw_bars()
        if not self.prompt.is_open:
            self.focus_main()

    def focus_main(self) -> None:
        widget = self.main_widget()
        if widget is not None:
            self.set_focus(widget)

    def draw_bars(self) -> None:
        if not self.is_mounted:
            return
        app = self.gapp
        self.query_one(TopBar).draw(self.view_name, self.title_text, app.source_label, app.readonly)
        self.draw_status()

    def draw_status(self) -> None:
        if not self.is_mounted:
            return
        app = self.gapp
        state = self.state
        age = None
        if state is not None and state.status.data_age is not None:
            age = state.status.data_age + max(0.0, app.clock() - state.time)
        self.query_one(StatusBar).draw(
            state.status if state is not None else None,
            age,
            app.interval,
            self.filter.text if self.filter is not None else "",
            self.sort_label(),
            app.readonly,
            self.message,
            self.status_part(),
        )

    def status_part(self) -> Text | None:
        """What this screen adds to the status line (kept before the fleet figures when narrow)."""
        return None

    # ---- sorting and filtering ---------------------------------------------------------------------

    def sort_label(self) -> str:
        if not self.sort:
            return ""
        return f"{self.sort}{' (reversed)' if self.reverse else ''}"

    def action_sort(self, name: str) -> None:
        if name == self.sort:
            self.reverse = not self.reverse
        else:
            self.sort, self.reverse = name, False
        self.redraw()

    def set_filter(self, flt: Filter | None) -> None:
        self.filter = flt
        self.redraw()

    # ---- the ':' / '/' bar ---------------------------------------------------------------------

    @property
    def prompt(self) -> PromptBar:
        return self.query_one(PromptBar)

    def open_prompt(self, mode: str) -> None:
        value = self.filter.text if mode == "/" and self.filter is not None else ""
        self.prompt.open(mode, value)
        if mode == "/":
            self.prompt.hint(
                self.FILTER_HINT or "regular expression; !re hides matches; Enter keeps, esc clears"
            )
        else:
            self.prompt.hint("gpus nodes tenants processes events pool q   (Tab completes)")

    def close_prompt(self, cancel: bool) -> None:
        mode = self.prompt.mode
        self.prompt.close()
        if cancel and mode == "/":
            self.set_filter(None)
        self.focus_main()

    @on(Input.Changed, "#prompt-input")
    def _prompt_changed(self, event: Input.Changed) -> None:
        if self.prompt.mode != "/":
            return
        try:
            flt = parse_filter(event.value)
        except FilterError as exc:
            self.prompt.hint(str(exc), error=True)
            return
        self.prompt.hint("Enter keeps the filter, esc clears it")
        self.set_filter(flt)

    @on(Input.Submitted, "#prompt-input")
    def _prompt_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        mode = self.prompt.mode
        if mode == "/":
            self.close_prompt(cancel=False)
            return
        error = self.gapp.run_command(event.value)
        if self.prompt.is_open:
            self.close_prompt(cancel=False)
        if error:
            # As a command's other answers: the bar closes (its text gone), the status line says why.
            self.flash(error)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        app = self.gapp
        return not (app.readonly and action in app.destructive)

    def flash(self, message: str) -> None:
        """A short message in the status line until the next key or refresh cycle."""
        self.message = message
        self.draw_status()
        self.set_timer(4.0, self._clear_message)

    def _clear_message(self) -> None:
        self.message = ""
        self.draw_status()


def screen_bindings(keys: tuple[Key, ...], sorts: dict[str, tuple[str, str]]) -> list[BindingType]:
    """A screen's BINDINGS, from the same lists its help prints."""
    return cast(list[BindingType], bindings(keys + sort_keys(sorts)))
