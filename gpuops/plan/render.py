"""A plan for people: per node and GPU, `+ ~ -` lines, disruptive ones marked with the processes
they would stop; a summary line at the end (as terraform plan)."""

from __future__ import annotations

from rich.markup import escape

from gpuops.plan.model import ADD, CHANGE, REMOVE, GpuPlan, NodePlan, Plan

_STYLE = {ADD: "green", CHANGE: "yellow", REMOVE: "red"}


def plan_lines(plan: Plan, *, show_unchanged: bool = False, summary: bool = True) -> list[str]:
    """Rich-markup lines of the plan (summary=False: without the closing summary line, for a
    command that gives its own verdict)."""
    lines: list[str] = []
    for node in plan.nodes:
        lines += node_lines(node, show_unchanged=show_unchanged)
    if summary:
        lines.append(summary_line(plan))
    return lines


def node_lines(node: NodePlan, *, show_unchanged: bool = False) -> list[str]:
    if node.error:
        return [f"[bold]node {escape(node.name)}[/]: [red]cannot plan: {escape(node.error)}[/]"]
    lines = [f"  [red]error:[/] {escape(p)}" for p in node.problems]
    for gpu in node.gpus:
        if gpu.changes or gpu.problems or gpu.notes:
            lines += gpu_lines(gpu)
    if not lines and not show_unchanged:
        return []
    if not lines:
        lines = ["  no changes"]
    return [f"[bold]node {escape(node.name)}[/]", *lines]


def gpu_lines(gpu: GpuPlan) -> list[str]:
    lines = [f"  GPU {gpu.index}  {escape(gpu.name)}  [dim]{escape(gpu.uuid)}[/]"]
    for problem in gpu.problems:
        lines.append(f"    [red]error:[/] {escape(problem)}")
    for note in gpu.notes:
        lines.append(f"    [yellow]note:[/] {escape(note)}")
    for action in gpu.actions:
        style = _STYLE[action.marker]
        line = f"    [{style}]{action.marker} {escape(action.text)}[/]"
        if action.disruptive:
            line += "  [bold red]! disruptive[/]"
            if action.processes:
                line += ": stops " + ", ".join(escape(str(p)) for p in action.processes)
        lines.append(line)
    return lines


def summary_line(plan: Plan) -> str:
    c = plan.counts()
    failed = [n for n in plan.nodes if n.failed]
    unread = [n for n in failed if n.error]
    failed = [n for n in failed if not n.error]
    if not plan.changes and unread:
        # docs/cli.md: nothing is said about nodes that could not be read, "no changes" least.
        text = (
            f"No changes on the {len(plan.nodes) - len(unread)} node(s) read; "
            f"[red]{len(unread)} node(s) could not be read[/]: the plan is incomplete."
        )
    elif not plan.changes:
        text = "No changes: the live state matches fleet.yaml."
    else:
        text = (
            f"Plan: {c['add']} to add, {c['change']} to change, {c['remove']} to remove"
            f" on {c['gpus']} GPU(s) of {c['nodes']} node(s)"
        )
        if c["disruptive"]:
            procs = {
                (n.name, p.pid)
                for n in plan.nodes
                for g in n.gpus
                for a in g.actions
                if a.disruptive
                for p in a.processes
            }
            text += f"; [bold red]{c['disruptive']} disruptive[/]"
            if procs:
                text += f" ({len(procs)} process(es) would be stopped: needs --force)"
        text += "."
        if unread:
            text += f" [red]{len(unread)} node(s) could not be read[/]: the plan is incomplete."
    if failed:
        text += f" [red]{len(failed)} node(s) with errors.[/]"
    return text
