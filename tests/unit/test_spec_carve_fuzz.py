"""Fuzzing carve: (the desired state) and the mig-parted import: whatever the input, the answer is
a Fleet (or converted entries) or a SpecError of located one-line issues, never another exception;
`desired_for` on any fleet that loads answers for any GPU; valid carve entries dump and load back
equal."""

from __future__ import annotations

import copy
import io
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from ruamel.yaml import YAML

from gpuops.core.mig import MODELS
from gpuops.spec import Fleet, SpecError, dump_fleet, fleet_from_data, parse_fleet
from gpuops.spec.carve_entry import PROFILE_MODELS
from gpuops.spec.migparted import read_mig_parted, render_carve
from tests.hypothesis_budget import examples
from tests.unit.test_spec_fuzz import EXAMPLE, STRUCTURES, check_outcome

FUZZ = settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])

HEAD = """\
version: 1
teams: {vision: {}, nlp: {}}
nodes:
  - {name: gpu-a-01, host: h1, labels: {model: h100-80gb}}
  - {name: gpu-b-01, host: h2}
carve:
"""

TOKENS = [
    "  - ",
    "    ",
    "      ",
    "select: ",
    "{nodes: gpu-a-01}",
    "{nodes: '*', gpus: 0-3}",
    "{gpus: {model: H100-80GB}}",
    "{gpus: [GPU-5f0c3b8e-2a8e-4d0e-9f6d-1b2c3d4e5f60]}",
    "mig: ",
    "mps: ",
    "limiter: ",
    "{enabled: true}",
    "{enabled: false}",
    "enabled: true\n",
    "profiles: ",
    '{"3g.40gb": 2}',
    '{"1g.10gb": 8}',
    '{"1c.3g.40gb": 1}',
    "placements: ",
    '["3g.40gb@4", "1g.10gb@0"]',
    "compute: ",
    '{"3g.40gb": [1c, 1c, 1c]}',
    "active_thread_percentage: ",
    "pinned_memory_limit: ",
    "per_tenant: ",
    "{nlp: {active_thread_percentage: 30}}",
    "policy: ",
    "fixed-share",
    "burst-share",
    "tenants: ",
    "{vision: {compute: 60%, memory: 20GiB}, nlp: {compute: 50%, class: offline}}",
    '{"*": {memory: 1GiB}}',
    "0",
    "150",
    "20GiB",
    "1.5MiB",
    "-1",
    "\n",
    ": ",
    "[",
    "]",
    "{",
    "}",
    ",",
    "&a ",
    "*a",
    "<<: *a\n",
    "null",
    "~",
    "'",
    "#",
    "\t",
    "é",
]


@FUZZ
@given(st.lists(st.sampled_from(TOKENS), max_size=40))
def test_carve_token_soup(tokens: list[str]) -> None:
    check_outcome(HEAD + "".join(tokens))


def _check_data(data: Any) -> None:
    try:
        fleet = fleet_from_data(data, "f.yaml")
    except SpecError as exc:
        assert exc.errors
        for issue in exc.errors:
            assert "\n" not in str(issue) and str(issue).startswith("f.yaml")
        return
    _ask_every_gpu(fleet)


def _ask_every_gpu(fleet: Fleet) -> None:
    for node in fleet.nodes:
        for index, model in ((0, "NVIDIA H100 80GB HBM3"), (3, "NVIDIA L40S"), (7, None), (1, "A30")):
            for mig_mode in (None, True):
                d = fleet.desired_for(
                    node, index, "GPU-5f0c3b8e-2a8e-4d0e-9f6d-1b2c3d4e5f60", model, mig_mode=mig_mode
                )
                for problem in d.problems:
                    assert "\n" not in str(problem)


NODES = [
    {"name": "gpu-a-01", "host": "h1", "labels": {"model": "h100-80gb"}},
    {"name": "gpu-b-01", "host": "h2"},
]


@FUZZ
@given(STRUCTURES)
def test_any_structure_under_carve(data: Any) -> None:
    base = {"version": 1, "teams": {"vision": {}}, "nodes": NODES}
    _check_data({**base, "carve": data})
    _check_data({**base, "carve": [data]})
    _check_data({**base, "carve": [{"select": data, "mig": data}]})
    _check_data({**base, "carve": [{"select": {}, "mps": data, "limiter": data}]})
    _check_data({**base, "carve": [{"select": {"gpus": data}, "mig": {"enabled": True, "profiles": data}}]})


_EXAMPLE_DATA: dict[str, Any] = YAML(typ="safe", pure=True).load(EXAMPLE.read_text())


def _paths(value: Any, path: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for k, v in value.items():
            found += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found += _paths(v, (*path, i))
    return found


CARVE_PATHS = [p for p in _paths(_EXAMPLE_DATA["carve"], ("carve",)) if len(p) > 1]


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_the_example_carve_with_one_value_replaced(data: st.DataObject) -> None:
    example = copy.deepcopy(_EXAMPLE_DATA)
    path = data.draw(st.sampled_from(CARVE_PATHS))
    value = data.draw(
        st.one_of(STRUCTURES, st.sampled_from(["0", 0, 150, "3g.71gb", "burst-share", "1c", "*"]))
    )
    target: Any = example
    for elem in path[:-1]:
        target = target[elem]
    if isinstance(target, dict) and data.draw(st.booleans()):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    _check_data(example)
    out = io.StringIO()
    YAML(typ="safe", pure=True).dump(example, out)
    check_outcome(out.getvalue())


# ---- valid entries round-trip -----------------------------------------------------------------------

H100 = MODELS["H100-80GB"]
H100_PROFILES = [p.name for p in H100.profiles]

mig_specs = st.one_of(
    st.just({"enabled": False}),
    st.just({"enabled": True}),
    st.dictionaries(st.sampled_from(H100_PROFILES), st.integers(0, 2), max_size=3).map(
        lambda p: {"enabled": True, "profiles": p}
    ),
    st.sampled_from([["3g.40gb@4", "2g.20gb@0"], ["7g.80gb@0"], ["1g.10gb@6", "4g.40gb@0"]]).map(
        lambda p: {"enabled": True, "placements": p}
    ),
    st.just({"enabled": True, "profiles": {"3g.40gb": 2}, "compute": {"3g.40gb": ["2c", "1c"]}}),
)
sizes = st.sampled_from(["512MiB", "1GiB", "8GiB", "3GiB"])
percent = st.integers(1, 100)
mps_specs = st.one_of(
    st.just({"enabled": False}),
    st.fixed_dictionaries(
        {"enabled": st.just(True)},
        optional={
            "active_thread_percentage": percent,
            "pinned_memory_limit": sizes,
            "per_tenant": st.dictionaries(
                st.sampled_from(["vision", "nlp"]),
                st.fixed_dictionaries(
                    {}, optional={"active_thread_percentage": percent, "pinned_memory_limit": sizes}
                ),
                max_size=2,
            ),
            "pipe_directory": st.sampled_from(["/run/mps", "/tmp/x"]),
        },
    ),
)
tenant = st.fixed_dictionaries(
    {},
    optional={
        "memory": sizes,
        "compute": st.sampled_from(["10%", "12.5%", 30, "45%"]),
        "class": st.sampled_from(["online", "offline"]),
    },
)
limiter_specs = st.fixed_dictionaries(
    {"policy": st.sampled_from(["fixed-share", "burst-share"])},
    optional={"tenants": st.dictionaries(st.sampled_from(["vision", "nlp"]), tenant, max_size=2)},
).map(
    lambda spec: {
        **spec,
        "tenants": {
            name: {**t, "compute": t.get("compute", "5%")} for name, t in spec.get("tenants", {}).items()
        },
    }
)


@st.composite
def carves(draw: st.DrawFn) -> list[dict[str, Any]]:
    entries = []
    for i in range(draw(st.integers(0, 6))):
        kind = draw(st.sampled_from(["mig", "mps", "limiter"]))
        spec = draw({"mig": mig_specs, "mps": mps_specs, "limiter": limiter_specs}[kind])
        gpus = draw(st.sampled_from([str(i), i, [i], {"indices": str(i)}]))
        entries.append(
            {"select": {"nodes": draw(st.sampled_from(["gpu-a-01", "*", "gpu-*"])), "gpus": gpus}, kind: spec}
        )
    return entries


@settings(
    max_examples=examples(150),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
@given(carves())
def test_valid_carve_round_trips(carve: list[dict[str, Any]]) -> None:
    data = {"version": 1, "teams": {"vision": {}, "nlp": {}}, "nodes": NODES, "carve": carve}
    try:
        fleet = fleet_from_data(data, "f.yaml")
    except SpecError as exc:  # a layout that does not fit on the H100: fine, but rare
        assert all("carve" in issue.path for issue in exc.errors), exc
        assume(False)
        return
    back = parse_fleet(dump_fleet(fleet), "dumped.yaml")
    assert back == fleet
    assert dump_fleet(back) == dump_fleet(fleet)
    _ask_every_gpu(back)


# ---- the mig-parted import --------------------------------------------------------------------------

MP_TOKENS = [
    "version: v1\n",
    "version: v2\n",
    "mig-configs:\n",
    "  a:\n",
    "  b: []\n",
    "    - ",
    "      ",
    "devices: all\n",
    "devices: [0, 1]\n",
    "device-filter: [0x233010DE]\n",
    'device-filter: "0x233510DE"\n',
    "mig-enabled: true\n",
    "mig-enabled: false\n",
    "mig-devices: {}\n",
    'mig-devices: {"1g.10gb": 7}\n',
    'mig-devices: {"1c.3g.40gb": 4}\n',
    'mig-devices: {"1g.5gb": 0}\n',
    "{",
    "}",
    "[",
    "]",
    "\n",
    ": ",
    "- ",
    "'",
    "\t",
]


def _check_import(text: str, label: str | None) -> None:
    try:
        imported = read_mig_parted(text, "m.yaml", label)
    except SpecError as exc:
        assert exc.errors
        for issue in exc.errors:
            assert "\n" not in str(issue) and str(issue).startswith("m.yaml")
        return
    out = render_carve(imported, source="m.yaml")
    fleet = parse_fleet(
        "version: 1\nnodes: [{host: h1}]\n"
        + "".join(line + "\n" for line in out.splitlines() if line[:1] != "#"),
        "converted.yaml",
    )
    assert len(fleet.carve) == len(imported.entries)


@FUZZ
@given(st.lists(st.sampled_from(MP_TOKENS), max_size=30), st.sampled_from([None, "a", "b"]))
def test_mig_parted_token_soup(tokens: list[str], label: str | None) -> None:
    _check_import("".join(tokens), label)


@FUZZ
@given(STRUCTURES, st.sampled_from([None, "a"]))
def test_mig_parted_any_structure(data: Any, label: str | None) -> None:
    out = io.StringIO()
    yaml = YAML(typ="safe", pure=True)
    yaml.dump({"version": "v1", "mig-configs": {"a": [data]}}, out)
    _check_import(out.getvalue(), label)
    out = io.StringIO()
    yaml.dump({"version": "v1", "mig-configs": data}, out)
    _check_import(out.getvalue(), label)


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from([*PROFILE_MODELS, "1c.3g.40gb", "2c.7g.80gb", "1c.4g.20gb"]),
        st.integers(0, 8),
        max_size=4,
    ),
    st.sampled_from([None, "0x233010DE", ["0x20B010DE", "0x20B210DE"], "0x20B710DE"]),
)
def test_mig_parted_any_layout(counts: dict[str, int], device_filter: Any) -> None:
    spec: dict[str, Any] = {"devices": "all", "mig-enabled": True, "mig-devices": counts}
    if device_filter is not None:
        spec["device-filter"] = device_filter
    out = io.StringIO()
    YAML(typ="safe", pure=True).dump({"version": "v1", "mig-configs": {"a": [spec]}}, out)
    _check_import(out.getvalue(), None)
