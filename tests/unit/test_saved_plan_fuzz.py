"""The saved-plan reader under random input: bytes, JSON documents, and real plans with one field
replaced (signed again or not). Every outcome is a valid plan or one PlanError line, never another
exception; and a plan it accepts can be shown and checked against the live node without failing."""

from __future__ import annotations

import contextlib
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.plan.apply import compose_table, shown_node, stale_gpus, verify_gpu
from gpuops.plan.diff import make_plan
from gpuops.plan.model import Plan, PlanError
from gpuops.plan.render import plan_lines
from gpuops.plan.saved import EditedPlanError, document_digest, parse_plan, plan_document
from tests.hypothesis_budget import examples
from tests.unit.test_plan_diff import _fleet, _live, _sim

SOURCE = "plan.json"

CARVE = """\
  - select: {nodes: n1, gpus: "0"}
    mig: {enabled: true, profiles: {"3g.20gb": 1, "1g.5gb": 2}}
    mps: {enabled: true, active_thread_percentage: 50, per_tenant: {vision: {pinned_memory_limit: 1GiB}}}
  - select: {nodes: n1, gpus: "1"}
    limiter: {policy: fixed-share, tenants: {vision: {memory: 20GiB, compute: 30%}, nlp: {compute: 60%}}}
"""


def _backend() -> Any:
    return _sim(
        [
            {"model": "A100-SXM4-40GB", "mig": {"enabled": True, "layout": ["2g.10gb:0"]}},
            {"model": "A100-SXM4-40GB"},
        ],
        [{"name": "busy", "kind": "training", "user": "alice", "gpu": 0, "instance": 0}],
    )


BACKEND = _backend()
LIVE = _live(BACKEND)
PLAN = make_plan(_fleet(CARVE), [LIVE], "/srv/fleet.yaml", "abc", 1.0)
DOCUMENT = plan_document(PLAN)


def _paths(value: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*at, i))
    return found


PATHS = [p for p in _paths(DOCUMENT) if p]

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=5),
    max_leaves=20,
)
_DELETE = object()


def _edited(path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    document = json.loads(json.dumps(DOCUMENT))
    *parents, last = path
    holder = document
    for key in parents:
        holder = holder[key]
    if value is _DELETE:
        del holder[last]
    else:
        holder[last] = value
    return document


def _outcome(data: bytes) -> Plan | None:
    """The plan, or None after a one-line PlanError; any other exception fails the test."""
    try:
        plan = parse_plan(data, SOURCE)
    except PlanError as exc:
        message = str(exc)
        assert message.startswith(SOURCE) and "\n" not in message, message
        return None
    assert isinstance(plan, Plan)
    return plan


def _use(plan: Plan) -> None:
    """What apply does with an accepted plan before it sends anything: none of it may fail."""
    plan_lines(plan)
    for node in plan.nodes:
        if node.name != LIVE.name:
            continue
        stale_gpus(node, LIVE)
        shown = shown_node(node, LIVE)
        plan_lines(Plan((shown,)))
        wanted = {g.index: sorted(g.limiter) for g in shown.gpus if g.limiter is not None}
        compose_table(LIVE, wanted)
        for planned, gpu in zip(shown.gpus, LIVE.gpus, strict=False):
            verify_gpu(planned, gpu, LIVE)


def test_the_real_plan_reads_back_as_it_was_and_an_edit_is_refused() -> None:
    data = json.dumps(DOCUMENT, indent=2).encode()
    assert parse_plan(data, SOURCE) == PLAN
    edited = data.replace(b'"known_pids": [', b'"known_pids": [4242, ', 1)
    assert edited != data
    try:
        parse_plan(edited, SOURCE)
    except EditedPlanError as exc:
        assert "changed since it was saved" in str(exc)
    else:
        raise AssertionError("an edited plan was accepted")


@settings(max_examples=examples(300), deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes(data: bytes) -> None:
    _outcome(data)


@settings(max_examples=examples(300), deadline=None)
@given(_json, st.booleans())
def test_random_json(value: Any, pretty: bool) -> None:
    plan = _outcome(json.dumps(value, indent=2 if pretty else None).encode())
    assert plan is None  # nothing random carries a matching digest


@settings(max_examples=examples(600), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(PATHS), _json | st.just(_DELETE), st.booleans())
def test_real_plans_with_one_field_replaced(path: tuple[Any, ...], value: Any, sign: bool) -> None:
    document = _edited(path, value)
    if sign:
        # A NaN put in cannot be signed: the document stays as it is, and must be refused.
        with contextlib.suppress(ValueError):
            document["digest"] = document_digest(document)
    plan = _outcome(json.dumps(document).encode())
    if plan is not None:
        _use(plan)


@settings(max_examples=examples(30), deadline=None)
@given(st.integers(min_value=1, max_value=5000), st.sampled_from("[{"))
def test_deep_nesting(depth: int, bracket: str) -> None:
    inner = ('{"a": ' * depth + "0" + "}" * depth) if bracket == "{" else ("[" * depth + "]" * depth)
    _outcome(('{"format": "gpuops-plan", "version": 2, "nodes": [], "x": ' + inner + "}").encode())
