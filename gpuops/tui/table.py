"""A light table for live data: rows replaced wholesale every update, only the lines in view drawn.

Textual's DataTable re-renders every visible cell through Rich after any change, which at a
thousand GPUs costs more than the update itself; this one turns a visible row into segments
directly and caches nothing it would have to invalidate. Columns are sized to their content,
the header stays on top, the cursor stays on the same row key across updates.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.geometry import Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gpuops.tui import theme


class Styled(str):
    """A cell's text with one style, made a `Text` only when its line is drawn: a table of every
    node of a 10k-GPU fleet would otherwise make thousands of `Text`s per update for the few
    lines on screen. Its width is the `Text`'s (cell_len)."""

    style: str

    def __new__(cls, text: str, style: str = "") -> Styled:
        made = super().__new__(cls, text)
        made.style = style
        return made


Cell = str | Text
Row = tuple[str, tuple[Cell, ...]]

GAP = 2
HEADER = Style(bold=True, color=theme.HEADING)
CURSOR = Style(bgcolor=theme.CURSOR, bold=True)
CURSOR_BLURRED = Style(bgcolor=theme.CURSOR_BLURRED)
ZEBRA = Style(bgcolor=theme.ZEBRA)


@dataclass(frozen=True)
class Column:
    label: str
    key: str
    justify: str = "left"  # left | right
    max_width: int | None = None  # longer cells end in an ellipsis (a narrow terminal's table)


def _width(cell: str) -> int:
    return cell_len(cell) if isinstance(cell, Styled) else len(cell)


def column_widths(columns: Sequence[Column], rows: Sequence[Row]) -> list[int]:
    """Each column's width in cells, as `set_rows` sizes them: its widest cell or label, at most
    its max_width (never less than its label)."""
    widths = [len(c.label) for c in columns]
    for _, cells in rows:
        for i, cell in enumerate(cells[: len(widths)]):
            n = cell.cell_len if isinstance(cell, Text) else _width(cell)
            if n > widths[i]:
                widths[i] = n
    for i, column in enumerate(columns):
        if column.max_width is not None:
            widths[i] = min(widths[i], max(column.max_width, len(column.label)))
    return widths


def table_width(columns: Sequence[Column], rows: Sequence[Row]) -> int:
    """The cells a LiveTable of these columns and rows is wide (as `set_rows` sizes it)."""
    return sum(column_widths(columns, rows)) + GAP * len(columns) + 1


class LiveTable(ScrollView, can_focus=True):
    DEFAULT_CSS = """
    LiveTable { height: 1fr; overflow-x: auto; overflow-y: auto; }
    """

    BINDINGS = [
        Binding("up,k", "move(-1)", "row up", show=False),
        Binding("down,j", "move(1)", "row down", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home", "edge(-1)", "first row", show=False),
        Binding("end", "edge(1)", "last row", show=False),
        Binding("enter", "select", "open the row", show=False),
    ]

    class RowHighlighted(Message):
        def __init__(self, table: LiveTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> LiveTable:
            return self.table

    class RowSelected(Message):
        def __init__(self, table: LiveTable, key: str) -> None:
            super().__init__()
            self.table = table
            self.key = key

        @property
        def control(self) -> LiveTable:
            return self.table

    cursor_row: reactive[int] = reactive(0, repaint=False)

    def __init__(self, columns: Sequence[Column], *, id: str | None = None, zebra: bool = True) -> None:
        super().__init__(id=id)
        self.columns = tuple(columns)
        self.zebra = zebra
        self.rows: list[Row] = []
        self.widths = [len(c.label) for c in self.columns]
        self._index: dict[str, int] = {}
        self.draws = 0

    # ---- data ----------------------------------------------------------------------------------

    @property
    def row_count(self) -> int:
        return len(self.rows)

    @property
    def cursor_key(self) -> str | None:
        return self.rows[self.cursor_row][0] if 0 <= self.cursor_row < len(self.rows) else None

    def get_row_at(self, index: int) -> tuple[Cell, ...]:
        return self.rows[index][1]

    def set_rows(self, rows: Sequence[Row]) -> None:
        """Show these rows; the cursor stays on the row with the same key (or the same place)."""
        key = self.cursor_key
        self.rows = list(rows)
        self._index = {k: i for i, (k, _) in enumerate(self.rows)}
        widths = column_widths(self.columns, self.rows)
        self.widths = widths
        self.virtual_size = Size(sum(widths) + GAP * len(widths) + 1, len(self.rows) + 1)
        index = self._index.get(key, self.cursor_row) if key is not None else self.cursor_row
        self.set_reactive(LiveTable.cursor_row, max(0, min(index, len(self.rows) - 1)))
        self.refresh()

    def move_cursor(self, row: int) -> None:
        """Move the cursor (and post RowHighlighted, as a user's move would)."""
        if self.rows:
            self.cursor_row = max(0, min(len(self.rows) - 1, row))

    def move_to_key(self, key: str) -> None:
        """Put the cursor on a row quietly (no RowHighlighted)."""
        if key in self._index:
            self.set_reactive(LiveTable.cursor_row, self._index[key])
            self._scroll_to_cursor()
            self.refresh()

    # ---- drawing -------------------------------------------------------------------------------

    def _cells(self, cells: Sequence[Cell], style: Style | None) -> list[Segment]:
        segs: list[Segment] = [Segment(" ", style)]
        console = self.app.console
        for i, column in enumerate(self.columns):
            width = self.widths[i]
            cell = cells[i] if i < len(cells) else ""
            if isinstance(cell, Text):
                text = cell
            elif isinstance(cell, Styled):
                text = Text(cell, style=cell.style)
            else:
                text = Text(cell)
            pad = width - text.cell_len
            if pad < 0:
                text = text.copy()
                text.truncate(width, overflow="ellipsis")
                pad = 0
            if column.justify == "right" and pad:
                segs.append(Segment(" " * pad, style))
            for seg in text.render(console):
                segs.append(
                    Segment(seg.text, (seg.style + style) if (seg.style and style) else (seg.style or style))
                )
            if column.justify != "right" and pad:
                segs.append(Segment(" " * pad, style))
            segs.append(Segment(" " * GAP, style))
        return segs

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.scrollable_content_region.width
        if y == 0:
            labels = tuple(Text(c.label) for c in self.columns)
            segs = [Segment(s.text, (s.style or Style()) + HEADER) for s in self._cells(labels, None)]
            return (
                Strip(segs)
                .adjust_cell_length(max(width, self.virtual_size.width))
                .crop(scroll_x, scroll_x + width)
            )
        index = scroll_y + y - 1
        if index >= len(self.rows):
            return Strip.blank(width)
        self.draws += 1
        style: Style | None = None
        if index == self.cursor_row:
            style = CURSOR if self.has_focus else CURSOR_BLURRED
        elif self.zebra and index % 2:
            style = ZEBRA
        strip = Strip(self._cells(self.rows[index][1], style))
        return strip.adjust_cell_length(max(width, self.virtual_size.width), style).crop(
            scroll_x, scroll_x + width
        )

    # ---- cursor --------------------------------------------------------------------------------

    def watch_cursor_row(self, old: int, new: int) -> None:
        self._scroll_to_cursor()
        self.refresh()
        key = self.cursor_key
        if key is not None:
            self.post_message(self.RowHighlighted(self, key))

    def _scroll_to_cursor(self) -> None:
        """Row i is drawn at line i + 1 - scroll_y (line 0 is the header)."""
        height = self.scrollable_content_region.height
        row, top = self.cursor_row, round(self.scroll_offset.y)
        if row < top:
            self.scroll_to(y=row, animate=False, immediate=True)
        elif height > 1 and row > top + height - 2:
            self.scroll_to(y=row - height + 2, animate=False, immediate=True)

    def on_focus(self, event: events.Focus) -> None:
        self.refresh()

    def on_blur(self, event: events.Blur) -> None:
        self.refresh()

    def action_move(self, delta: int) -> None:
        self.move_cursor(self.cursor_row + delta)

    def action_page(self, direction: int) -> None:
        self.move_cursor(self.cursor_row + direction * max(1, self.scrollable_content_region.height - 2))

    def action_edge(self, direction: int) -> None:
        self.move_cursor(0 if direction < 0 else len(self.rows) - 1)

    def action_select(self) -> None:
        key = self.cursor_key
        if key is not None:
            self.post_message(self.RowSelected(self, key))

    def on_click(self, event: events.Click) -> None:
        y = event.y
        if y >= 1:
            self.move_cursor(self.scroll_offset.y + y - 1)
