"""Rules that span fields of fleet.yaml: unique names, references that must resolve, ownership.

Each check is `check(fleet, ctx)` and reports through `ctx.report(path, message, hint)`, with
`path` the data path in `fleet` (``("nodes", 3, "owner")``); the context maps it back to the file.
Checks run even when other parts of the file are wrong: entries that failed field validation are
left out of `fleet`, and `ctx` translates list positions back to the file's. Add new checks to
`CHECKS`.
"""

from __future__ import annotations

import ipaddress
from typing import Callable, Sequence

from gpuops.spec.carve_checks import check_carve
from gpuops.spec.errors import DataPath, SpecIssue, format_path, show
from gpuops.spec.model import DEFAULT_PORT, NO_JUMP, Fleet
from gpuops.spec.selectors import SelectorError, parse_gpu_indices
from gpuops.spec.source import Document
from gpuops.spec.types import closest


class CheckContext:
    """Where checks report. `kept` maps a list (by its path in the file) to the positions, in the
    file, of the entries that were kept in the checked fleet (absent: nothing left out)."""

    def __init__(self, doc: Document, kept: dict[DataPath, list[int]] | None = None) -> None:
        self.doc = doc
        self.kept = kept or {}
        self.issues: list[SpecIssue] = []

    def original(self, path: DataPath) -> DataPath:
        """A path in the checked fleet -> the same place in the file."""
        if not self.kept:
            return path
        out: DataPath = ()
        for elem in path:
            positions = self.kept.get(out)
            if isinstance(elem, int) and positions is not None and 0 <= elem < len(positions):
                elem = positions[elem]
            out = (*out, elem)
        return out

    def written(self, path: DataPath) -> bool:
        return self.doc.is_written(self.original(path))

    def report(self, path: DataPath, message: str, hint: str = "", *, at_key: bool = False) -> None:
        self.issues.append(self.doc.issue(self.original(path), message, hint, at_key=at_key))

    def ref(self, path: DataPath, *, at_key: bool = False) -> str:
        """'teams.vision.users[0] at line 5': another place in the file, for messages."""
        original = self.original(path)
        line, _ = self.doc.position(original, at_key=at_key)
        return f"{format_path(original)} at line {line}" if line else format_path(original)


Check = Callable[[Fleet, CheckContext], None]


def check_unique_nodes(fleet: Fleet, ctx: CheckContext) -> None:
    names: dict[str, int] = {}
    targets: dict[tuple[str, str, int], int] = {}
    for i, node in enumerate(fleet.nodes):
        name_path: DataPath = (
            ("nodes", i, "name") if ctx.written(("nodes", i, "name")) else ("nodes", i, "host")
        )
        if node.name in names:
            ctx.report(
                name_path,
                f"duplicate node name {show(node.name)}",
                f"first used by {ctx.ref(('nodes', names[node.name]))}",
            )
        else:
            names[node.name] = i
        jump = _jump_ref(fleet, i) or ""
        port = node.port if node.port is not None else _node_ssh(fleet, i, "port")
        key = (jump, _canonical_host(node.host), port if isinstance(port, int) else DEFAULT_PORT)
        if key in targets:
            via = f" through {jump}" if jump else ""
            ctx.report(
                ("nodes", i, "host"),
                f"{node.host}:{key[2]}{via} is already listed as {ctx.ref(('nodes', targets[key]))}",
                "list each machine once",
            )
        else:
            targets[key] = i


def _canonical_host(host: str) -> str:
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host.lower().rstrip(".")


def _node_ssh(fleet: Fleet, i: int, name: str) -> object:
    node = fleet.nodes[i]
    if node.ssh is not None and getattr(node.ssh, name) is not None:
        return getattr(node.ssh, name)
    return getattr(fleet.ssh, name)


def _jump_ref(fleet: Fleet, i: int) -> str | None:
    ref = _node_ssh(fleet, i, "jump_host")
    return None if ref is None or ref == NO_JUMP else str(ref)


def check_owners(fleet: Fleet, ctx: CheckContext) -> None:
    teams = list(fleet.teams)

    def check(team: str, path: DataPath) -> None:
        if team not in fleet.teams:
            hint = closest(team, teams) or (
                f"define it under teams: (teams: {', '.join(teams)})" if teams else "define it under teams:"
            )
            ctx.report(path, f"no team named {show(team)}", hint)

    for i, node in enumerate(fleet.nodes):
        if node.owner is not None:
            check(node.owner, ("nodes", i, "owner"))
        for key, team in node.gpus.items():
            check(team, ("nodes", i, "gpus", key))


def check_team_members(fleet: Fleet, ctx: CheckContext) -> None:
    for field in ("users", "groups"):
        kind = field[:-1]
        seen: dict[str, tuple[str, int]] = {}
        for team_name, team in fleet.teams.items():
            members: Sequence[str] = getattr(team, field)
            for j, member in enumerate(members):
                path: DataPath = ("teams", team_name, field, j)
                if member not in seen:
                    seen[member] = (team_name, j)
                    continue
                first_team, first_j = seen[member]
                first = ctx.ref(("teams", first_team, field, first_j))
                if first_team == team_name:
                    ctx.report(path, f"{kind} {show(member)} is listed twice", f"first at {first}")
                else:
                    ctx.report(
                        path,
                        f"{kind} {show(member)} is already in team {show(first_team)} ({first})",
                        f"a {kind} belongs to one team",
                    )


def check_gpu_ranges(fleet: Fleet, ctx: CheckContext) -> None:
    for i, node in enumerate(fleet.nodes):
        owned_by: dict[int, str] = {}
        for key in node.gpus:
            path: DataPath = ("nodes", i, "gpus", key)
            try:
                indices = parse_gpu_indices(key)
            except SelectorError as exc:  # only when the fleet was built without validation
                ctx.report(path, str(exc), at_key=True)
                continue
            overlap = sorted(index for index in indices if index in owned_by)
            if overlap:
                first_key = owned_by[overlap[0]]
                ctx.report(
                    path,
                    f"GPU {overlap[0]} is already given an owner by {show(first_key)} "
                    f"({ctx.ref(('nodes', i, 'gpus', first_key), at_key=True)})",
                    "each GPU may appear in one key",
                    at_key=True,
                )
            for index in indices:
                owned_by.setdefault(index, key)


def check_ssh_references(fleet: Fleet, ctx: CheckContext) -> None:
    names = list(fleet.jump_hosts)

    def check(ref: str | None, path: DataPath) -> None:
        if ref is None or ref == NO_JUMP or ref in fleet.jump_hosts or "@" in ref or ":" in ref:
            return
        hint = closest(ref, names) or "define it under jump_hosts:, or write user@host:port (or none)"
        ctx.report(path, f"no jump host named {show(ref)}", hint)

    check(fleet.ssh.jump_host, ("ssh", "jump_host"))
    for i, node in enumerate(fleet.nodes):
        if node.ssh is None:
            continue
        check(node.ssh.jump_host, ("nodes", i, "ssh", "jump_host"))
        for name in ("port", "user"):
            if getattr(node, name) is not None and getattr(node.ssh, name) is not None:
                ctx.report(
                    ("nodes", i, "ssh", name),
                    f"{name} is given twice, here and as {ctx.ref(('nodes', i, name))}",
                    "keep one of them",
                    at_key=True,
                )


# Shares written by `gpuops rebalance` are rounded up to 4 decimals so that each gives back its
# whole units of GPU time; their sum may pass 100% by that rounding.
SHARE_ROUNDING = 0.01


def check_pools(fleet: Fleet, ctx: CheckContext) -> None:
    teams = list(fleet.teams)
    for name, pool in fleet.pools.items():
        total = 0.0
        for team, guarantee in pool.guarantees.items():
            total += guarantee.share
            if team not in fleet.teams:
                hint = closest(team, teams) or "define it under teams:"
                ctx.report(
                    ("pools", name, "guarantees", team), f"no team named {show(team)}", hint, at_key=True
                )
        if total > 100.0 + SHARE_ROUNDING:
            ctx.report(
                ("pools", name, "guarantees"),
                f"the guarantees add up to {total:g}% of the pool",
                "at most 100%: lower some shares, or add GPUs to the pool and recompute them",
                at_key=True,
            )
    _check_pool_overlap(fleet, ctx)
    for i, entry in enumerate(fleet.carve):
        if entry.pool is not None and entry.pool not in fleet.pools:
            hint = closest(entry.pool, list(fleet.pools)) or "define it under pools:, or remove pool:"
            ctx.report(("carve", i, "pool"), f"no pool named {show(entry.pool)}", hint)


def _check_pool_overlap(fleet: Fleet, ctx: CheckContext) -> None:
    """A GPU is in one pool: two pools' selections naming the same GPUs of a node are an error
    (selections by UUID or model are only known at plan time and are not compared here)."""
    claimed: dict[str, list[tuple[frozenset[int] | None, DataPath]]] = {}
    for name, pool in fleet.pools.items():
        for j, sel in enumerate(pool.gpus):
            path: DataPath = ("pools", name, "gpus", j)
            if sel.gpus is not None and (sel.gpus.uuids is not None or sel.gpus.model is not None):
                continue
            try:
                indices = parse_gpu_indices(sel.gpus.indices) if sel.gpus and sel.gpus.indices else None
                nodes = fleet.nodes_matching(sel.nodes)
            except SelectorError as exc:
                ctx.report(path, str(exc))
                continue
            reported = False
            for node in nodes:
                for other, where in claimed.get(node.name, []):
                    if reported or where[1] == name:
                        continue
                    if other is None or indices is None or other & indices:
                        reported = True
                        ctx.report(
                            path,
                            f"GPUs of node {show(node.name)} are already in pool {show(where[1])} "
                            f"({ctx.ref(where)})",
                            "a GPU belongs to one pool",
                        )
                claimed.setdefault(node.name, []).append((indices, path))


CHECKS: list[Check] = [
    check_unique_nodes,
    check_owners,
    check_team_members,
    check_gpu_ranges,
    check_pools,
    check_ssh_references,
    check_carve,
]


def run_checks(fleet: Fleet, ctx: CheckContext) -> list[SpecIssue]:
    for check in CHECKS:
        check(fleet, ctx)
    return ctx.issues
