"""The plan's pieces without a network: the diff per GPU against live state from the simulated
backend, the node's limiter table composed from per-GPU lines, saved plans read back."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.core.codec import to_json
from gpuops.core.mig.layout import layout_of
from gpuops.core.tenant_table import TenantSpec
from gpuops.node.backends.sim import SimBackend
from gpuops.plan.apply import compose_table, stale_gpus, verify_gpu
from gpuops.plan.diff import make_plan, plan_node
from gpuops.plan.document import plan_from_json
from gpuops.plan.live import MpsDaemon, NodeLive, parse_config
from gpuops.plan.model import PLAN_VERSION, PlanError
from gpuops.plan.render import plan_lines
from gpuops.spec.loader import parse_fleet
from tests.hypothesis_budget import examples

GIB = 1024**3


def _sim(gpus: list[dict[str, Any]], workloads: list[dict[str, Any]] | None = None) -> SimBackend:
    spec = {
        "hostname": "n1",
        "users": {"alice": 1001, "bob": 1002},
        "tenants": {"vision": ["alice"], "nlp": ["bob"]},
        "gpus": gpus,
        "workloads": workloads or [],
    }
    return SimBackend(spec, clock=lambda: 1_700_000_000.0)


def _live(
    backend: SimBackend, limiter: tuple[TenantSpec, ...] = (), mps: tuple[MpsDaemon, ...] = ()
) -> NodeLive:
    return NodeLive("n1", backend.inventory(), backend.sample(), mps, limiter, 7)


def _fleet(carve: str) -> Any:
    text = (
        "version: 1\nteams:\n  vision: {users: [alice]}\n  nlp: {users: [bob]}\n"
        "nodes:\n  - {name: n1, host: 127.0.0.1}\ncarve:\n" + carve
    )
    return parse_fleet(text, "fleet.yaml")


def test_mig_diff_places_with_the_solver_and_marks_destruction() -> None:
    backend = _sim(
        [
            {"model": "A100-SXM4-40GB", "mig": {"enabled": True, "layout": ["3g.20gb:4", "2g.10gb:0"]}},
            {"model": "A100-SXM4-40GB"},
        ],
        [{"name": "busy", "kind": "training", "user": "alice", "gpu": 0, "instance": 1}],  # on 2g.10gb@0
    )
    fleet = _fleet('  - select: {nodes: n1}\n    mig: {enabled: true, profiles: {"3g.20gb": 2}}\n')
    node = plan_node(fleet, _live(backend))
    gpu0, gpu1 = node.gpus
    texts0 = [(a.marker, a.text, a.disruptive) for a in gpu0.actions]
    assert ("-", "instance 2g.10gb@0", True) in texts0
    assert ("+", "instance 3g.20gb@0", False) in texts0
    assert not any("3g.20gb@4" in t for _, t, _ in texts0)  # kept as it is, with its process
    (victims,) = [a.processes for a in gpu0.actions if a.text == "instance 2g.10gb@0"]
    assert [p.user for p in victims] == ["alice"]
    assert next((a.marker, a.text) for a in gpu1.actions) == ("~", "MIG mode off -> on")
    assert gpu0.mig is not None and gpu0.mig.expect


def test_an_impossible_layout_is_a_located_problem_and_no_action() -> None:
    backend = _sim([{"model": "A100-SXM4-40GB"}])
    fleet = _fleet('  - select: {nodes: n1}\n    mig: {enabled: true, profiles: {"1g.10gb": 7}}\n')
    plan = make_plan(fleet, [_live(backend)])
    (gpu,) = plan.nodes[0].gpus
    assert gpu.problems and gpu.problems[0].startswith("fleet.yaml:") and not gpu.actions
    assert plan.exit_code() == 1


def test_limiter_lines_per_gpu_and_the_composed_table() -> None:
    backend = _sim([{"model": "A100-SXM4-40GB"}, {"model": "A100-SXM4-40GB"}, {"model": "A100-SXM4-40GB"}])
    sample = backend.sample()
    u0, u1, u2 = (g.info.uuid for g in sample.gpus)
    live_lines = (
        TenantSpec("vision", 10 * GIB, 30.0, "fixed-share", "online"),  # every GPU
        TenantSpec("nlp", None, 50.0, "burst-share", "offline", ("2",)),
    )
    fleet = _fleet(
        '  - select: {nodes: n1, gpus: "0"}\n'
        "    limiter:\n      tenants: {vision: {memory: 20GiB, compute: 30%}}\n"
    )
    live = _live(backend, live_lines)
    node = plan_node(fleet, live)
    gpu0 = node.gpus[0]
    assert [(a.marker, a.disruptive) for a in gpu0.actions] == [("~", False)]
    assert "memory 10GiB" in gpu0.actions[0].text and "memory 20GiB" in gpu0.actions[0].text
    assert not node.gpus[1].actions and not node.gpus[2].actions  # not selected: left as they are

    assert gpu0.limiter is not None
    table = [to_json(line) for line in compose_table(live, {0: list(gpu0.limiter)})]
    assert sorted(table, key=json.dumps) == sorted(
        [
            {
                "name": "nlp",
                "memory": None,
                "compute": 50.0,
                "policy": "burst-share",
                "class": "offline",
                "gpus": [u2],
            },
            {
                "name": "vision",
                "memory": 20 * GIB,
                "compute": 30.0,
                "policy": "fixed-share",
                "class": "online",
                "gpus": [u0],
            },
            {
                "name": "vision",
                "memory": 10 * GIB,
                "compute": 30.0,
                "policy": "fixed-share",
                "class": "online",
                "gpus": sorted([u1, u2]),
            },
        ],
        key=json.dumps,
    )


def test_saved_plan_round_trip_and_staleness() -> None:
    backend = _sim([{"model": "A100-SXM4-40GB"}])
    fleet = _fleet('  - select: {nodes: n1}\n    mig: {enabled: true, profiles: {"7g.40gb": 1}}\n')
    plan = make_plan(fleet, [_live(backend)], "fleet.yaml", "abc", 1.0)
    again = plan_from_json(json.loads(json.dumps(plan.to_json())))
    assert again == plan
    assert stale_gpus(again.nodes[0], _live(backend)) == []
    backend.set_mig_mode(0, True)
    lines = stale_gpus(again.nodes[0], _live(backend))
    assert lines == [
        "GPU 0: MIG layout: was MIG off, now MIG off (mode change pending)"
    ]  # Ampere: until reset


def test_verify_says_what_is_not_as_planned() -> None:
    backend = _sim([{"model": "A100-SXM4-40GB"}])
    fleet = _fleet('  - select: {nodes: n1}\n    mig: {enabled: true, profiles: {"7g.40gb": 1}}\n')
    (gpu_plan,) = plan_node(fleet, _live(backend)).gpus
    gpu = backend.sample().gpus[0]
    assert verify_gpu(gpu_plan, gpu, _live(backend)) == ["MIG layout is MIG off, not the planned one"]
    assert layout_of(gpu) is not None


def test_config_replies_are_checked() -> None:
    daemons, lines, generation = parse_config(
        {
            "mps": [
                {
                    "device": "GPU-1",
                    "gpu": 0,
                    "pipe_directory": "/run/gpuops/mps/GPU-1",
                    "log_directory": "/var/log/gpuops/mps/GPU-1",
                    "running": True,
                    "active_thread_percentage": 50,
                    "pinned_memory_limit": None,
                    "servers": [{"pid": 9, "uid": 1001, "user": "alice", "clients": [10, 11]}],
                }
            ],
            "limiter": {"generation": 3, "tenants": [{"name": "a", "compute": 30, "policy": "fixed-share"}]},
        }
    )
    assert daemons[0].clients == (10, 11) and lines[0].compute == 30.0 and generation == 3
    for bad in (None, {}, {"mps": [{}], "limiter": {}}, {"mps": [], "limiter": {"tenants": [{"x": 1}]}}):
        try:
            parse_config(bad)
        except Exception as exc:
            assert type(exc).__name__ == "AgentError", exc
        else:
            raise AssertionError(f"accepted {bad!r}")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
_keys = st.sampled_from(["format", "version", "nodes", "name", "gpus", "index", "uuid", "actions", "live"])


@settings(max_examples=examples(300), deadline=None)
@given(
    st.dictionaries(_keys, _json, max_size=6).map(
        lambda d: {"format": "gpuops-plan", "version": PLAN_VERSION, **d}
    )
    | _json
)
def test_garbage_plans_are_plan_errors(data: Any) -> None:
    try:
        plan_from_json(data)
    except PlanError as exc:
        assert str(exc)


def test_mig_on_every_gpu_notes_the_gpus_without_mig_it_skips() -> None:
    # issue 19: mig-parted stops with an error on a GPU without MIG under an enabled spec without
    # a device-filter; gpuops skips it, and says so in the plan instead of silently.
    backend = _sim([{"model": "H100-80GB"}, {"model": "L40S"}])
    fleet = _fleet('  - select: {nodes: n1}\n    mig: {enabled: true, profiles: {"1g.10gb": 7}}\n')
    plan = make_plan(fleet, [_live(backend)])
    h100, l40s = plan.nodes[0].gpus
    assert h100.actions and not h100.notes
    assert not l40s.actions and not l40s.problems and plan.exit_code() == 2
    (note,) = l40s.notes
    assert note.startswith("fleet.yaml:8:5: MIG left as it is")
    assert "has no MIG" in note and "mig-parted" in note
    shown = "\n".join(plan_lines(plan))
    assert "GPU 1" in shown and "note:" in shown and "has no MIG" in shown
    # notes are shown, not applied: a saved plan keeps them and reads back equal
    assert plan_from_json(json.loads(json.dumps(plan.to_json()))).nodes[0].gpus[1].notes == l40s.notes
    # an entry that names its models has nothing to say about other models
    named = _fleet(
        "  - select: {nodes: n1, gpus: {model: H100-80GB}}\n"
        '    mig: {enabled: true, profiles: {"1g.10gb": 7}}\n'
    )
    assert not make_plan(named, [_live(backend)]).nodes[0].gpus[1].notes
    # and MIG off on every GPU is fine on GPUs without MIG, as in mig-parted
    off = _fleet("  - select: {nodes: n1}\n    mig: {enabled: false}\n")
    assert not make_plan(off, [_live(backend)]).nodes[0].gpus[1].notes
