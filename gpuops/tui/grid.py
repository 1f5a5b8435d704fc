"""The fleet grid: a cell per GPU or MIG slice, nodes in rows, grouped by team or not at all.

`layout_grid` (pure) places groups, nodes and cells on lines for a width; `FleetGrid` (a Line API
scroll view) draws only the lines in view, so a 1000-GPU fleet costs the same to redraw as a
10-GPU one. A cell is 6 columns: utilization (3) and memory (3), each on its own colour scale; a
MIG slice shows its SMs' utilization where NVML's GPM gives it (Hopper and newer), else its compute
size ("3g"), in the slice's busy or idle colour. Nodes that fit side by side are packed into
columns on wide terminals; a node that is not live gets a line of its own, with its state, age and
reason after its (dimmed, last known) cells.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import overload

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.message import Message
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from gpuops.fleet.source import CONNECTING, LIVE, STALE
from gpuops.tui import render, theme
from gpuops.views.cells import EMPTY_MIG, FREE, LOST, SLICE, Cell
from gpuops.views.grid import BY_NODE, Group
from gpuops.views.nodes import NodeRow

CELL = 6  # columns of one cell's text
GAP = 1  # between cells
PITCH = CELL + GAP
BLOCK_GAP = 3  # between nodes packed side by side
MAX_NAME = 24
MAX_OWNER = 12
PACKED_CELLS = 8  # nodes of up to this many cells are packed side by side on wide terminals

CellKey = tuple[str, int, int | None, str]  # node, gpu, MIG instance, kind


def cell_key(cell: Cell) -> CellKey:
    return (cell.node, cell.gpu, cell.instance, cell.kind)


@dataclass(frozen=True)
class Block:
    """A run of one node's cells on one line, starting at column `x`."""

    row: NodeRow
    start: int  # first cell index
    end: int  # one past the last
    x: int
    first: bool  # the node's first line (shows its label)
    tail: bool  # show the node's state and reason after the cells


@dataclass(frozen=True)
class Line:
    group: Group | None = None  # a group header line when set
    blocks: tuple[Block, ...] = ()


@dataclass(frozen=True)
class Position:
    line: int
    x: int
    row: NodeRow
    cell: int  # index into row.cells; -1 for a node without cells


class Positions(Sequence[Position]):
    """Where every cell is, kept per block of cells (a node's cells on one line: a 10k-GPU grid
    has 15k cells and 1.5k blocks), a cell's Position worked out on access; the parallel lists
    (`lines`, `xs`, `rows`, `cells`) are made on first use (moving the cursor up or down)."""

    def __init__(self, label: int = 0) -> None:
        self.label = label  # where a block's first cell starts, from the block's x
        self.firsts: list[int] = []  # each block's first position
        # each block: (line, x, row, first cell, end); a block without cells is one position, -1
        self.blocks: list[tuple[int, int, NodeRow, int, int]] = []
        self._count = 0
        self._lists: tuple[list[int], list[int], list[NodeRow], list[int]] | None = None

    def add_block(self, line: int, x: int, row: NodeRow, start: int, end: int) -> None:
        self.firsts.append(self._count)
        self.blocks.append((line, x, row, start, end))
        self._count += max(1, end - start)
        self._lists = None

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Position: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Position]: ...

    def __getitem__(self, index: int | slice) -> Position | Sequence[Position]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += self._count
        if not 0 <= index < self._count:
            raise IndexError(index)
        k = bisect_right(self.firsts, index) - 1
        line, x, row, start, end = self.blocks[k]
        if start == end:
            return Position(line, x, row, -1)
        i = start + index - self.firsts[k]
        return Position(line, x + self.label + (i - start) * PITCH, row, i)

    def _made(self) -> tuple[list[int], list[int], list[NodeRow], list[int]]:
        if self._lists is None:
            lines: list[int] = []
            xs: list[int] = []
            rows: list[NodeRow] = []
            cells: list[int] = []
            for line, x, row, start, end in self.blocks:
                if start == end:
                    lines.append(line)
                    xs.append(x)
                    rows.append(row)
                    cells.append(-1)
                    continue
                cx = x + self.label
                for i in range(start, end):
                    lines.append(line)
                    xs.append(cx)
                    rows.append(row)
                    cells.append(i)
                    cx += PITCH
            self._lists = (lines, xs, rows, cells)
        return self._lists

    @property
    def lines(self) -> list[int]:
        return self._made()[0]

    @property
    def xs(self) -> list[int]:
        return self._made()[1]

    @property
    def rows(self) -> list[NodeRow]:
        return self._made()[2]

    @property
    def cells(self) -> list[int]:
        return self._made()[3]

    def first_of(self, name: str) -> int | None:
        """The first position of node `name`, None where it is not laid out."""
        for first, block in zip(self.firsts, self.blocks, strict=True):
            if block[2].name == name:
                return first
        return None

    def find(self, want: CellKey) -> int:
        """The position of the cell `want` (`cell_key`), else its node's first, else 0. Only the
        blocks of that node have their cells made."""
        node_match = None
        for first, (_, _, row, start, end) in zip(self.firsts, self.blocks, strict=True):
            if row.name != want[0]:
                continue
            cells = row.cells if start < end else ()
            for i in range(start, end):
                if cell_key(cells[i]) == want:
                    return first + i - start
            if node_match is None:
                node_match = first
        return node_match if node_match is not None else 0


@dataclass(frozen=True)
class GridLayout:
    width: int
    name_width: int
    owner_width: int
    lines: tuple[Line, ...]
    positions: Positions = field(repr=False)

    @property
    def label_width(self) -> int:
        return 2 + self.name_width + 1 + (self.owner_width + 1 if self.owner_width else 0)


def layout_grid(groups: tuple[Group, ...], width: int, by: str) -> GridLayout:
    rows = [r for g in groups for r in g.rows]
    name_w = min(MAX_NAME, max((len(r.name) for r in rows), default=4))
    owner_w = min(MAX_OWNER, max((len(r.owner or "-") for r in rows), default=1)) if by == BY_NODE else 0
    label = 2 + name_w + 1 + (owner_w + 1 if owner_w else 0)
    per_line = max(1, (width - label) // PITCH)
    # Columns as wide as the usual node (up to 8 cells: the common 8-GPU server); wider nodes (many
    # MIG slices) take a line of their own, so that one of them does not make every column wide.
    counts = [r.cell_count for r in rows if r.cell_count <= per_line and r.state == LIVE]
    usual = [c for c in counts if c <= PACKED_CELLS]
    column_w = label + max(usual or counts or [1]) * PITCH + BLOCK_GAP
    columns = max(1, (width + BLOCK_GAP) // column_w)
    lines: list[Line] = []
    positions = Positions(label)

    def add(line: Line) -> None:
        for block in line.blocks:
            positions.add_block(len(lines), block.x, block.row, block.start, block.end)
        lines.append(line)

    for group in groups:
        if group.team or by != BY_NODE:
            add(Line(group=group))
        packed: list[Block] = []
        for row in group.rows:
            n = row.cell_count  # the cells themselves are made when their line is drawn
            packable = columns > 1 and row.state == LIVE and n <= per_line and label + n * PITCH <= column_w
            if packable:
                packed.append(Block(row, 0, n, len(packed) * column_w, True, False))
                if len(packed) == columns:
                    add(Line(blocks=tuple(packed)))
                    packed = []
                continue
            if packed:
                add(Line(blocks=tuple(packed)))
                packed = []
            if n == 0:
                add(Line(blocks=(Block(row, 0, 0, 0, True, True),)))
                continue
            for start in range(0, n, per_line):
                end = min(n, start + per_line)
                add(Line(blocks=(Block(row, start, end, 0, start == 0, end == n),)))
        if packed:
            add(Line(blocks=tuple(packed)))
    return GridLayout(width, name_w, owner_w, tuple(lines), positions)


# ---- drawing -------------------------------------------------------------------------------------

HEADER = Style(bgcolor=theme.GROUP, color=theme.GROUP_TEXT, bold=True)
HEADER_DIM = Style(bgcolor=theme.GROUP, color=theme.HEADING)
HEADER_IDLE = Style(bgcolor=theme.GROUP, color=theme.IDLE, bold=True)
HEADER_HELD = Style(bgcolor=theme.GROUP, color=theme.HELD, bold=True)
LABEL = Style(color=theme.LABEL)
LABEL_CURSOR = Style(color=theme.LABEL_CURSOR, bold=True, underline=True)
OWNER = Style(color=theme.TEAM)
TAIL = {
    STALE: Style(color=theme.STALE),
    "unreachable": Style(color=theme.UNREACHABLE),
    CONNECTING: Style(color=theme.CONNECTING),
}
CURSOR = Style(reverse=True, bold=True)
DIM = Style(dim=True)
BLANK = Style()
GPU_EDGE = Style(color=theme.GPU_EDGE, bold=True)
MIG_KINDS = (SLICE, FREE, EMPTY_MIG)


def _header_segments(group: Group, by: str, width: int) -> list[Segment]:
    """A group's line: its parts in order of importance, as many whole parts as fit the width
    (never '7 pr' of '7 processes')."""
    t = group.totals
    title = group.team if group.team else "all nodes"
    parts: list[list[Segment]] = [
        [Segment(f"▌{title} ", HEADER), Segment(f" {render.count(t.nodes, 'node')}", HEADER_DIM)]
    ]
    if not t.gpus:
        parts.append([Segment("no GPU known yet", HEADER_DIM)])
    else:
        parts.append([Segment(render.count(t.gpus, "GPU"), HEADER_DIM)])
        parts.append([Segment(f"{render.gpus(t.busy)} busy", HEADER_DIM)])
        idle = [Segment(f"{render.gpus(t.idle)} idle", HEADER_IDLE if t.idle >= 0.05 else HEADER_DIM)]
        if t.held >= 0.05:
            idle.append(Segment(f" ({render.gpus(t.held)} held)", HEADER_HELD))
        parts.append(idle)
        parts.append([Segment(f"util {render.percent(t.util)}", HEADER_DIM)])
        parts.append([Segment(f"mem {render.share(t.memory_used, t.memory_total)}", HEADER_DIM)])
        if t.unknown:
            parts.append([Segment(f"{t.unknown} without data", HEADER_DIM)])
        processes = f"{t.processes} process{'es' if t.processes != 1 else ''}"
        parts.append([Segment(processes, HEADER_DIM)])
    segs: list[Segment] = list(parts[0])
    used = Segment.get_line_length(segs)
    for part in parts[1:]:
        length = 3 + Segment.get_line_length(part)
        if used + length > width:
            break
        segs.append(Segment(" · ", HEADER_DIM))
        segs.extend(part)
        used += length
    return segs


def cell_segments(cell: Cell, live: bool, cursor: bool) -> list[Segment]:
    """A cell's two 3-column halves: utilization (or MIG size) and memory."""
    if cell.kind == LOST:
        segs = [Segment(" LOST ", render.LOST_STYLE)]
    elif cell.kind == FREE:
        segs = [Segment(" free ", render.FREE_STYLE)]
    elif cell.kind == EMPTY_MIG:
        segs = [Segment(" MIG  ", render.FREE_STYLE)]
    elif cell.kind == SLICE:
        if cell.util is not None:
            left = Segment(
                render.pct3(cell.util), render.HELD_STYLE if cell.held else render.util_style(cell.util)
            )
        else:
            size = cell.profile.split(".", 1)[0][:3]
            style = render.SLICE_BUSY if cell.busy else render.HELD_STYLE if cell.held else render.SLICE_IDLE
            left = Segment(f"{size:>3}", style)
        segs = [left, Segment(render.mem3(cell.memory), render.mem_style(cell.memory))]
    else:
        segs = [
            Segment(render.pct3(cell.util), render.HELD_STYLE if cell.held else render.util_style(cell.util)),
            Segment(render.mem3(cell.memory), render.mem_style(cell.memory)),
        ]
    if not live:
        segs = [Segment(s.text, (s.style or BLANK) + DIM) for s in segs]
    if cursor:
        segs = [Segment(s.text, (s.style or BLANK) + CURSOR) for s in segs]
    return segs


def _label_segments(layout: GridLayout, block: Block, cursor_here: bool) -> list[Segment]:
    row = block.row
    if not block.first:
        return [Segment(" " * layout.label_width)]
    glyph = render.STATE_GLYPH.get(row.state, "?")
    name = row.name if len(row.name) <= layout.name_width else row.name[: layout.name_width - 1] + "…"
    segs = [
        Segment(glyph + " ", Style(color=render.STATE_COLOUR.get(row.state, ""))),
        Segment(name.ljust(layout.name_width) + " ", LABEL_CURSOR if cursor_here else LABEL),
    ]
    if layout.owner_width:
        owner = (row.owner or "-")[: layout.owner_width]
        segs.append(Segment(owner.ljust(layout.owner_width) + " ", OWNER))
    return segs


def _tail_segments(row: NodeRow, now: float) -> list[Segment]:
    if row.state == LIVE:
        return []
    text = f" {render.STATE_GLYPH.get(row.state, '?')} {row.state}"
    if row.state == CONNECTING:
        text += "…"
    elif row.since:
        text += f" for {render.age(max(0.0, now - row.since))}"
    age = row.age(now)
    if age is not None and row.state != CONNECTING:
        text += f", data {render.age(age)} old"
    if row.reason:
        text += f" · {row.reason}"
    return [Segment(text, TAIL.get(row.state, BLANK))]


def draw_line(layout: GridLayout, y: int, by: str, now: float, cursor: Position | None) -> list[Segment]:
    line = layout.lines[y]
    if line.group is not None:
        return _header_segments(line.group, by, layout.width)
    segs: list[Segment] = []
    x = 0
    for block in line.blocks:
        if block.x > x:
            segs.append(Segment(" " * (block.x - x)))
            x = block.x
        on_node = cursor is not None and cursor.row.name == block.row.name and cursor.line == y
        label = _label_segments(layout, block, on_node or (cursor is not None and cursor.row is block.row))
        segs.extend(label)
        x += layout.label_width
        live = block.row.state == LIVE
        cells = block.row.cells
        for i in range(block.start, block.end):
            here = cursor is not None and cursor.row is block.row and cursor.cell == i
            cell = cells[i]
            segs.extend(cell_segments(cell, live, here))
            nxt = cells[i + 1] if i + 1 < len(cells) else None
            # A MIG GPU's slices sit together; a bar separates it from the next GPU.
            mig_edge = (
                nxt is not None and nxt.gpu != cell.gpu and (cell.kind in MIG_KINDS or nxt.kind in MIG_KINDS)
            )
            segs.append(Segment("│", GPU_EDGE) if mig_edge and i + 1 < block.end else Segment(" " * GAP))
            x += PITCH
        if block.tail:
            segs.extend(_tail_segments(block.row, now))
    return segs


class FleetGrid(ScrollView, can_focus=True):
    """Draws a layout of the fleet's cells; the cursor moves over cells (Enter opens the GPU)."""

    DEFAULT_CSS = """
    FleetGrid { height: 1fr; overflow-x: hidden; overflow-y: auto; }
    """

    BINDINGS = [
        Binding("up,k", "move(0,-1)", "cell above", show=False),
        Binding("down,j", "move(0,1)", "cell below", show=False),
        Binding("left,h", "move(-1,0)", "previous cell", show=False),
        Binding("right,l", "move(1,0)", "next cell", show=False),
        Binding("pageup", "page(-1)", "page up", show=False),
        Binding("pagedown", "page(1)", "page down", show=False),
        Binding("home", "edge(-1)", "first cell", show=False),
        Binding("end", "edge(1)", "last cell", show=False),
        Binding("enter", "select", "open the GPU", show=False),
    ]

    class CursorMoved(Message):
        def __init__(self, row: NodeRow | None, cell: Cell | None) -> None:
            super().__init__()
            self.row = row
            self.cell = cell

    class Opened(Message):
        def __init__(self, row: NodeRow, cell: Cell | None) -> None:
            super().__init__()
            self.row = row
            self.cell = cell

    cursor_index: reactive[int] = reactive(0, always_update=True, repaint=False)

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.groups: tuple[Group, ...] = ()
        self.by = "team"
        self.now = 0.0
        self.layout_: GridLayout = layout_grid((), 80, "team")
        self._want: CellKey | None = None  # the cell the cursor should stay on across updates
        self.draws = 0  # lines drawn (tests check that hidden screens draw nothing)

    # ---- data ------------------------------------------------------------------------------------

    def show(self, groups: tuple[Group, ...], by: str, now: float) -> None:
        self.groups, self.by, self.now = groups, by, now
        self._relayout()

    def _relayout(self) -> None:
        width = max(20, self.scrollable_content_region.width or self.size.width or 80)
        self.layout_ = layout_grid(self.groups, width, self.by)
        self.virtual_size = Size(width, len(self.layout_.lines))
        positions = self.layout_.positions
        index = 0
        if self._want is not None and positions:
            index = self._find(self._want)
        self.set_reactive(FleetGrid.cursor_index, min(index, max(0, len(positions) - 1)))
        self.refresh()
        self._announce()

    def _find(self, want: CellKey) -> int:
        return self.layout_.positions.find(want)

    @property
    def cursor(self) -> Position | None:
        positions = self.layout_.positions
        if not positions:
            return None
        return positions[min(self.cursor_index, len(positions) - 1)]

    @property
    def cursor_cell(self) -> Cell | None:
        p = self.cursor
        return p.row.cells[p.cell] if p is not None and p.cell >= 0 else None

    def on_resize(self, event: events.Resize) -> None:
        self._relayout()

    # ---- drawing ---------------------------------------------------------------------------------

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = y + scroll_y
        width = self.scrollable_content_region.width
        if index >= len(self.layout_.lines):
            return Strip.blank(width)
        self.draws += 1
        segments = draw_line(self.layout_, index, self.by, self.now, self.cursor)
        return Strip(segments).adjust_cell_length(width).crop(scroll_x, scroll_x + width)

    # ---- cursor ----------------------------------------------------------------------------------

    def watch_cursor_index(self, old: int, new: int) -> None:
        positions = self.layout_.positions
        if not positions:
            return
        for i in {old, new}:
            if 0 <= i < len(positions):
                self.refresh_line(positions[i].line)
        p = positions[min(new, len(positions) - 1)]
        if p.cell >= 0:
            self._want = cell_key(p.row.cells[p.cell])
        else:
            self._want = (p.row.name, -1, None, "")
        self.scroll_to_region(Region(0, p.line, 1, 1), animate=False, immediate=True)
        self._announce()

    def _announce(self) -> None:
        p = self.cursor
        self.post_message(self.CursorMoved(p.row if p else None, self.cursor_cell))

    def _move_to(self, index: int) -> None:
        positions = self.layout_.positions
        if positions:
            self.cursor_index = max(0, min(len(positions) - 1, index))

    def action_move(self, dx: int, dy: int) -> None:
        positions = self.layout_.positions
        if not positions:
            return
        if dx:
            self._move_to(self.cursor_index + dx)
            return
        here = positions[self.cursor_index]
        target_line = here.line + dy
        while 0 <= target_line < len(self.layout_.lines):
            candidates = [i for i, line in enumerate(positions.lines) if line == target_line]
            if candidates:
                best = min(candidates, key=lambda i: abs(positions.xs[i] - here.x))
                self._move_to(best)
                return
            target_line += dy

    def action_page(self, direction: int) -> None:
        for _ in range(max(1, self.scrollable_content_region.height - 1)):
            before = self.cursor_index
            self.action_move(0, direction)
            if self.cursor_index == before:
                break

    def action_edge(self, direction: int) -> None:
        self._move_to(0 if direction < 0 else len(self.layout_.positions) - 1)

    def action_select(self) -> None:
        p = self.cursor
        if p is not None:
            self.post_message(self.Opened(p.row, self.cursor_cell))

    def select_node(self, name: str) -> None:
        """Put the cursor on a node's first cell (if shown)."""
        first = self.layout_.positions.first_of(name)
        if first is not None:
            self._move_to(first)
