"""A `mig:` of profile counts is met on a GPU in MIG mode by the layout that stops the fewest
processes, then removes the fewest instances, of all valid layouts (issue 28 item 1).

The plan (plan_node over the simulated backend, as `gpuops plan` makes it) is checked against a
brute-force oracle that tries every placement of the wanted instances: on the simulator's MIG
GPUs, with every label of NVIDIA's shipped mig-parted files (tests/data/migparted) that fits
them. Before, the plan aimed at the solver's one canonical layout whatever the GPU held."""

from __future__ import annotations

import itertools
from collections import Counter
from typing import Any

import pytest

from gpuops.core.mig.catalog import MODELS, MigModel
from gpuops.core.mig.placement import Placement, check_layout, solve, solve_keeping
from gpuops.node.backends.sim import SimBackend
from gpuops.plan.diff import plan_node
from gpuops.plan.live import NodeLive
from gpuops.spec.loader import parse_fleet
from tests.unit.test_import_migparted_nvidia import FILES, configs, mig_parted_result

# The MIG GPUs the simulator runs: the platform node's two shapes (simfleet's scenarios, on an
# A100-80GB or an H100-80GB: 3g+2g+1g+1g with processes on the 3g and the first 1g; seven 1g with
# processes on three of them) and the hopper scenario's 4g+3g with a process on each.
SHAPES: list[tuple[str, list[str], list[int]]] = [
    (model, ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"], [0, 2]) for model in ("A100-80GB", "H100-80GB")
]
SHAPES += [(model, ["1g.10gb"] * 7, [0, 3, 6]) for model in ("A100-80GB", "H100-80GB")]
SHAPES += [("H100-80GB", ["4g.40gb", "3g.40gb"], [0, 1])]


def _backend(model: str, layout: list[str], busy: list[int]) -> SimBackend:
    workloads = [
        {"name": f"w{k}", "kind": "inference", "user": "alice", "gpu": 0, "instance": k, "memory": "50%"}
        for k in busy
    ]
    spec = {
        "hostname": "n1",
        "users": {"alice": 1001},
        "gpus": [{"model": model, "mig": {"enabled": True, "layout": layout}}],
        "workloads": workloads,
    }
    return SimBackend(spec, clock=lambda: 1_700_000_000.0)


def _plan(backend: SimBackend, profiles: dict[str, int]) -> Any:
    counts = ", ".join(f'"{name}": {n}' for name, n in profiles.items())
    fleet = parse_fleet(
        "version: 1\nteams:\n  vision: {users: [alice]}\nnodes:\n  - {name: n1, host: 127.0.0.1}\n"
        f"carve:\n  - select: {{nodes: n1}}\n    mig: {{enabled: true, profiles: {{{counts}}}}}\n",
        "fleet.yaml",
    )
    live = NodeLive("n1", backend.inventory(), backend.sample(), (), (), 7)
    (gpu,) = plan_node(fleet, live).gpus
    return gpu


def _live(backend: SimBackend, model: MigModel) -> tuple[list[Placement], list[int]]:
    """The GPU's instances and how many processes run on each."""
    inventory, sample = backend.inventory(), backend.sample()
    mig = inventory.gpus[0].mig
    assert mig is not None
    procs = Counter(p.gpu_instance_id for p in sample.gpus[0].processes)
    placements, counts = [], []
    for gi in mig.gpu_instances:
        profile = model.profile(gi.profile_id)
        placements.append(Placement(profile.name, profile.id, gi.start, profile.memory_slices))
        counts.append(procs.get(gi.id, 0))
    return placements, counts


def _every_layout(model: MigModel, wanted: dict[str, int]) -> list[tuple[Placement, ...]]:
    """Every valid placement of `wanted` (brute force: each profile's count over its starts)."""
    choices = []
    for name, n in wanted.items():
        gi = model.profile(name)
        choices.append(
            [
                tuple(Placement(gi.name, gi.id, s, gi.memory_slices) for s in starts)
                for starts in itertools.combinations(gi.placements, n)
            ]
        )
    layouts = []
    for combo in itertools.product(*choices):
        placements = tuple(p for group in combo for p in group)
        if check_layout(model, placements).ok:
            layouts.append(placements)
    return layouts


def _cost(layout: tuple[Placement, ...], live: list[Placement], procs: list[int]) -> tuple[int, int]:
    """(processes stopped, instances removed) when `layout` replaces `live`."""
    kept = {(p.profile_id, p.start) for p in layout}
    gone = [i for i, p in enumerate(live) if (p.profile_id, p.start) not in kept]
    return sum(procs[i] for i in gone), len(gone)


def _cases() -> list[tuple[str, list[str], list[int], str, dict[str, int]]]:
    """Every (simulated MIG GPU, label) where the label turns MIG on with instances that fit."""
    cases = []
    for model_key, layout, busy in SHAPES:
        model = MODELS[model_key]
        seen: set[tuple[tuple[str, int], ...]] = set()
        for path in FILES:
            for label, specs in configs(path).items():
                result = mig_parted_result(specs, model)
                if not isinstance(result, Counter) or not result:
                    continue
                key = tuple(sorted(result.items()))
                if key in seen:
                    continue
                seen.add(key)
                cases.append((model_key, layout, busy, f"{path.name}:{label}", dict(result)))
    return cases


CASES = _cases()


def test_the_cases_cover_the_files_labels() -> None:
    # Each simulated shape meets several distinct layouts of NVIDIA's files (balanced, all-1g, ...).
    per_shape = Counter((m, tuple(layout)) for m, layout, _, _, _ in CASES)
    assert len(per_shape) == len(SHAPES) and min(per_shape.values()) >= 5, per_shape


@pytest.mark.parametrize(
    ("model_key", "layout", "busy", "label", "wanted"),
    CASES,
    ids=[f"{m}-{'+'.join(layout[:2])}-{label}" for m, layout, _, label, _ in CASES],
)
def test_the_plan_stops_no_more_than_any_valid_layout_would(
    model_key: str, layout: list[str], busy: list[int], label: str, wanted: dict[str, int]
) -> None:
    model = MODELS[model_key]
    backend = _backend(model_key, layout, busy)
    live, procs = _live(backend, model)
    assert sum(procs) == len(busy)
    best = min(_cost(candidate, live, procs) for candidate in _every_layout(model, wanted))
    gpu = _plan(backend, wanted)
    assert not gpu.problems, gpu.problems
    stopped = {p.pid for a in gpu.actions for p in a.processes}
    removed = [a for a in gpu.actions if a.marker == "-"]
    assert (len(stopped), len(removed)) == best, (label, [(a.marker, a.text) for a in gpu.actions])
    # What the plan aims for is the wanted instances, whatever it keeps.
    assert gpu.mig is None or Counter(
        model.profile(i.profile_id).name for i in gpu.mig.layout.instances
    ) == Counter(wanted)


def test_the_issues_example_keeps_a_gpu_that_already_holds_the_layout() -> None:
    # H100 with 1g@0, 1g@1, 2g@2, 3g@4 and a process on each: all-balanced asks for exactly these.
    backend = _backend("H100-80GB", ["1g.10gb:0", "1g.10gb:1", "2g.20gb:2", "3g.40gb:4"], [0, 1, 2, 3])
    gpu = _plan(backend, {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
    assert gpu.actions == [] or not any(a.disruptive for a in gpu.actions), gpu.actions
    # The canonical solver alone would have moved three of the four (and stopped their processes).
    canonical = solve(MODELS["H100-80GB"], {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}).placements
    assert [str(p) for p in canonical] != ["1g.10gb@0", "1g.10gb@1", "2g.20gb@2", "3g.40gb@4"]


def test_solve_keeping_prefers_the_instances_with_more_processes() -> None:
    model = MODELS["H100-80GB"]
    one_g = model.profile("1g.10gb")
    live = [Placement(one_g.name, one_g.id, s, 1) for s in range(7)]
    # A 3g.40gb fits at 0 or 4: where the 1g instances it replaces hold fewer processes.
    for procs, start in (([5, 0, 0, 0, 1, 1, 1], 4), ([0, 0, 0, 0, 9, 0, 0], 0)):
        result = solve_keeping(model, {"3g.40gb": 1, "1g.10gb": 3}, live, procs)
        assert result.ok
        (big,) = [p for p in result.placements if p.profile == "3g.40gb"]
        assert big.start == start, (procs, [str(p) for p in result.placements])
    assert not solve_keeping(model, {"7g.80gb": 2}, live).ok  # what cannot fit still says why
