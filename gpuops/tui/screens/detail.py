"""A node and one of its GPUs: every sample with its unit, the MIG layout drawn over the memory
slices with profile names, processes with user and tenant, and MPS / limiter settings (a place
kept for them: the agent does not report them yet)."""

from __future__ import annotations

from typing import ClassVar

from rich.console import Group as RichGroup
from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from gpuops.core.model import Gpu, HealthEvent
from gpuops.core.vendor import runtime_name, unit_name
from gpuops.fleet.source import LIVE, NodeView
from gpuops.tui import render, theme
from gpuops.tui.keys import TABLE_KEYS, Key
from gpuops.tui.screens.base import ViewScreen, screen_bindings
from gpuops.tui.table import Cell, Column, LiveTable, Row
from gpuops.views import format as fmt
from gpuops.views.common import as_float, mig_active, short_model
from gpuops.views.detail import SliceSpan, find_gpu, mig_layout, process_rows
from gpuops.views.events import xid_summary
from gpuops.views.feed import FleetState
from gpuops.views.gpu_history import NOT_SENT, GpuHistory, health_counts
from gpuops.views.partition import partition_column, partition_summary

GPU_COLUMNS = (
    Column("GPU", "gpu", "right"),
    Column("Model", "model"),
    Column("Owner", "owner"),
    Column("Util", "util", "right"),
    Column("Memory", "memory"),
    Column("Power", "power", "right"),
    Column("Temp", "temp", "right"),
    Column("SM clock", "sm", "right"),
    Column("Mem clock", "mem", "right"),
    Column("MIG", "mig"),
    Column("Procs", "procs", "right"),
    Column("XID", "xid", "right"),
)
PROC_COLUMNS = (
    Column("GPU", "gpu", "right"),
    Column("MIG", "mig"),
    Column("PID", "pid", "right"),
    Column("User", "user"),
    Column("Tenant", "tenant"),
    Column("Memory", "memory", "right"),
    Column("Command", "command"),
)
SLICE_WIDTH = 11
MIN_SLICE_WIDTH = 5


def _gpus(view: NodeView) -> tuple[Gpu, ...]:
    return view.sample.gpus if view.sample else (view.inventory.gpus if view.inventory else ())


def _xid_count(view: NodeView, gpu: Gpu) -> str:
    """The GPU's XID errors since its agent listens; "-" where the agent reports no events."""
    health = view.sample.health if view.sample else None
    if health is None or health.error:
        return "-"
    return str(sum(c.count for c in health.xid_counts if c.gpu == gpu.info.index))


def node_header(view: NodeView, now: float) -> Text:
    text = Text()
    text.append(view.name, style="bold")
    text.append("  ")
    text.append_text(render.state_text(view.state, view.age(now)))
    if view.state != LIVE and view.reason:
        text.append(f" · {view.reason}", style=render.STATE_COLOUR.get(view.state, ""))
    age = view.age(now)
    text.append(f"\naddress {view.address} · owner {view.owner or 'none'} · last sample ")
    text.append(f"{render.age(age)} ago" if age is not None else "never")
    if view.hello is not None:
        h = view.hello
        text.append(
            f"\nagent {h.agent_version} (protocol {h.protocol}) · python {h.python} · backend {h.backend}"
        )
        text.append(f" · host {h.hostname}")
    if view.inventory is not None:
        inv = view.inventory
        if inv.driver_version:
            text.append(f" · driver {inv.driver_version}")
        if inv.cuda_driver_version:
            runtime = runtime_name((g.info for g in inv.gpus), inv.backend)
            text.append(f" · {runtime} {inv.cuda_driver_version}")
    return text


def _boxed(lines: tuple[str, ...], width: int) -> list[str]:
    """A box's lines in exactly `width` cells each, after a space where they all fit with it;
    a line still too long is cut with '…' (never silently)."""
    lead = " " if all(len(line) < width for line in lines) else ""
    out = []
    for line in lines:
        if len(line) > width:
            line = line[: max(0, width - 1)] + "…"
        out.append(f"{lead}{line}".ljust(width)[:width])
    return out


def slice_bar(count: int, spans: tuple[SliceSpan, ...], width: int = 200) -> Text:
    """The GPU's memory slices as boxes, one per GPU instance (free slices dotted), in `width`
    cells: a slice is SLICE_WIDTH cells where they fit, narrower on a small terminal (80
    columns: 8 slices of 8), its words cut with '…' where they do not fit."""
    slice_width = max(MIN_SLICE_WIDTH, min(SLICE_WIDTH, (width - 6) // max(1, count)))
    ruler = Text("slice ", style="dim")
    for s in range(count):
        ruler.append(f"{s:<{slice_width}}", style="dim")
    rows = [Text("      "), Text("      "), Text("      ")]
    for span in spans:
        box = span.size * slice_width - 1
        if span.instance is None:
            style = render.FREE_STYLE
            lines = ("free", "not carved", "")
        else:
            style = render.SLICE_BUSY if span.processes else render.SLICE_IDLE
            lines = (
                span.profile,
                f"GI{span.instance} {render.percent(span.memory)}",
                ", ".join(span.tenants) if span.tenants else ("idle" if not span.processes else ""),
            )
        for row, line in zip(rows, _boxed(lines, box), strict=True):
            row.append(line, style=style)
            row.append(" ")
    out = Text()
    out.append_text(ruler)
    for row in rows:
        out.append("\n")
        out.append_text(row)
    return out


SPARK_WIDTH = 60
MIN_SPARK_WIDTH = 20
# The detail's sparklines: series, title, unit, fixed top (None: the series' max)
TRENDS: tuple[tuple[str, str, str, float | None], ...] = (
    ("util", "utilization", "%", 100.0),
    ("memory", "memory", "%", 100.0),
    ("power", "power", "W", None),
    ("temperature", "temperature", "°C", None),
)


def trend_lines(history: GpuHistory | None, node: str, gpu: Gpu, width: int = 200) -> list[Text]:
    """The GPU over the session: a sparkline per figure with now/min/max (power on the scale of
    its limit, where known), each line within `width` cells (narrower sparklines first, then
    without min/max)."""
    if history is None:
        return []
    index = gpu.info.index
    points = history.points(node, index)
    lines = [Text(f"over the session ({points} samples, the last {history.ring} kept)", style="bold")]
    limit = as_float(gpu.info.power_limit_watts)
    figures = []
    for series, title, unit, top in TRENDS:
        values = history.series(node, index, series)
        now = f"  now {values[-1]:.0f}{unit}" if values else ""
        spread = f"  min {min(values):.0f}{unit}  max {max(values):.0f}{unit}" if values else ""
        figures.append((series, title, top, values, now, spread))
    label = 13
    tail = max((len(now) + len(spread) for *_, now, spread in figures), default=0)
    short = max((len(now) for *_, now, _ in figures), default=0)
    spark = min(SPARK_WIDTH, width - label - tail)
    with_spread = spark >= MIN_SPARK_WIDTH
    if not with_spread:
        spark = max(1, min(SPARK_WIDTH, width - label - short))
    for series, title, top, values, now, spread in figures:
        line = Text(f"{title:>12} ", style="dim")
        if not values:
            line.append("n/a (not reported)", style="dim")
            lines.append(line)
            continue
        peak = top if top is not None else (limit if series == "power" and limit else max(values))
        line.append(render.sparkline(values, spark, peak if peak and peak > 0 else None), style=theme.TREND)
        line.append(now, style="bold")
        if with_spread:
            line.append(spread, style="dim")
        lines.append(line)
    return lines


def health_rows(
    view: NodeView, gpu: Gpu, events: tuple[tuple[str, HealthEvent], ...]
) -> list[tuple[str, Text]]:
    """What the model says about the GPU's health, and what it cannot say yet, with why."""
    health = view.sample.health if view.sample else None
    rows: list[tuple[str, Text]] = []
    if health is None or health.error:
        why = (
            f"n/a ({health.error})"
            if health is not None
            else "not reported (no health events from this source)"
        )
        rows.append(("ECC events", Text(why, style="dim")))
        rows.append(("clock events", Text(why, style="dim")))
    else:
        counts = health_counts(events, view.name, gpu.info.index)
        ecc = Text(f"{counts.ecc_single_bit} corrected · ")
        ecc.append(
            f"{counts.ecc_double_bit} uncorrectable",
            style=f"bold {theme.ERROR}" if counts.ecc_double_bit else "",
        )
        ecc.append(" (NVML events this session)", style="dim")
        rows.append(("ECC events", ecc))
        rows.append(
            (
                "clock events",
                Text(
                    f"{counts.clock} clock changes · {counts.pstate} P-state changes (throttling shows here)"
                ),
            )
        )
    for name, call in NOT_SENT:
        rows.append(
            (name, Text(f"not reported: the agent's sample has no field for it yet ({call})", style="dim"))
        )
    return rows


def gpu_panel(view: NodeView, gpu: Gpu | None, state: FleetState, width: int = 200) -> RichGroup:
    """The selected GPU's facts, health, trends and MIG layout in `width` cells: its header
    lines and the MIG layout never wrap (they are laid out for the width)."""
    ownership, history, events = state.ownership, state.gpu_history, state.health
    if gpu is None:
        return RichGroup(Text("No GPU selected (no data from this node yet).", style="dim"))
    parts: list[object] = []
    title = Text()
    title.append(f"GPU {gpu.info.index} · {gpu.info.name}", style="bold")
    ids = f"{gpu.info.uuid} · PCI {gpu.info.pci_bus_id}"
    # Where the ids do not fit after the name, they take a line of their own.
    title.append(f" · {ids}" if title.cell_len + 3 + len(ids) <= width else f"\n{ids}", style="dim")
    parts.append(title)
    facts = Table.grid(padding=(0, 2))
    facts.add_column(style="dim", no_wrap=True)
    facts.add_column()
    s = gpu.sample
    owner = ownership.owner(view, gpu)
    facts.add_row("owner", owner or "none")
    if s is not None:
        facts.add_row(
            "utilization",
            f"GPU {fmt.percent(s.utilization_gpu_percent)} · memory bus "
            f"{fmt.percent(s.utilization_memory_percent)}",
        )
        facts.add_row("memory", fmt.memory_usage(s.memory_used_bytes, s.memory_total_bytes))
        facts.add_row(
            "power",
            f"{fmt.watts(s.power_watts)} of {fmt.watts(gpu.info.power_limit_watts)} limit",
        )
        facts.add_row("temperature", fmt.celsius(s.temperature_celsius))
        facts.add_row("clocks", f"SM {fmt.mhz(s.sm_clock_mhz)} · memory {fmt.mhz(s.memory_clock_mhz)}")
    facts.add_row(unit_name(gpu.info), fmt.metric(gpu.info.multiprocessor_count, str))
    facts.add_row("XID errors", xid_summary(view.sample.health if view.sample else None, gpu.info.index))
    for name, value in health_rows(view, gpu, events):
        facts.add_row(name, value)
    if gpu.processes_error:
        facts.add_row("processes", Text(f"n/a ({gpu.processes_error})", style=theme.WARNING))
    parts.append(facts)
    parts.extend(trend_lines(history, view.name, gpu, width))
    mig = gpu.mig
    if gpu.partition is not None:
        parts.append(Text(f"Partition: {partition_summary(gpu.partition)}", style="bold"))
    elif mig is None:
        parts.append(Text("MIG: not supported by this GPU", style="dim"))
    else:
        mode = "on" if mig.current else "off"
        pending = (
            f" (pending {'on' if mig.pending else 'off'} until reset)" if mig.pending != mig.current else ""
        )
        parts.append(Text(f"MIG: {mode}{pending} · model {gpu.info.mig_model or '?'}", style="bold"))
        if mig_active(gpu):
            count, spans = mig_layout(gpu, ownership, view)
            parts.append(slice_bar(count, spans, width))
            for span in spans:
                if span.instance is not None:
                    cis = ", ".join(span.compute) or "no compute instance"
                    last = span.start + span.size - 1
                    where = f"slice {span.start}" if span.size == 1 else f"slices {span.start}-{last}"
                    parts.append(
                        Text(
                            f"  GI {span.instance} {span.profile}: {where}"
                            f" · compute instances: {cis} · {span.processes} process(es)",
                            style="dim",
                        )
                    )
    limited = sum(1 for p in gpu.processes if p.tenant_source == "limiter")
    # The live sample carries GPUs and processes only; the node's MPS daemons and limiter table
    # come from the agent's `config` op, which `gpuops plan` asks and this view does not poll.
    parts.append(
        Text(
            "MPS: not in the live sample (daemons, thread % and pinned memory come from the agent's "
            "config op, read by gpuops plan, not polled here)",
            style="dim",
        )
    )
    parts.append(
        Text(
            f"Limiter: {limited} process(es) attributed by the limiter's tenant table; its limits are "
            "in the agent's config op (gpuops plan), its usage is not reported by the node yet",
            style="dim",
        )
    )
    return RichGroup(*parts)  # type: ignore[arg-type]


class DetailScreen(ViewScreen):
    """Pushed over a view by Enter; esc goes back."""

    TITLE = "node"
    KEYS: ClassVar[tuple[Key, ...]] = (
        *TABLE_KEYS,
        Key("enter", "Enter", "show the GPU under the cursor: samples, MIG layout, processes"),
        Key("tab", "Tab", "switch between the GPU table and the process table", "switch_table"),
        Key("a", "a", "processes of all GPUs of the node, or of the selected GPU only", "all_processes"),
    )
    SORTS: ClassVar[dict[str, tuple[str, str]]] = {}
    FILTER_HINT = "matches processes: user, tenant, command, pid; !re hides matches"
    COLUMN_HELP: ClassVar[tuple[tuple[str, str], ...]] = (
        ("GPU", "the GPU's index on the node"),
        ("Model", "the GPU's model, short"),
        ("Owner", "the team owning the GPU"),
        ("Util", "GPU utilization (NVML); n/a on a MIG GPU (per-slice figures are in the layout)"),
        ("Memory", "memory in use of the GPU's"),
        ("Power", "power draw (the limit is in the panel)"),
        ("Temp", "GPU temperature"),
        ("SM clock", "SM clock"),
        ("Mem clock", "memory clock"),
        ("MIG", "MIG mode and how many GPU instances; AMD: partition modes, compute (logical GPUs) / memory"),
        ("Procs", "processes on the GPU; n/a where the node could not list them"),
        ("XID", "XID errors since the node's agent started listening; '-': not reported"),
        ("history", "the panel's sparklines: utilization, memory, power, temperature over the session"),
        ("MIG (processes)", "GPU instance / compute instance the process runs in"),
        ("PID", "process id on the node"),
        ("User", "unix user"),
        ("Tenant", "the team it counts for, and where that came from (limiter, user, group, owner)"),
        ("Command", "its command line, as the agent sends it"),
    )
    BINDINGS = screen_bindings(KEYS, SORTS)

    def __init__(self, node: str, gpu: int | None, view: str) -> None:
        super().__init__()
        self.node = node
        self.gpu_index = gpu
        self.all_processes = False
        self.view_name = view

    @property
    def title_text(self) -> str:
        gpu = f" / GPU {self.gpu_index}" if self.gpu_index is not None else ""
        return f"node {self.node}{gpu}"

    def compose_body(self) -> ComposeResult:
        with VerticalScroll(id="detail"):
            yield Static(id="node-header")
            yield LiveTable(GPU_COLUMNS, id="gpu-table", zebra=False)
            yield Static(id="gpu-panel")
            yield Static(id="proc-title")
            yield LiveTable(PROC_COLUMNS, id="proc-table", zebra=False)

    def main_widget(self) -> Widget | None:
        return self.query_one("#gpu-table", LiveTable)

    def on_resize(self) -> None:
        # The GPU panel is laid out for its width (the MIG layout, the sparklines): again once
        # the new width is known.
        self.call_after_refresh(self.redraw)

    def draw(self, state: FleetState) -> None:
        view = state.node(self.node)
        header = self.query_one("#node-header", Static)
        if view is None:
            header.update(Text(f"{self.node}: not in the fleet any more", style=theme.ERROR))
            return
        header.update(node_header(view, state.time))
        gpus = _gpus(view)
        if self.gpu_index is None and gpus:
            self.gpu_index = gpus[0].info.index
        rows: list[Row] = [(str(g.info.index), self._gpu_cells(view, g, state)) for g in gpus]
        table = self.query_one("#gpu-table", LiveTable)
        table.set_rows(rows)
        if self.gpu_index is not None:
            table.move_to_key(str(self.gpu_index))
        selected = find_gpu(view, self.gpu_index) if self.gpu_index is not None else None
        panel = self.query_one("#gpu-panel", Static)
        width = panel.size.width or max(40, self.size.width - 4)
        panel.update(gpu_panel(view, selected, state, width))
        self._processes(state, view)
        self.draw_bars()

    @staticmethod
    def _gpu_cells(view: NodeView, gpu: Gpu, state: FleetState) -> tuple[Cell, ...]:
        s = gpu.sample
        mig = "-"
        if gpu.mig is not None:
            mig = f"on ({len(gpu.mig.gpu_instances)} GI)" if gpu.mig.current else "off"
        elif gpu.partition is not None:
            mig = partition_column(gpu.partition)
        return (
            str(gpu.info.index),
            short_model(gpu.info.name),
            state.ownership.owner(view, gpu) or "-",
            fmt.percent(s.utilization_gpu_percent) if s else "-",
            fmt.memory_usage(s.memory_used_bytes, s.memory_total_bytes) if s else "-",
            fmt.watts(s.power_watts) if s else "-",
            fmt.celsius(s.temperature_celsius) if s else "-",
            fmt.mhz(s.sm_clock_mhz) if s else "-",
            fmt.mhz(s.memory_clock_mhz) if s else "-",
            mig,
            str(len(gpu.processes)) if not gpu.processes_error else "n/a",
            _xid_count(view, gpu),
        )

    def _processes(self, state: FleetState, view: NodeView) -> None:
        only = None if self.all_processes else self.gpu_index
        procs = process_rows(view, state.ownership, only)
        if self.filter is not None:
            flt = self.filter
            procs = tuple(
                p for p in procs if flt.matches(f"{p.pid} {p.user} {p.tenant} {p.command} gpu{p.gpu}")
            )
        where = "all GPUs" if only is None else f"GPU {only}"
        toggle = "selected GPU" if only is None else "all GPUs"
        title = Text(f"Processes on {where} ({len(procs)})", style="bold")
        title.append(f"   a: {toggle}", style="dim")
        self.query_one("#proc-title", Static).update(title)
        rows: list[Row] = []
        for p in procs:
            mig = "-" if p.instance is None else f"GI {p.instance} / CI {p.compute_instance}"
            rows.append(
                (
                    f"{p.gpu}/{p.pid}",
                    (
                        str(p.gpu),
                        mig,
                        str(p.pid),
                        p.user or "?",
                        Text(f"{p.tenant} ({p.tenant_source})"),
                        render.size(p.memory),
                        p.command,
                    ),
                )
            )
        self.query_one("#proc-table", LiveTable).set_rows(rows)

    @on(LiveTable.RowHighlighted, "#gpu-table")
    def _gpu_highlighted(self, event: LiveTable.RowHighlighted) -> None:
        if int(event.key) != self.gpu_index:
            self.gpu_index = int(event.key)
            if self.state is not None:
                self.show(self.state)

    def action_switch_table(self) -> None:
        gpus = self.query_one("#gpu-table", LiveTable)
        procs = self.query_one("#proc-table", LiveTable)
        (procs if gpus.has_focus else gpus).focus()

    def action_all_processes(self) -> None:
        self.all_processes = not self.all_processes
        self.redraw()
