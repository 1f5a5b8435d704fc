"""Every colour the TUI draws, named by what it means on screen.

Screens, widgets and cells take their colours from here, never as literals
(tests/tui/test_theme.py checks it), so a colour changes in one place, and two meanings that
share a colour today (idle capacity and the operator's marks, say) can part without a hunt.
Values are Rich colour names or #rrggbb. Styles are put together where they are drawn
(`render.py` for cells and scales, `grid.py`, `table.py`, the screens) from these names and
Rich's attributes (bold, dim, italic, underline, reverse), which are not colours.

Textual's CSS variables ($panel, $accent, $warning, $text-muted, ...) stay Textual's: they
follow its theme.
"""

from __future__ import annotations

# ---- a node's connection (the state column, the grid's line tail, the status bar, events) -------
LIVE = "green"
STALE = "yellow"
UNREACHABLE = "red"
CONNECTING = "grey50"

# ---- capacity and who uses it --------------------------------------------------------------------
IDLE = "#ffd75f"  # idle capacity: the waste to see (totals, team chips, tables, group lines)
HELD = "#ff875f"  # held idle: memory or processes on capacity that does no work
BORROWED = "#87d787"  # what a team uses beyond its own silo
USED = "#87d787"  # a team's share of the fleet over the session (its sparkline)
POOL = "#5fd7ff"  # a shared pool, wherever it is named (the Pool screen, :tenants, the grid)
TEAM = "#87afd7"  # a team's name, the owner of a node's GPUs
CARVING = "#87afd7"  # a GPU's live carving (the Pool screen)
TREND = "#87d7ff"  # sparklines

# ---- attention -----------------------------------------------------------------------------------
OK = "green"  # done as asked (applied)
PENDING = "yellow"  # under way or not there yet: waiting for data, a job running, its progress bar
WARNING = "yellow"  # worth a look: a warning line, a screen without its input, a list NVML refused
NOTICE = "#ffaf00"  # how to read what is shown: READONLY, attribution events, the tenants' notice
ERROR = "red"  # failed or missing: errors, GPUs without data, a lost GPU, a severe health event
DANGER = "red"  # a change that disrupts running work
AGENT_ERROR = "#ff875f"  # an agent's error event
INFO = "#87afd7"  # an informative health event
MARKED = "#ffd75f"  # what the operator picked or changed: the filter, marks, moves under review

# ---- chrome --------------------------------------------------------------------------------------
ACCENT = "#5fafff"  # gpuops' own mark in the title bar, the keys in the help
ON_FLAG = "#000000"  # text on a coloured flag (gpuops' mark, READONLY)
HEADING = "#a8b8c8"  # table headings; a group line's secondary figures
CURSOR = "#264f78"  # the table cursor's background
CURSOR_BLURRED = "#2a2a3a"  # the table cursor's background while the table has not the focus
ZEBRA = "#1a1a1a"  # every other table line's background

# ---- the fleet grid ------------------------------------------------------------------------------
GROUP = "#1f2d3d"  # a group line's background
GROUP_TEXT = "#e8e8e8"  # a group line's name and figures
LABEL = "#d0d0d0"  # a node's name
LABEL_CURSOR = "#ffffff"  # a node's name under the cursor
GPU_EDGE = "#808080"  # the marks around a GPU's cells

# ---- cells: (background, text) -------------------------------------------------------------------
NO_DATA = ("#262626", "#6c6c6c")  # no figure to show
LOST = ("#a01010", "#ffffff")  # a GPU that fell off the bus
UNCARVED = ("#1c1c1c", "#808080")  # MIG capacity not carved into instances, MIG on without any
SLICE_BUSY = ("#4f9a35", "#ffffff")  # a busy MIG slice
SLICE_IDLE = ("#3a3a3a", "#b0b0b0")  # an idle MIG slice
HELD_CELL = ("#5f2f00", "#ffaf5f")  # held idle: a colour no utilization has

# Heat scales, one (background, text) per step of render.UTIL_STEPS / MEM_STEPS, coolest first.
# Utilization: grey while idle, then greens, brighter when busier.
UTIL_SCALE = (
    ("#3a3a3a", "#9e9e9e"),
    ("#2b4f26", "#e0e0e0"),
    ("#3b7030", "#ffffff"),
    ("#4f9a35", "#ffffff"),
    ("#6cc04a", "#000000"),
    ("#9be36f", "#000000"),
)
# Memory in use: greys to blues.
MEM_SCALE = (
    ("#3a3a3a", "#9e9e9e"),
    ("#26345e", "#e0e0e0"),
    ("#2f4a8f", "#ffffff"),
    ("#3d62c0", "#ffffff"),
    ("#5b82e6", "#000000"),
    ("#93b0ff", "#000000"),
)
