"""Applying a plan, node by node (bounded concurrency), each node through its agent:

1. read the node again; with a saved plan, refuse the node if a GPU it changes is not as it was
   (fingerprints), saying what changed; what each GPU gets is worked out from the payloads against
   that state (`shown_node`), never taken from the plan's own lines;
2. stop MPS daemons of GPUs whose MIG layout changes (their devices go away);
3. MIG changes: one `mig_apply` request, each GPU a transaction on the node (old layout or new
   one, never between; refused with pids and users while processes are in the way unless forced);
   partition mode changes (AMD) likewise, one `partition_apply` request;
4. MPS daemons: one per GPU or per MIG device (devices read after the MIG change);
5. the limiter tenant table, rewritten once for the node from the lines of every GPU;
6. verify: read the node again and check each applied GPU has what was asked.

A node that fails or is unreachable does not stop the others; each node's result says what
changed, what was refused and why. Re-running converges: a finished node has nothing to do.
"""

from __future__ import annotations

import asyncio
import getpass
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from gpuops.core.mig.layout import layout_of
from gpuops.core.model import Gpu
from gpuops.core.protocol import (
    MigApplyReply,
    MigChange,
    MigResult,
    MpsChange,
    PartitionApplyReply,
    PartitionChange,
    PartitionResult,
)
from gpuops.core.tenant_table import TenantSpec
from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.fleet.session import NodeTarget, node_agent
from gpuops.fleet.ssh import SshError
from gpuops.plan.diff import (
    daemon_devices,
    gpu_fingerprint,
    live_summary,
    partition_modes,
    payload_actions,
    plan_node,
    show_layout,
    wanted_daemon,
    what_changed,
)
from gpuops.plan.live import NodeLive, read_node
from gpuops.plan.model import Action, GpuPlan, NodePlan
from gpuops.spec import Fleet

UNCHANGED, CHANGED, PARTIAL, REFUSED, FAILED = "unchanged", "changed", "partial", "refused", "failed"
NODE_TIMEOUT = 600.0
LOST = "closed"  # AgentClient's code for a session that ended under a request


@dataclass
class NodeResult:
    name: str
    status: str = UNCHANGED
    done: list[str] = field(default_factory=list)  # what changed
    refused: list[str] = field(default_factory=list)  # what was not done, and why
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.status in (UNCHANGED, CHANGED)

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.name,
            "status": self.status,
            "done": self.done,
            "refused": self.refused,
            "error": self.error,
        }


def holder_name() -> str:
    """Who holds a node's lock, for whoever finds it held."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"gpuops apply by {user}@{socket.gethostname()} (pid {os.getpid()})"


def stale_gpus(saved: NodePlan, live: NodeLive) -> list[str]:
    """What changed on the GPUs a saved plan touches, one line each; [] when it still holds."""
    by_index = {g.info.index: g for g in live.gpus}
    lines = []
    for planned in saved.gpus:
        if not (planned.changes or planned.has_payload):
            continue
        gpu = by_index.get(planned.index)
        if gpu is None or gpu.info.uuid != planned.uuid:
            lines.append(
                f"GPU {planned.index}: is {'gone' if gpu is None else gpu.info.uuid}, was {planned.uuid}"
            )
            continue
        if gpu_fingerprint(gpu, live) != planned.fingerprint:
            changed = what_changed(planned.live, live_summary(gpu, live)) or ["its state"]
            lines += [f"GPU {planned.index}: {c}" for c in changed]
    return lines


def shown_node(saved: NodePlan, live: NodeLive) -> NodePlan:
    """The node's plan with each GPU's lines rendered from its payloads against `live`: what they
    will do, whatever a saved file's own lines say (the file may have been edited)."""
    by_index = {g.info.index: g for g in live.gpus}
    gpus = []
    for planned in saved.gpus:
        gpu = by_index.get(planned.index)
        actions: tuple[Action, ...] = ()
        if gpu is not None and planned.has_payload and not planned.problems:
            actions = tuple(
                payload_actions(gpu, live, planned.mig, planned.mps, planned.limiter, planned.partition)
            )
        gpus.append(replace(planned, actions=actions))
    return replace(saved, gpus=tuple(gpus))


class _NodeApply:
    def __init__(self, client: AgentClient, live: NodeLive, plan: NodePlan, force: bool, holder: str) -> None:
        self.client = client
        self.live = live
        self.plan = plan
        self.force = force
        self.holder = holder
        self.result = NodeResult(live.name)
        self.failed: set[int] = set()  # GPUs refused or failed: nothing more is done to them

    def _refuse(self, index: int, text: str) -> None:
        self.failed.add(index)
        self.result.refused.append(f"GPU {index}: {text}")

    async def run(self) -> NodeResult:
        gpus = [g for g in self.plan.gpus if g.changes and not g.problems]
        for g in self.plan.gpus:
            for problem in g.problems:
                self._refuse(g.index, problem)
        if gpus:
            try:
                await self._stop_mps_for_mig(gpus)
                await self._mig(gpus)
                await self._partition(gpus)
                await self._mps(gpus)
                await self._limiter(gpus)
                await self._verify(gpus)
            except AgentError as exc:
                # The session is gone (agent killed, node rebooted, network cut): what the node was
                # doing is finished or undone by its journal when an agent next starts there.
                self.result.error = f"lost the agent during apply ({exc.message}); run apply again"
        r = self.result
        if r.refused or r.error:
            r.status = PARTIAL if r.done else (FAILED if r.error else REFUSED)
        else:
            r.status = CHANGED if r.done else UNCHANGED
        return r

    # -- MPS around MIG changes ------------------------------------------------------------------

    async def _stop_mps_for_mig(self, gpus: Sequence[GpuPlan]) -> None:
        by_index = {g.info.index: g for g in self.live.gpus}
        changes = []
        for plan in gpus:
            if plan.mig is None:
                continue
            for d in self.live.daemons_of(by_index[plan.index]):
                if d.running:
                    changes.append(MpsChange(d.gpu, d.device, False, d.pipe_directory, d.log_directory))
        if changes:
            await self._mps_request(changes, "stopped before the MIG change")

    async def _mps_request(self, changes: Sequence[MpsChange], why: str) -> None:
        try:
            reply = await self.client.mps_apply(changes, force=self.force, holder=self.holder)
        except AgentError as exc:
            if exc.code == LOST:
                raise
            for c in changes:
                self._refuse(c.gpu, f"MPS on {c.device}: {exc.message}")
            return
        for item in reply.results:
            gpu = next((c.gpu for c in changes if c.device == item.device), -1)
            if item.ok:
                if item.changed:
                    verb = "started/updated" if why == "" else why
                    self.result.done.append(f"GPU {gpu}: MPS daemon on {item.device} {verb}")
            else:
                self._refuse(gpu, f"MPS on {item.device}: {item.message or item.code}")

    # -- MIG layouts and partition modes: per-GPU transactions on the node ----------------------

    async def _mig(self, gpus: Sequence[GpuPlan]) -> None:
        changes = [g.mig for g in gpus if g.mig is not None and g.index not in self.failed]
        if changes:
            await self._transactions("MIG", self.client.mig_apply, changes, _mig_done)

    async def _partition(self, gpus: Sequence[GpuPlan]) -> None:
        changes = [g.partition for g in gpus if g.partition is not None and g.index not in self.failed]
        if changes:
            await self._transactions("partition", self.client.partition_apply, changes, _partition_done)

    async def _transactions(
        self,
        kind: str,
        send: Callable[..., Awaitable[MigApplyReply | PartitionApplyReply]],
        changes: Sequence[MigChange | PartitionChange],
        done: Callable[[Any], str],
    ) -> None:
        """One request of per-GPU changes, each a transaction on the node: what each did or why
        it was refused (node/transaction.py)."""
        try:
            reply = await send(changes, force=self.force, holder=self.holder)
        except AgentError as exc:
            if exc.code == LOST:
                raise
            for c in changes:
                self._refuse(c.gpu, f"{kind}: {exc.message}")
            return
        for note in reply.recovered:
            self.result.done.append(f"recovered: {note}")
        for item in reply.results:
            if item.ok:
                if item.changed:
                    text = f"GPU {item.gpu}: {done(item)} applied"
                    if item.stopped:
                        text += " (stopped " + ", ".join(str(p) for p in item.stopped) + ")"
                    self.result.done.append(text)
            else:
                self._refuse(item.gpu, f"{kind} {item.code}: {item.message}")

    # -- MPS -------------------------------------------------------------------------------------

    async def _mps(self, gpus: Sequence[GpuPlan]) -> None:
        todo = [g for g in gpus if g.mps is not None and g.index not in self.failed]
        if not todo:
            return
        sample = await self.client.sample() if any(g.mig is not None for g in todo) else self.live.sample
        assert sample is not None
        by_index = {g.info.index: g for g in sample.gpus}
        changes = []
        for plan in todo:
            assert plan.mps is not None
            gpu = by_index.get(plan.index)
            if gpu is None:
                self._refuse(plan.index, "is gone")
                continue
            for device in daemon_devices(gpu, plan.mps.per_instance):
                changes.append(plan.mps.change(gpu.info.index, device))
            wanted = set(daemon_devices(gpu, plan.mps.per_instance))
            for d in self.live.daemons_of(gpu):
                if d.device not in wanted and d.running and plan.mig is None:
                    changes.append(replace(plan.mps.change(gpu.info.index, d.device), enabled=False))
        if changes:
            await self._mps_request(changes, "")

    # -- limiter ---------------------------------------------------------------------------------

    async def _limiter(self, gpus: Sequence[GpuPlan]) -> None:
        wanted = {g.index: g.limiter for g in gpus if g.limiter is not None and g.index not in self.failed}
        if not wanted:
            return
        table = compose_table(self.live, wanted)
        try:
            reply = await self.client.limiter_apply(
                table, expect_generation=self.plan.limiter_generation, holder=self.holder
            )
        except AgentError as exc:
            if exc.code == LOST:
                raise
            for index in wanted:
                self._refuse(index, f"limiter table: {exc.message}")
            return
        if reply.changed:
            for index in sorted(wanted):
                self.result.done.append(
                    f"GPU {index}: limiter tenant lines written (generation {reply.generation})"
                )

    # -- verify ----------------------------------------------------------------------------------

    async def _verify(self, gpus: Sequence[GpuPlan]) -> None:
        applied = [g for g in gpus if g.index not in self.failed]
        if not applied:
            return
        after = await read_node(self.client, self.live.name)
        by_index = {g.info.index: g for g in after.gpus}
        for plan in applied:
            gpu = by_index.get(plan.index)
            if gpu is None:
                self._refuse(plan.index, "verify: the GPU is gone")
                continue
            for problem in verify_gpu(plan, gpu, after):
                self._refuse(plan.index, f"verify: {problem}")


def _mig_done(_result: MigResult) -> str:
    return "MIG layout"


def _partition_done(result: PartitionResult) -> str:
    return f"partition modes {result.compute_mode}/{result.memory_mode}"


def verify_gpu(plan: GpuPlan, gpu: Gpu, live: NodeLive) -> list[str]:
    """What is not as the plan asked on a GPU after apply."""
    problems = []
    if plan.mig is not None:
        want = plan.mig.layout
        have = layout_of(gpu)
        if have != want:
            problems.append(f"MIG layout is {show_layout(have, None)}, not the planned one")
    if plan.mps is not None and live.mps is not None:
        daemons = {d.device: d for d in live.daemons_of(gpu)}
        for device in daemon_devices(gpu, plan.mps.per_instance):
            want_d = wanted_daemon(plan.mps, device)
            have_d = daemons.get(device)
            have_settings = have_d.settings() if have_d is not None else {"running": False}
            if want_d["running"] != have_settings.get("running") or (
                want_d["running"] and have_settings != want_d
            ):
                problems.append(f"MPS daemon on {device} is not as planned")
    if plan.partition is not None:
        modes, asked = gpu.partition, plan.partition
        if modes is None:
            problems.append("the GPU has no partition modes")
        elif (asked.compute or modes.compute_mode, asked.memory or modes.memory_mode) != (
            modes.compute_mode,
            modes.memory_mode,
        ):
            problems.append(f"partition modes are {partition_modes(modes)}, not the planned ones")
    if plan.limiter is not None and live.lines_of(gpu) != sorted(plan.limiter, key=TenantSpec.sort_key):
        problems.append("the limiter lines for this GPU are not the planned ones")
    return problems


def compose_table(live: NodeLive, wanted: Mapping[int, Sequence[TenantSpec]]) -> tuple[TenantSpec, ...]:
    """The node's new tenant table: the wanted lines on the GPUs being changed, every other GPU's
    lines as they are; one line per (tenant, values), listing its GPUs by UUID (none: all GPUs)."""
    per_gpu: dict[str, Sequence[TenantSpec]] = {}
    for gpu in live.gpus:
        per_gpu[gpu.info.uuid] = wanted.get(gpu.info.index, live.lines_of(gpu))
    groups: dict[TenantSpec, list[str]] = {}
    for uuid, lines in per_gpu.items():
        for line in lines:
            groups.setdefault(replace(line, gpus=()), []).append(uuid)
    every = set(per_gpu)
    return tuple(
        replace(line, gpus=() if set(uuids) == every else tuple(sorted(uuids)))
        for line, uuids in sorted(groups.items(), key=lambda kv: (kv[0].name, sorted(kv[1])))
    )


async def apply_node(
    fleet: Fleet,
    target: NodeTarget,
    saved: NodePlan | None,
    *,
    force: bool = False,
    holder: str = "",
    handshakes: asyncio.Semaphore | None = None,
) -> NodeResult:
    """Apply fleet.yaml (or the saved plan of this node) to one node; never raises."""
    try:
        async with node_agent(target, handshakes) as client:
            live = await read_node(client, target.name)
            if saved is not None:
                if saved.error:
                    return NodeResult(target.name, FAILED, error=f"could not be planned: {saved.error}")
                stale = stale_gpus(saved, live)
                if stale:
                    return NodeResult(
                        target.name,
                        REFUSED,
                        refused=[f"the live state changed since the plan: {s}" for s in stale],
                    )
                plan = shown_node(saved, live)
            else:
                plan = plan_node(fleet, live)
            work = _NodeApply(client, live, plan, force, holder or holder_name())
            return await asyncio.wait_for(work.run(), NODE_TIMEOUT)
    except SshError as exc:
        return NodeResult(target.name, FAILED, error=f"unreachable: {exc.message}")
    except AgentError as exc:
        return NodeResult(target.name, FAILED, error=f"agent: {exc.message}")
    except TimeoutError:
        return NodeResult(target.name, FAILED, error=f"no answer within {NODE_TIMEOUT:.0f}s")
    except OSError as exc:
        return NodeResult(target.name, FAILED, error=f"network: {exc}")


async def apply_fleet(
    fleet: Fleet,
    targets: Sequence[NodeTarget],
    saved: dict[str, NodePlan] | None = None,
    *,
    force: bool = False,
    parallel: int = 10,
) -> list[NodeResult]:
    """Every node of `targets` (with a saved plan: only the nodes it changes), `parallel` at a time."""
    slots = asyncio.Semaphore(max(1, parallel))
    handshakes = asyncio.Semaphore(max(1, fleet.max_handshakes))
    holder = holder_name()

    async def one(target: NodeTarget) -> NodeResult:
        async with slots:
            plan = saved.get(target.name) if saved is not None else None
            return await apply_node(fleet, target, plan, force=force, holder=holder, handshakes=handshakes)

    chosen = [t for t in targets if saved is None or t.name in saved]
    return list(await asyncio.gather(*(one(t) for t in chosen)))
