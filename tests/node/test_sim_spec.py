"""Sim spec loading: sources, defaults, and one-line errors that name the field."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any, Dict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops.node.backends.base import BackendError, BackendUnavailable
from gpuops.node.backends.registry import create_backend
from gpuops.node.backends.sim import SimBackend
from gpuops.node.sim.spec import WORKLOAD_KEYS, builtin_scenarios, load_spec
from tests.hypothesis_budget import examples

T0 = 1_717_545_600.0


def make(spec: Dict[str, Any]) -> SimBackend:
    return SimBackend(spec=spec, clock=lambda: T0)


def error(spec: Any) -> str:
    with pytest.raises(BackendUnavailable) as exc:
        SimBackend(spec=spec, clock=lambda: T0)
    message = str(exc.value)
    assert "\n" not in message
    return message


# ---- sources -------------------------------------------------------------------------------


def test_no_spec_is_the_demo_node() -> None:
    b = SimBackend(clock=lambda: T0)
    assert b.spec.hostname == "gpu-demo-01"
    assert len(b.inventory().gpus) == 8
    assert "mig-control" in b.capabilities()
    assert create_backend("sim").inventory().hostname == "gpu-demo-01"


def test_file_path_via_sim_spec(tmp_path: Path) -> None:
    path = tmp_path / "node.json"
    path.write_text(json.dumps({"hostname": "n1", "gpus": ["T4", "T4"]}))
    b = SimBackend(sim_spec=str(path), clock=lambda: T0)
    node = b.inventory()
    assert node.hostname == "n1" and [g.info.name for g in node.gpus] == ["Tesla T4", "Tesla T4"]
    assert create_backend("sim", sim_spec=str(path)).inventory().hostname == "n1"


def test_builtin_scenarios_all_load_and_sample() -> None:
    names = builtin_scenarios()
    assert "demo-node" in names and len(names) >= 3
    for name in names:
        b = SimBackend(spec=name, clock=lambda: T0)
        sample = b.sample()
        assert len(sample.gpus) == len(b.inventory().gpus) > 0
        assert b.spec.description


def test_defaults() -> None:
    spec = load_spec({"gpus": [{"model": "A100-40GB"}]})
    assert spec.hostname == "sim-node" and spec.seed == 0 and spec.driver_version == "550.54.15"
    (gpu,) = spec.gpus
    assert gpu.hardware.key == "A100-SXM4-40GB" and not gpu.mig_enabled and gpu.owner is None


def test_model_spellings_pick_the_right_variant() -> None:
    b = make({"gpus": ["A100-PCIE-80GB", "A100-SXM4-80GB", "NVIDIA H200 NVL", "h100-80gb", "RTX A6000"]})
    infos = [g.info for g in b.inventory().gpus]
    assert [i.name for i in infos] == [
        "NVIDIA A100 80GB PCIe",
        "NVIDIA A100-SXM4-80GB",
        "NVIDIA H200 NVL",
        "NVIDIA H100 80GB HBM3",
        "NVIDIA RTX A6000",
    ]
    assert [hex(i.pci_device_id) for i in infos[:3]] == ["0x20b510de", "0x20b210de", "0x233b10de"]
    assert [i.mig_model for i in infos] == ["A100-80GB", "A100-80GB", "H200-141GB", "H100-80GB", None]
    assert infos[0].power_limit_watts == 300.0 and infos[1].power_limit_watts == 400.0
    assert len({i.uuid for i in infos}) == 5 and all(i.uuid.startswith("GPU-") for i in infos)
    assert len({i.pci_bus_id for i in infos}) == 5


def test_layout_with_placements_and_compute_instances() -> None:
    b = make(
        {
            "gpus": [
                {
                    "model": "A100-SXM4-40GB",
                    "mig": {
                        "enabled": True,
                        "layout": [
                            "3g.20gb:0",
                            {
                                "profile": "3g.20gb",
                                "start": 4,
                                "compute_instances": ["1c", "1c", "1c.3g.20gb"],
                            },
                        ],
                    },
                }
            ]
        }
    )
    mig = b.inventory().gpus[0].mig
    assert mig is not None
    gis = sorted(mig.gpu_instances, key=lambda g: g.start)
    assert [(g.start, g.id, len(g.compute_instances)) for g in gis] == [(0, 1, 1), (4, 2, 3)]
    assert gis[0].compute_instances[0].name == "3g.20gb"


def test_ampere_pending_state_in_spec() -> None:
    b = make({"gpus": [{"model": "A100-40GB", "mig": {"enabled": False, "pending": True}}]})
    mig = b.inventory().gpus[0].mig
    assert mig is not None and (mig.current, mig.pending) == (False, True)
    b.reset_gpu(0)
    assert b.inventory().gpus[0].mig.current  # type: ignore[union-attr]


def test_tenant_and_user_defaults() -> None:
    spec = load_spec(
        {
            "users": {"ann": 1001, "ben": 1002},
            "tenants": {"vision": ["ann"], "nlp": ["ben"]},
            "gpus": ["L40S"],
            "workloads": [
                {"kind": "idle", "gpu": 0, "user": "ben"},
                {"kind": "idle", "gpu": 0, "tenant": "vision"},
            ],
        }
    )
    assert [(w.tenant, w.user) for w in spec.workloads] == [("nlp", "ben"), ("vision", "ann")]
    assert [w.name for w in spec.workloads] == ["idle-0", "idle-1"]


def test_limiter_workloads_carry_their_tenant() -> None:
    b = make(
        {
            "tenants": {"nlp": []},
            "gpus": ["L40S"],
            "workloads": [
                {"name": "a", "kind": "steady", "gpu": 0, "tenant": "nlp", "limiter": True},
                {"name": "b", "kind": "steady", "gpu": 0, "tenant": "nlp"},
            ],
        }
    )
    tags = sorted((str(p.tenant), p.tenant_source) for p in b.sample().gpus[0].processes)
    assert tags == [("None", ""), ("nlp", "limiter")]


# ---- errors name their field ---------------------------------------------------------------

KNOWN = ", ".join(["A100-80GB", "A100-SXM4-40GB"])


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"gpus": ["A100-40GB", "L40S", {"model": "A100-41GB"}]},
            "sim spec <dict>: gpus[2].model: unknown model 'A100-41GB' (known: A100-80GB, A100-SXM4-40GB",
        ),
        ({"gpu": []}, "sim spec <dict>: gpu: unknown key (known: version,"),
        ([], "sim spec <dict>: expected an object, got a list"),
        ({"version": 2}, "version: 2 is out of range (1..1)"),
        ({"hostname": "bad host"}, "hostname: 'bad host' is not a valid host name"),
        ({"seed": -1}, "seed: -1 is out of range"),
        ({"seed": True}, "seed: expected an integer, got true/false"),
        ({"gpus": [{"model": "L40S", "count": 0}]}, "gpus[0].count: 0 is out of range (1..64)"),
        ({"gpus": [{"model": "L40S", "count": 65}]}, "gpus[0].count: 65 is out of range"),
        ({"gpus": [{"model": "L40S", "mig": True}]}, "gpus[0].mig.enabled: NVIDIA L40S does not support MIG"),
        (
            {"gpus": [{"model": "A30", "mig": {"layout": ["4g.24gb"]}}]},
            "gpus[0].mig.layout: a MIG layout needs",
        ),
        (
            {"gpus": [{"model": "A30", "mig": {"enabled": True, "layout": ["3g.20gb"]}}]},
            "gpus[0].mig.layout[0]: unknown GPU instance profile '3g.20gb' for A30-24GB",
        ),
        (
            {"gpus": [{"model": "A100-40GB", "mig": {"enabled": True, "layout": ["9", "9", "9"]}}]},
            "gpus[0].mig.layout[2]: INSUFFICIENT_RESOURCES: unable to create a GPU instance",
        ),
        (
            {"gpus": [{"model": "A100-40GB", "mig": {"enabled": True, "layout": ["3g.20gb:2"]}}]},
            "gpus[0].mig.layout[0]: INVALID_ARGUMENT",
        ),
        (
            {
                "gpus": [
                    {
                        "model": "A100-40GB",
                        "mig": {
                            "enabled": True,
                            "layout": [{"profile": "4g.20gb", "compute_instances": ["3c"]}],
                        },
                    }
                ]
            },
            "gpus[0].mig.layout[0].compute_instances[0]: unknown compute instance profile '3c' for 4g.20gb",
        ),
        (
            {
                "gpus": [
                    {
                        "model": "A100-40GB",
                        "mig": {
                            "enabled": True,
                            "layout": [{"profile": "2g.10gb", "compute_instances": [1, 0]}],
                        },
                    }
                ]
            },
            "gpus[0].mig.layout[0].compute_instances[1]: INSUFFICIENT_RESOURCES",
        ),
        (
            {"gpus": [{"model": "H100-80GB", "mig": {"enabled": False, "pending": True}}]},
            "gpus[0].mig.pending: NVIDIA H100 80GB HBM3 switches MIG mode without a reset",
        ),
        ({"gpus": [{"model": "T4", "unsupported": ["fan"]}]}, "gpus[0].unsupported[0]: unknown field 'fan'"),
        ({"tenants": {"a": ["zed"]}, "users": {"amy": 1}}, "tenants.a[0]: unknown user 'zed'"),
        ({"tenants": {"a": []}, "gpus": [{"model": "T4", "owner": "b"}]}, "gpus[0].owner: unknown team 'b'"),
        ({"gpus": ["T4"], "workloads": [{"gpu": 0}]}, "workloads[0].kind: missing (known: idle, inference"),
        (
            {"gpus": ["T4"], "workloads": [{"kind": "mining", "gpu": 0}]},
            "workloads[0].kind: unknown workload kind",
        ),
        ({"gpus": ["T4"], "workloads": [{"kind": "idle"}]}, "workloads[0].gpu: missing"),
        (
            {"gpus": ["T4"], "workloads": [{"kind": "idle", "gpu": 1}]},
            "workloads[0].gpu: 1 is out of range (0..0)",
        ),
        (
            {"gpus": ["T4"], "workloads": [{"kind": "idle", "gpu": 0, "memory": "20GiB"}]},
            "workloads[0].memory: 21474836480 bytes do not fit",
        ),
        (
            {"gpus": ["T4"], "workloads": [{"kind": "idle", "gpu": 0, "memory": "lots"}]},
            "workloads[0].memory: expected a size",
        ),
        (
            {"gpus": ["T4"], "workloads": [{"kind": "training", "gpu": 0, "params": {"util": 150}}]},
            "workloads[0].params.util: a percentage must lie between 0% and 100%",
        ),
        (
            {"gpus": ["T4"], "workloads": [{"kind": "training", "gpu": 0, "params": {"speed": 1}}]},
            "workloads[0].params.speed: unknown key (known: util, checkpoint_every",
        ),
        (
            {"gpus": ["T4"], "workloads": [{"kind": "idle", "gpu": 0, "start": "+2h", "stop": "1h"}]},
            "workloads[0].stop: stops before it starts",
        ),
        (
            {"gpus": ["T4"], "workloads": [{"kind": "idle", "gpu": 0, "start": "soon"}]},
            "workloads[0].start: expected a duration",
        ),
        (
            {
                "gpus": ["T4"],
                "workloads": [
                    {"name": "x", "kind": "idle", "gpu": 0},
                    {"name": "x", "kind": "idle", "gpu": 0},
                ],
            },
            "workloads[1].name: duplicate workload name 'x'",
        ),
        (
            {
                "users": {"u": 1},
                "tenants": {"t": []},
                "gpus": ["T4"],
                "workloads": [{"kind": "idle", "gpu": 0, "user": "v"}],
            },
            "workloads[0].user: unknown user 'v'",
        ),
        (
            {
                "users": {"u": 1, "v": 2},
                "tenants": {"t": ["u"]},
                "gpus": ["T4"],
                "workloads": [{"kind": "idle", "gpu": 0, "user": "v", "tenant": "t"}],
            },
            "workloads[0].user: user 'v' is not a member of team 't'",
        ),
        (
            {"gpus": [{"model": "A30", "mig": True}], "workloads": [{"kind": "idle", "gpu": 0}]},
            "workloads[0].gpu: GPU 0 runs MIG: name the instance",
        ),
        (
            {
                "gpus": [{"model": "A30", "mig": {"enabled": True, "layout": ["4g.24gb"]}}],
                "workloads": [{"kind": "idle", "gpu": 0, "instance": 1}],
            },
            "workloads[0].instance: 1 is out of range (0..0)",
        ),
        ({"epoch": "yesterday"}, "epoch: expected seconds since 1970 or an ISO date"),
        ({"utc_offset": "+25:00"}, "utc_offset: offset beyond +/-14 hours"),
    ],
)
def test_errors_are_one_line_with_the_location(spec: Any, expected: str) -> None:
    message = error(spec)
    assert expected in message, message
    assert message.startswith("sim spec <dict>: ")


def test_unknown_model_lists_the_known_ones() -> None:
    message = error({"gpus": [{"model": "A100-41GB"}]})
    for name in ("A100-SXM4-40GB", "H100-80GB", "A30-24GB", "L40S", "T4"):
        assert name in message


def test_file_errors(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{\n  "hostname": "x",\n  "gpus": [\n}\n')
    message = error(str(bad))
    assert message.startswith(f"sim spec {bad}: line 4 column 1: invalid JSON")
    dup = tmp_path / "dup.json"
    dup.write_text('{"seed": 1, "seed": 2}')
    assert "duplicate key 'seed'" in error(str(dup))
    wrong = tmp_path / "wrong.json"
    wrong.write_text(json.dumps({"gpus": [{"model": "A100-41GB"}]}))
    assert error(str(wrong)).startswith(f"sim spec {wrong}: gpus[0].model: unknown model 'A100-41GB'")
    missing = str(tmp_path / "nope.json")
    assert "no such file, and not a built-in scenario (built-in: " in error(missing)
    with pytest.raises(BackendUnavailable):
        create_backend("sim", sim_spec=missing)


def test_seed_option_must_be_an_integer() -> None:
    with pytest.raises(BackendUnavailable):
        SimBackend(seed="7")  # type: ignore[arg-type]
    assert SimBackend(seed=7, clock=lambda: T0).seed == 7


def test_epoch_forms() -> None:
    assert load_spec({"epoch": "2024-06-05T00:00:00Z"}).epoch == T0
    assert load_spec({"epoch": T0}).epoch == T0
    assert load_spec({"utc_offset": "-05:30"}).utc_offset == -19800.0
    assert load_spec({"utc_offset": 8}).utc_offset == 28800.0


# ---- fuzz: garbage never gives anything but a backend or BackendUnavailable ----------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(
        ["A100-40GB", "H100-80GB", "A30", "L40S", "T4", "3g.20gb", "1g.5gb", "4g.24gb", "1c", "+2h", "-1d",
         "pending", "50%", "8GiB", "training", "inference", "notebook", "idle", "steady", "alice", "vision"]
    ),
)  # fmt: skip
_keys = st.sampled_from(
    ["hostname", "seed", "epoch", "utc_offset", "gpus", "workloads", "users", "tenants", "model", "count",
     "owner", "mig", "enabled", "pending", "layout", "profile", "start", "compute_instances", "lost",
     "lost_at", "unsupported", "driver_version", *WORKLOAD_KEYS, "alice", "vision", "util"]
) | st.text(max_size=6)  # fmt: skip
_json = st.recursive(
    _scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_keys, children, max_size=5),
    max_leaves=25,
)


def _exercise(spec: Any) -> None:
    try:
        b = SimBackend(spec=spec, clock=lambda: T0)
    except BackendUnavailable as exc:
        assert "\n" not in str(exc) and str(exc).startswith("sim spec ")
        return
    b.inventory()
    b.sample()
    b.workloads()
    for gpu in range(len(b.inventory().gpus)):
        with contextlib.suppress(BackendError):
            b.set_mig_mode(gpu, True)
        with contextlib.suppress(BackendError):
            b.create_gpu_instance(gpu, 19)
    b.sample()


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_json)
def test_fuzz_garbage(spec: Any) -> None:
    if not isinstance(spec, dict):
        spec = {"gpus": spec}
    _exercise(spec)


# Plausible specs: valid pieces in random combinations (layouts that do not fit, MIG on cards
# without it, workloads on missing instances...), to reach deep into the loader and the backend.
_gpu = st.fixed_dictionaries(
    {"model": st.sampled_from(["A100-40GB", "H100-80GB", "A30", "L40S", "H200", "A100-80GB"])},
    optional={
        "count": st.integers(1, 3),
        "owner": st.sampled_from(["vision", "nlp"]),
        "mig": st.booleans()
        | st.fixed_dictionaries(
            {"enabled": st.booleans()},
            optional={
                "pending": st.booleans(),
                "layout": st.lists(
                    st.sampled_from(
                        ["1g.5gb", "3g.20gb", "4g.24gb", "1g.10gb:6", "9:4", "0", 19, 14, "2g.12gb", "1g.6gb",
                         "3g.40gb", "2g.35gb", "5"]
                    ),
                    max_size=5,
                ),
            },
        ),
        "lost": st.booleans(),
        "lost_at": st.sampled_from(["+1h", "-1h", 0]),
        "unsupported": st.lists(
            st.sampled_from(["power", "memory", "utilization_gpu", "process_memory"]), max_size=3
        ),
    },
)  # fmt: skip
_workload = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["training", "inference", "notebook", "idle", "steady"]),
        "gpu": st.integers(0, 3),
    },
    optional={
        "instance": st.integers(0, 2),
        "compute_instance": st.integers(0, 1),
        "user": st.sampled_from(["alice", "bob"]),
        "memory": st.sampled_from(["1GiB", "50%", "5GiB", 0]),
        "start": st.sampled_from(["-1d", "+1h", "pending", 0, -5.5, "-2m"]),
        "duration": st.sampled_from(["1h", "30s"]),
        "params": st.dictionaries(
            st.sampled_from(["util", "peak_util", "checkpoint_every", "burst_probability"]),
            st.sampled_from([0, 50, "90%", 1, "1h"]),
            max_size=2,
        ),
        "limiter": st.booleans(),
    },
)


@settings(max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {
            "users": st.just({"alice": 1001, "bob": 1002}),
            "tenants": st.just({"vision": ["alice"], "nlp": ["bob"]}),
            "gpus": st.lists(_gpu, max_size=4),
            "workloads": st.lists(_workload, max_size=4),
        },
        optional={"seed": st.integers(0, 10), "utc_offset": st.integers(-12, 12)},
    )
)
def test_fuzz_structured(spec: Dict[str, Any]) -> None:
    _exercise(spec)


def test_a_key_ending_in_a_newline_stays_on_one_line() -> None:
    # Found by the fuzzer: "$" in a regex also matches before a final newline.
    with pytest.raises(BackendUnavailable) as info:
        SimBackend(spec={"0\n": None}, clock=lambda: T0)
    assert "\n" not in str(info.value) and '["0\\n"]' in str(info.value)
