"""Making a plan: what fleet.yaml's `carve:` wants (spec.Fleet.desired_for) against what each
node has (plan/live.py), GPU by GPU.

Per GPU, three independent kinds of change:
- MIG: the target layout (the solver's explicit placements, with compute instances) against the
  live one. Disruptive: a mode change, or instances destroyed; the processes on what goes away
  are listed (the node refuses them again at apply time unless forced).
- MPS: one control daemon per GPU, or per MIG device when MIG is on; its default thread
  percentage, pinned memory limit and per-tenant values. Disruptive: stopping or restarting a
  daemon whose servers have clients (new defaults reach only new servers).
- limiter: the tenant lines that apply to the GPU. Never disruptive: running programs read the
  new table within a second.
- partition (AMD Instinct): the compute and memory partition modes. Always disruptive: the
  driver re-lays the whole GPU, which must be idle; its processes are listed (the node refuses
  them at apply time unless forced).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gpuops.core.mig.catalog import MigModel, find_model
from gpuops.core.mig.layout import InstanceSpec, MigLayout, disrupted_processes, fingerprint, layout_of
from gpuops.core.mig.placement import Placement, solve_keeping
from gpuops.core.model import Gpu, GpuProcess, PartitionState
from gpuops.core.partition_catalog import find_partition_model
from gpuops.core.protocol import MigChange, MpsSettings, MpsTenant, PartitionChange
from gpuops.core.tenant_table import TenantSpec
from gpuops.core.units import format_bytes, format_percent
from gpuops.plan.live import MpsDaemon, NodeLive, mps_threads
from gpuops.plan.model import (
    ADD,
    CHANGE,
    LIMITER,
    MIG,
    MPS,
    PARTITION,
    REMOVE,
    Action,
    GpuPlan,
    NodePlan,
    Plan,
    Proc,
    state_fingerprint,
)
from gpuops.spec import Fleet
from gpuops.spec.desired import DesiredMps
from gpuops.spec.desired_gpu import DesiredGpu

# ---- showing things ------------------------------------------------------------------------------


def _model(gpu: Gpu) -> MigModel | None:
    return find_model(gpu.info.mig_model or gpu.info.name)


def show_instance(spec: InstanceSpec, model: MigModel | None) -> str:
    """'3g.40gb@4', with the compute split when it is not the default full CI: '3g.40gb@4[1c,2c]'."""
    profile = model.find_profile(spec.profile_id) if model is not None else None
    if profile is None:
        return f"profile {spec.profile_id}@{spec.start}"
    text = f"{profile.name}@{spec.start}"
    default = profile.default_compute_profile.id
    if spec.compute and spec.compute != (default,):
        names = []
        for ci in spec.compute:
            found = [cp for cp in profile.compute_profiles if cp.id == ci]
            names.append(found[0].name.split(".")[0] if found else str(ci))
        text += "[" + ",".join(names) + "]"
    elif not spec.compute:
        text += "[no CI]"
    return text


def show_layout(layout: MigLayout | None, model: MigModel | None) -> str:
    if layout is None:
        return "no MIG"
    if not layout.enabled:
        return "MIG off"
    if not layout.instances:
        return "MIG on, no instances"
    return ", ".join(show_instance(i, model) for i in layout.instances)


def show_line(t: TenantSpec) -> str:
    """'vision: memory 20GiB, compute 30%, fixed-share, online'."""
    parts = [f"memory {format_bytes(t.memory)}" if t.memory is not None else "memory uncapped"]
    parts.append(f"compute {format_percent(t.compute)}" if t.compute is not None else "no compute share")
    parts += [t.effective_policy(), t.klass]
    return f"{t.name}: " + ", ".join(parts)


def _values(t: TenantSpec) -> str:
    return show_line(t).split(": ", 1)[1]


def _mps_values(atp: int | None, pinned: int | None) -> str:
    threads = f"threads {atp}%" if atp is not None else "threads 100%"
    memory = f"pinned {format_bytes(pinned)}" if pinned is not None else "no pinned limit"
    return f"{threads}, {memory}"


def _procs(processes: Sequence[GpuProcess]) -> tuple[Proc, ...]:
    return tuple(Proc(p.pid, p.user, p.command.split(" ")[0] if p.command else "") for p in processes)


# ---- the live state a GPU's plan is made from ---------------------------------------------------


def live_summary(gpu: Gpu, live: NodeLive) -> dict[str, Any]:
    """What `apply --plan` compares, in words people read when it changed."""
    model = _model(gpu)
    summary = {
        "mig": show_layout(layout_of(gpu), model) + (" (mode change pending)" if _pending(gpu) else ""),
        "processes": [f"{p.pid} ({p.user or '?'})" for p in sorted(gpu.processes, key=lambda p: p.pid)],
        "mps": {d.device: d.settings() for d in live.daemons_of(gpu)},
        "limiter": [show_line(t) for t in live.lines_of(gpu)],
    }
    if gpu.partition is not None:  # only where there are modes: NVIDIA GPUs' summaries as before
        summary["partition"] = partition_modes(gpu.partition)
    return summary


def partition_modes(state: PartitionState) -> str:
    """ "SPX/NPS1": the modes as a plan's `expect` holds them (node/partition_apply.modes_text)."""
    return f"{state.compute_mode or '?'}/{state.memory_mode or '?'}"


def _pending(gpu: Gpu) -> bool:
    return gpu.mig is not None and gpu.mig.pending != gpu.mig.current


def gpu_fingerprint(gpu: Gpu, live: NodeLive) -> str:
    """What a saved plan for this GPU was made from. Not its processes: jobs come and go; the node
    refuses a MIG change that would stop a process the plan did not list (`known_pids`)."""
    layout = layout_of(gpu)
    state: dict[str, Any] = {
        "uuid": gpu.info.uuid,
        "mig": layout.to_json() if layout is not None else None,
        "pending": _pending(gpu),
        "mps": [d.settings() for d in live.daemons_of(gpu)],
        # as the 5-tuples plans were first fingerprinted with: saved plans stay fresh
        "limiter": [[t.name, t.memory, t.compute, t.policy, t.klass] for t in live.lines_of(gpu)],
    }
    if gpu.partition is not None:  # NVIDIA GPUs' fingerprints stay what saved plans hold
        state["partition"] = partition_modes(gpu.partition)
    return state_fingerprint(state)


def what_changed(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """The differences between two live summaries (what fingerprints cover), one line each."""
    lines = []
    labels = {
        "mig": "MIG layout",
        "mps": "MPS daemons",
        "limiter": "limiter lines",
        "partition": "partition modes",
    }
    for key, label in labels.items():
        if before.get(key) != after.get(key):
            lines.append(f"{label}: was {_words(before.get(key))}, now {_words(after.get(key))}")
    return lines


def _words(value: Any) -> str:
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) or "none"
    if isinstance(value, dict):
        return "; ".join(f"{k} {v}" for k, v in value.items()) or "none"
    return str(value)


# ---- MIG -----------------------------------------------------------------------------------------


def target_layout(desired: DesiredGpu, live: MigLayout, gpu: Gpu | None = None) -> MigLayout | None:
    """The layout `desired.mig` asks for on this GPU; None when it cannot be placed. A mode-only
    mig: keeps the live instances. Counts (no placements) on a GPU already in MIG mode are met
    by the layout that stops the fewest processes (`gpu` says which run where), then removes the
    fewest live instances, of all valid layouts; explicit placements stay as asked."""
    mig = desired.mig
    assert mig is not None
    if not mig.enabled:
        return MigLayout(False)
    if mig.keeps_instances:
        return live if live.enabled else MigLayout(True)
    solved = desired.solved_layout
    if solved is None or not solved.ok:
        return None
    wanted = solved.layout()
    if mig.placements is not None or not live.enabled or not live.instances or gpu is None:
        return wanted
    return _keeping(wanted, live, gpu) or wanted


def _keeping(wanted: MigLayout, live: MigLayout, gpu: Gpu) -> MigLayout | None:
    """`wanted`'s instances placed to keep the most of `live` (core.mig.placement.solve_keeping);
    None where the GPU's model is not in the catalog."""
    model = _model(gpu)
    if model is None:
        return None
    split = {spec.profile_id: spec.compute for spec in wanted.instances}  # one split per profile
    # An instance with another compute split is recreated whatever its place: not a candidate.
    stays = [spec for spec in live.instances if split.get(spec.profile_id) == spec.compute]
    placements = []
    for spec in stays:
        gi = model.find_profile(spec.profile_id)
        if gi is None:
            return None
        placements.append(Placement(gi.name, gi.id, spec.start, gi.memory_slices))
    counts: dict[str | int, int] = {}
    for spec in wanted.instances:
        counts[spec.profile_id] = counts.get(spec.profile_id, 0) + 1
    processes = [len(_on_instance(gpu, spec)) for spec in stays]
    result = solve_keeping(model, counts, placements, processes)
    if not result.ok:
        return None
    return MigLayout(
        True, tuple(InstanceSpec(p.profile_id, p.start, split[p.profile_id]) for p in result.placements)
    ).normalized()


def mig_actions(gpu: Gpu, old: MigLayout, new: MigLayout) -> list[Action]:
    model = _model(gpu)
    actions: list[Action] = []
    victims = _procs(disrupted_processes(gpu, old, new))
    if old.enabled != new.enabled or _pending(gpu):
        word = "on" if new.enabled else "off"
        actions.append(
            Action(MIG, CHANGE, f"MIG mode {'on' if old.enabled else 'off'} -> {word}", True, victims)
        )
    if old.enabled:
        gone = [i for i in old.instances if not new.enabled or i not in new.instances]
        for spec in gone:
            on_it = _procs(_on_instance(gpu, spec))
            actions.append(Action(MIG, REMOVE, f"instance {show_instance(spec, model)}", True, on_it))
    if new.enabled:
        for spec in new.instances:
            if not old.enabled or spec not in old.instances:
                actions.append(Action(MIG, ADD, f"instance {show_instance(spec, model)}"))
    return actions


def _on_instance(gpu: Gpu, spec: InstanceSpec) -> list[GpuProcess]:
    if gpu.mig is None:
        return []
    ids = {
        gi.id for gi in gpu.mig.gpu_instances if (gi.profile_id, gi.start) == (spec.profile_id, spec.start)
    }
    return [p for p in gpu.processes if p.gpu_instance_id in ids]


# ---- MPS -----------------------------------------------------------------------------------------


def mps_payload(fleet: Fleet, mps: DesiredMps, per_instance: bool) -> MpsSettings:
    """What apply sends for each daemon of the GPU (devices are resolved at apply time, after any
    MIG change has made the MIG devices)."""
    tenants = []
    for t in mps.per_tenant:
        values = mps.for_tenant(t.name)
        team = fleet.teams.get(t.name)
        tenants.append(
            MpsTenant(
                name=t.name,
                users=tuple(team.users) if team is not None else (),
                active_thread_percentage=values.active_thread_percentage,
                pinned_memory_limit=values.pinned_memory_limit,
            )
        )
    return MpsSettings(
        enabled=mps.enabled,
        per_instance=per_instance,
        pipe_directory=mps.pipe_directory,
        log_directory=mps.log_directory,
        active_thread_percentage=mps.active_thread_percentage,
        pinned_memory_limit=mps.pinned_memory_limit,
        tenants=tuple(tenants),
    )


def wanted_daemon(payload: MpsSettings, device: str) -> dict[str, Any]:
    """MpsDaemon.settings() of the daemon `payload` wants on `device`."""
    return {
        "running": payload.enabled,
        "pipe_directory": f"{payload.pipe_directory}/{device}",
        "active_thread_percentage": mps_threads(payload.active_thread_percentage),
        "pinned_memory_limit": payload.pinned_memory_limit,
        "tenants": {
            t.name: {
                "active_thread_percentage": mps_threads(t.active_thread_percentage),
                "pinned_memory_limit": t.pinned_memory_limit,
            }
            for t in sorted(payload.tenants, key=lambda t: t.name)
        },
    }


def mig_devices(gpu: Gpu) -> list[str]:
    """The MIG device UUIDs (one per compute instance) of a GPU, in placement order."""
    if gpu.mig is None or not gpu.mig.current:
        return []
    devices = []
    for gi in sorted(gpu.mig.gpu_instances, key=lambda g: g.start):
        for ci in sorted(gi.compute_instances, key=lambda c: c.start):
            if ci.uuid:
                devices.append(ci.uuid)
    return devices


def daemon_devices(gpu: Gpu, per_instance: bool) -> list[str]:
    return mig_devices(gpu) if per_instance else [gpu.info.uuid]


def _mps_diff(
    payload: MpsSettings,
    devices: Sequence[str],
    daemons: Sequence[MpsDaemon],
    users: dict[int, GpuProcess],
) -> list[Action]:
    actions = []
    by_device = {d.device: d for d in daemons}
    for device in devices:
        want = wanted_daemon(payload, device)
        have = by_device.get(device)
        values = _mps_values(want["active_thread_percentage"], want["pinned_memory_limit"])
        if have is None or not have.running:
            if want["running"]:
                tenants = f"; per tenant: {', '.join(want['tenants'])}" if want["tenants"] else ""
                actions.append(Action(MPS, ADD, f"MPS daemon on {device} ({values}{tenants})"))
            continue
        clients = _procs([users.get(pid) or GpuProcess(pid, 0) for pid in have.clients])
        if not want["running"]:
            actions.append(Action(MPS, REMOVE, f"MPS daemon on {device}", bool(clients), clients))
            continue
        if have.settings() != want:
            before = _mps_values(have.active_thread_percentage, have.pinned_memory_limit)
            text = f"MPS daemon on {device}: {before} -> {values}"
            if have.tenants != want["tenants"]:
                text += f"; tenants {sorted(want['tenants']) or 'none'}"
            actions.append(Action(MPS, CHANGE, text, bool(clients), clients))
    for device, have in by_device.items():
        if device not in devices and have.running:
            clients = _procs([users.get(pid) or GpuProcess(pid, 0) for pid in have.clients])
            actions.append(Action(MPS, REMOVE, f"MPS daemon on {device} (device goes away)", True, clients))
    return actions


# ---- limiter -------------------------------------------------------------------------------------


def desired_lines(desired: DesiredGpu) -> list[TenantSpec] | None:
    """The GPU's limiter lines fleet.yaml wants (None: leave them; []: none)."""
    if desired.limiter is None:
        return None
    return sorted(desired.limiter.tenant_specs(), key=TenantSpec.sort_key)


def limiter_actions(old: Sequence[TenantSpec], new: Sequence[TenantSpec]) -> list[Action]:
    before = {t.name: t for t in old}
    after = {t.name: t for t in new}
    actions = []
    for name in sorted(set(before) | set(after)):
        if name not in after:
            actions.append(Action(LIMITER, REMOVE, f"limiter tenant {show_line(before[name])}"))
        elif name not in before:
            actions.append(Action(LIMITER, ADD, f"limiter tenant {show_line(after[name])}"))
        elif before[name] != after[name]:
            actions.append(
                Action(
                    LIMITER,
                    CHANGE,
                    f"limiter tenant {show_line(before[name])} -> {_values(after[name])}",
                )
            )
    return actions


# ---- partition modes -----------------------------------------------------------------------------


def partition_actions(gpu: Gpu, payload: PartitionChange) -> list[Action]:
    """One `~` line per mode that changes; disruptive, with every process of the GPU (a
    partition change needs the whole GPU idle)."""
    live = gpu.partition
    if live is None:  # the node refuses the change, and says so
        return [Action(PARTITION, CHANGE, "partition modes on a GPU without them", True)]
    victims = _procs(gpu.processes)
    actions = []
    if payload.memory is not None and payload.memory != live.memory_mode:
        text = f"memory partition {live.memory_mode or '?'} -> {payload.memory}"
        actions.append(Action(PARTITION, CHANGE, text, True, victims))
    if payload.compute is not None and payload.compute != live.compute_mode:
        model = find_partition_model(gpu.info.name)
        count = model.compute.get(payload.compute) if model is not None else None
        made = f" ({count} logical GPU{'s' if count != 1 else ''})" if count else ""
        text = f"compute partition {live.compute_mode or '?'} -> {payload.compute}{made}"
        actions.append(Action(PARTITION, CHANGE, text, True, victims))
    return actions


def _partition_payload(gpu: Gpu, desired: DesiredGpu, problems: list[str]) -> PartitionChange | None:
    want = desired.partition
    assert want is not None
    info, live = gpu.info, gpu.partition
    if live is None:
        problems.append(f"{want.location}: GPU {info.index} ({info.name}) has no partition modes")
        return None
    for key, mode, accepted in (
        ("compute", want.compute, live.compute_modes),
        ("memory", want.memory, live.memory_modes),
    ):
        if mode is not None and accepted and mode not in accepted:
            problems.append(
                f"{want.location}: GPU {info.index} ({info.name}) takes {key} modes "
                f"{'/'.join(accepted)}, not {mode}"
            )
    if problems:
        return None
    compute = want.compute if want.compute not in (None, live.compute_mode) else None
    memory = want.memory if want.memory not in (None, live.memory_mode) else None
    if compute is None and memory is None:
        return None
    pids = tuple(sorted(p.pid for p in gpu.processes))
    return PartitionChange(info.index, compute, memory, partition_modes(live), pids)


# ---- per GPU, node, fleet ------------------------------------------------------------------------


def payload_actions(
    gpu: Gpu,
    live: NodeLive,
    mig: MigChange | None,
    mps: MpsSettings | None,
    limiter: Sequence[TenantSpec] | None,
    partition: PartitionChange | None = None,
) -> list[Action]:
    """The plan's lines for these payloads against the GPU as it is now. A plan made here and a
    saved plan being applied both show this, so what is shown is what the payloads will do."""
    actions: list[Action] = []
    old = layout_of(gpu)
    new = old
    if mig is not None:
        # A GPU without MIG is shown as MIG off: the node refuses the change, and says so.
        new = mig.layout
        actions += mig_actions(gpu, old if old is not None else MigLayout(False), new)
    if mps is not None:
        users = {p.pid: p for p in gpu.processes}
        if mig is not None and mps.per_instance:
            # The MIG devices are made by the apply; their daemons are started after it.
            for d in live.daemons_of(gpu):
                if d.running:
                    clients = _procs([users.get(pid) or GpuProcess(pid, 0) for pid in d.clients])
                    actions.append(
                        Action(MPS, REMOVE, f"MPS daemon on {d.device} (MIG change)", True, clients)
                    )
            if mps.enabled:
                n = len(new.instances) if new is not None else 0
                values = _mps_values(mps.active_thread_percentage, mps.pinned_memory_limit)
                actions.append(Action(MPS, ADD, f"MPS daemon on each of the {n} new MIG devices ({values})"))
        else:
            devices = daemon_devices(gpu, mps.per_instance)
            actions += _mps_diff(mps, devices, live.daemons_of(gpu), users)
    if limiter is not None:
        actions += limiter_actions(live.lines_of(gpu), sorted(limiter, key=TenantSpec.sort_key))
    if partition is not None:
        actions += partition_actions(gpu, partition)
    return actions


def plan_gpu(fleet: Fleet, live: NodeLive, gpu: Gpu) -> GpuPlan:
    info = gpu.info
    old = layout_of(gpu)
    desired = fleet.desired_for(
        live.name,
        info.index,
        info.uuid,
        info.mig_model or info.name,
        mig_mode=old.enabled if old is not None else None,
        memory_total=info.memory_total_bytes if isinstance(info.memory_total_bytes, int) else None,
        driver_memory=info.driver_memory,
    )
    problems = [str(p) for p in desired.problems]
    mig_payload: MigChange | None = None
    new = old
    if desired.mig is not None and not problems:
        if old is None:
            if desired.mig.enabled:
                problems.append(
                    f"{desired.mig.location}: GPU {info.index} ({info.name}) does not support MIG"
                )
        else:
            target = target_layout(desired, old, gpu)
            if target is None:
                reason = desired.solved_layout.reason if desired.solved_layout is not None else "no layout"
                problems.append(f"{desired.mig.location}: GPU {info.index} ({info.name}): {reason}")
            elif target != old or _pending(gpu):
                victims = sorted({p.pid for a in mig_actions(gpu, old, target) for p in a.processes})
                mig_payload = MigChange(info.index, target, fingerprint(gpu), tuple(victims))
                new = target
    mps: MpsSettings | None = None
    if desired.mps is not None and not problems:
        if live.mps is None:
            problems.append(f"node {live.name}: its agent cannot manage MPS (update gpuops on the node)")
        else:
            mps = mps_payload(fleet, desired.mps, bool(new is not None and new.enabled))
    limiter: tuple[TenantSpec, ...] | None = None
    wanted_lines = desired_lines(desired)
    if wanted_lines is not None and not problems:
        if live.limiter is None:
            problems.append(
                f"node {live.name}: its agent cannot write the limiter table (update gpuops on the node)"
            )
        else:
            limiter = tuple(wanted_lines)
    partition: PartitionChange | None = None
    if desired.partition is not None and not problems:
        partition = _partition_payload(gpu, desired, problems)
    if problems:
        actions: list[Action] = []
        mig_payload = mps = limiter = partition = None
    else:
        actions = payload_actions(gpu, live, mig_payload, mps, limiter, partition)
    kinds = {a.kind for a in actions}  # a payload that changes nothing is not sent
    return GpuPlan(
        index=info.index,
        uuid=info.uuid,
        name=info.name,
        fingerprint=gpu_fingerprint(gpu, live),
        live=live_summary(gpu, live),
        actions=tuple(actions),
        problems=tuple(problems),
        mig=mig_payload if MIG in kinds else None,
        mps=mps if MPS in kinds else None,
        limiter=limiter if LIMITER in kinds else None,
        partition=partition if PARTITION in kinds else None,
        notes=desired.notes,
    )


def plan_node(fleet: Fleet, live: NodeLive) -> NodePlan:
    if not live.ok:
        return NodePlan(live.name, error=live.error or "no data", kind=live.kind or "unreachable")
    gpus = tuple(plan_gpu(fleet, live, gpu) for gpu in sorted(live.gpus, key=lambda g: g.info.index))
    return NodePlan(live.name, gpus, limiter_generation=live.limiter_generation)


def make_plan(
    fleet: Fleet, lives: Sequence[NodeLive], fleet_file: str = "", fleet_digest: str = "", now: float = 0.0
) -> Plan:
    return Plan(tuple(plan_node(fleet, live) for live in lives), fleet_file, fleet_digest, now)
