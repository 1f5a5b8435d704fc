"""The placement solver, checked exhaustively against an independent brute force, for every model.

The brute force below shares nothing with the solver but the catalog's data: it tries every
combination of allowed starts and checks the rules directly.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuops.core.mig.catalog import MODELS, GpuInstanceProfile, MigModel
from gpuops.core.mig.placement import (
    Placement,
    PlacementResult,
    available_starts,
    check_layout,
    driver_start,
    slice_map,
    solve,
)
from tests.hypothesis_budget import examples

A100_40 = MODELS["A100-SXM4-40GB"]
A30 = MODELS["A30-24GB"]
ENGINES = ("decoders", "copy_engines", "jpeg", "ofa")

Counts = tuple[tuple[GpuInstanceProfile, int], ...]


# ------------------------------------------------------------------------------------------
# The independent brute force.


def gpu_engines(model: MigModel) -> dict[str, int]:
    """What a whole-GPU instance owns: the GPU's engines."""
    whole = max(model.profiles, key=lambda p: p.memory_slices)
    return {e: getattr(whole.engines, e) for e in ENGINES}


def totals_fit(model: MigModel, profiles: Sequence[GpuInstanceProfile]) -> bool:
    """Max counts, compute slices and engines: what does not depend on where instances go."""
    counts = Counter(p.name for p in profiles)
    if any(counts[p.name] > p.max_count for p in model.profiles):
        return False
    if sum(p.compute_slices for p in profiles) > model.compute_slice_count:
        return False
    have = gpu_engines(model)
    return all(sum(getattr(p.engines, e) for p in profiles) <= have[e] for e in ENGINES)


def geometry_fits(model: MigModel, layout: Sequence[tuple[GpuInstanceProfile, int]]) -> bool:
    """Each instance at an allowed start, inside the GPU, no memory slice shared."""
    used: set[int] = set()
    for profile, start in layout:
        if start not in profile.placements:
            return False
        cells = set(range(start, start + profile.memory_slices))
        if cells & used or max(cells) >= model.memory_slice_count:
            return False
        used |= cells
    return True


def layout_is_valid(model: MigModel, layout: Sequence[tuple[GpuInstanceProfile, int]]) -> bool:
    return geometry_fits(model, layout) and totals_fit(model, [p for p, _ in layout])


def brute_force(
    model: MigModel, counts: Counts, pinned: Sequence[tuple[GpuInstanceProfile, int]] = ()
) -> list[tuple[GpuInstanceProfile, int]] | None:
    """A valid layout holding `pinned` plus `counts` more instances, or None: tries them all."""
    everything = [p for p, _ in pinned] + [p for p, n in counts for _ in range(n)]
    if not totals_fit(model, everything):
        return None
    options = [
        [[(p, s) for s in starts] for starts in itertools.combinations(p.placements, n)]
        for p, n in counts
        if n > 0
    ]
    for choice in itertools.product(*options):
        layout = list(pinned) + [ps for group in choice for ps in group]
        if geometry_fits(model, layout):
            assert layout_is_valid(model, layout)
            return layout
    return None


def multisets(model: MigModel, slack: int = 2) -> Iterator[Counts]:
    """Every multiset of profiles with at most max_count + 1 of each and at most
    memory_slice_count + slack memory slices: all that fit, and those just beyond every limit.
    Built profile by profile, stopping once over the slice budget (the RTX PRO 6000 has 11
    profiles: the full product would be millions of tuples)."""
    profiles = model.profiles
    budget = model.memory_slice_count + slack

    def extend(i: int, used: int, chosen: tuple[int, ...]) -> Iterator[Counts]:
        if i == len(profiles):
            yield tuple(zip(profiles, chosen, strict=True))
            return
        p = profiles[i]
        for n in range(min(p.max_count + 1, model.memory_slice_count // p.memory_slices + 1) + 1):
            if used + n * p.memory_slices > budget:
                break
            yield from extend(i + 1, used + n * p.memory_slices, (*chosen, n))

    yield from extend(0, 0, ())


def as_placements(layout: Sequence[tuple[GpuInstanceProfile, int]]) -> list[Placement]:
    return [Placement(p.name, p.id, s, p.memory_slices) for p, s in layout]


def result_layout(model: MigModel, result: PlacementResult) -> list[tuple[GpuInstanceProfile, int]]:
    return [(model.profile(p.profile), p.start) for p in result.placements]


def assert_good_answer(model: MigModel, result: PlacementResult, want: Counter[str]) -> None:
    assert result.ok and result.reason == ""
    layout = result_layout(model, result)
    assert layout_is_valid(model, layout)
    assert check_layout(model, result.placements) == result
    assert Counter(p.profile for p in result.placements) == want
    starts = [p.start for p in result.placements]
    assert starts == sorted(starts)
    for p in result.placements:
        assert (
            p.profile_id == model.profile(p.profile).id and p.size == model.profile(p.profile).memory_slices
        )


def assert_good_refusal(result: PlacementResult) -> None:
    assert not result.ok and result.placements == ()
    assert result.reason and "\n" not in result.reason


# ------------------------------------------------------------------------------------------
# Exhaustive, both directions.


@pytest.mark.parametrize("model", list(MODELS.values()), ids=list(MODELS))
def test_solve_accepts_exactly_the_feasible_multisets(model: MigModel) -> None:
    feasible = infeasible = 0
    for counts in multisets(model):
        expected = brute_force(model, counts)
        want = Counter({p.name: n for p, n in counts if n})
        result = solve(model, {p.name: n for p, n in counts})
        if expected is None:
            assert_good_refusal(result)
            infeasible += 1
        else:
            assert_good_answer(model, result, want)
            feasible += 1
        # names, ids and a flat list mean the same thing
        flat_ids = [p.id for p, n in counts for _ in range(n)]
        assert solve(model, flat_ids) == result
    assert feasible > 0 and infeasible > 0


@pytest.mark.parametrize("model", list(MODELS.values()), ids=list(MODELS))
def test_solve_around_every_pinned_instance(model: MigModel) -> None:
    """One instance pinned at each allowed start, every multiset around it."""
    for pin_profile in model.profiles:
        for pin_start in pin_profile.placements:
            pin = Placement(pin_profile.name, pin_profile.id, pin_start, pin_profile.memory_slices)
            room = model.memory_slice_count - pin_profile.memory_slices
            for counts in multisets(model, slack=0):
                if sum(n * p.memory_slices for p, n in counts) > room + 1:
                    continue
                expected = brute_force(model, counts, [(pin_profile, pin_start)])
                result = solve(model, {p.name: n for p, n in counts}, fixed=[pin])
                if expected is None:
                    assert_good_refusal(result)
                else:
                    want = Counter({p.name: n for p, n in counts if n})
                    want[pin_profile.name] += 1
                    assert_good_answer(model, result, want)
                    assert pin in result.placements


@pytest.mark.parametrize("model", list(MODELS.values()), ids=list(MODELS))
def test_check_layout_agrees_with_brute_force(model: MigModel) -> None:
    """Every layout of up to three instances at any start 0..memory_slice_count-1."""
    cells = [(p, s) for p in model.profiles for s in range(model.memory_slice_count)]
    for n in (1, 2, 3):
        for layout in itertools.combinations_with_replacement(cells, n):
            result = check_layout(model, as_placements(layout))
            assert result.ok == layout_is_valid(model, layout), layout
            if result.ok:
                assert sorted(result.placements, key=lambda p: p.start) == list(result.placements)
            else:
                assert_good_refusal(result)


# ------------------------------------------------------------------------------------------
# Order independence.


@settings(max_examples=examples(300), deadline=None)
@given(data=st.data())
def test_order_does_not_matter(data: st.DataObject) -> None:
    model = data.draw(st.sampled_from(list(MODELS.values())))
    names = data.draw(st.lists(st.sampled_from([p.name for p in model.profiles]), max_size=9))
    shuffled = data.draw(st.permutations(names))
    as_ids = [model.profile(n).id for n in data.draw(st.permutations(names))]
    base = solve(model, names)
    assert solve(model, shuffled) == base
    assert solve(model, as_ids) == base
    assert solve(model, dict(Counter(names))) == base


@settings(max_examples=examples(200), deadline=None)
@given(data=st.data())
def test_order_does_not_matter_around_pins(data: st.DataObject) -> None:
    model = data.draw(st.sampled_from(list(MODELS.values())))
    pin_profile = data.draw(st.sampled_from(model.profiles))
    start = data.draw(st.sampled_from(pin_profile.placements))
    pin = Placement(pin_profile.name, pin_profile.id, start, pin_profile.memory_slices)
    names = data.draw(st.lists(st.sampled_from([p.name for p in model.profiles]), max_size=6))
    base = solve(model, names, fixed=[pin])
    assert solve(model, data.draw(st.permutations(names)), fixed=[pin]) == base


# ------------------------------------------------------------------------------------------
# The examples of the issue, and specific reasons.


def test_issue_examples() -> None:
    first = solve(A100_40, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"])
    assert first.ok
    assert [(p.profile, p.start, p.size) for p in first.placements] == [
        ("2g.10gb", 0, 2),
        ("1g.5gb", 2, 1),
        ("1g.5gb", 3, 1),
        ("3g.20gb", 4, 4),
    ]
    assert slice_map(A100_40, first.placements) == (0, 0, 1, 2, 3, 3, 3, 3)

    again = solve(A100_40, ["1g.5gb", "1g.5gb", "2g.10gb", "3g.20gb"])
    assert again == first

    two_4g = solve(A100_40, ["4g.20gb", "4g.20gb"])
    assert not two_4g.ok
    assert two_4g.reason == "4g.20gb: at most 1 per GPU (asked for 2)"


def test_explicit_placements_with_fixed() -> None:
    """Pinning the 3g at 4 works; at 0 it leaves slot 7, where no 1g can start."""
    at4 = solve(A100_40, ["2g.10gb", "1g.5gb", "1g.5gb"], fixed=[Placement("3g.20gb", 9, 4, 4)])
    assert at4 == solve(A100_40, ["3g.20gb", "2g.10gb", "1g.5gb", "1g.5gb"])
    at0 = solve(A100_40, ["2g.10gb", "1g.5gb", "1g.5gb"], fixed=[Placement("3g.20gb", 9, 0, 4)])
    assert not at0.ok
    assert at0.reason == (
        "no arrangement of 2g.10gb, 1g.5gb x2 fits around 3g.20gb@0: e.g. once 2g.10gb@4, 1g.5gb@6 "
        "are placed too, 1g.5gb (allowed starts 0, 1, 2, 3, 4, 5, 6) has no free start"
    )
    # pinned and solved instances together; the pins are kept where they are
    r = solve(A100_40, {"1g.5gb": 2}, fixed=[Placement("2g.10gb", 14, 2, 2), Placement("3g.20gb", 9, 4, 4)])
    assert [(p.profile, p.start) for p in r.placements] == [
        ("1g.5gb", 0),
        ("1g.5gb", 1),
        ("2g.10gb", 2),
        ("3g.20gb", 4),
    ]


def test_reasons() -> None:
    cases = [
        (
            ["4g.20gb", "3g.20gb", "1g.5gb"],
            "needs 9 memory slices (4g.20gb: 4, 3g.20gb: 4, 1g.5gb: 1), the GPU has 8",
        ),
        (["7g.40gb", "1g.5gb"], "needs 9 memory slices (7g.40gb: 8, 1g.5gb: 1), the GPU has 8"),
        (
            ["1g.5gb"] * 7 + ["1g.5gb+me"],
            "needs 8 compute slices (1g.5gb x7: 7, 1g.5gb+me: 1), the GPU has 7",
        ),
        (
            ["4g.20gb", "2g.10gb", "2g.10gb"],
            "needs 8 compute slices (4g.20gb: 4, 2g.10gb x2: 4), the GPU has 7",
        ),
        (["1g.5gb+me", "1g.5gb+me"], "1g.5gb+me: at most 1 per GPU (asked for 2)"),
        (["1g.5gb"] * 8, "1g.5gb: at most 7 per GPU (asked for 8)"),
        (["3g.20gb"] * 3, "3g.20gb: at most 2 per GPU (asked for 3)"),
    ]
    for wanted, reason in cases:
        r = solve(A100_40, wanted)
        assert not r.ok and r.reason == reason, (wanted, r.reason)


def test_seven_1g_plus_anything_fails() -> None:
    for p in A100_40.profiles:
        r = solve(A100_40, ["1g.5gb"] * 7 + [p.name])
        assert not r.ok
        assert "compute slices" in r.reason or "memory slices" in r.reason or "at most" in r.reason


def test_a30_media_extensions_share_one_ofa() -> None:
    r = solve(A30, ["1g.6gb+me", "2g.12gb+me"])
    assert not r.ok
    assert r.reason == "needs 2 JPEG engines (2g.12gb+me: 1, 1g.6gb+me: 1), the GPU has 1"
    assert solve(A30, ["1g.6gb+me", "2g.12gb", "1g.6gb"]).ok
    assert solve(A30, ["2g.12gb+me", "2g.12gb"]).ok


def test_unknown_profiles_name_the_valid_ones() -> None:
    r = solve(A100_40, ["3g.20gb", "3g.40gb"])
    assert not r.ok
    assert r.reason.startswith("unknown profile '3g.40gb' for A100-SXM4-40GB; valid: 1g.5gb (19)")
    assert "7g.40gb (0)" in r.reason
    assert not solve(A100_40, [42]).ok
    assert not solve(A100_40, {"1g.5gb": -1}).ok
    assert not solve(A100_40, {"1g.5gb": 1.5}).ok  # type: ignore[dict-item]
    assert not solve(A100_40, [None]).ok  # type: ignore[list-item]


def test_empty_and_single() -> None:
    assert solve(A100_40, []) == PlacementResult(ok=True, placements=(), reason="")
    assert solve(A100_40, {"1g.5gb": 0}) == PlacementResult(ok=True, placements=(), reason="")
    one = solve(A100_40, "7g.40gb")
    assert one.ok and one.placements == (Placement("7g.40gb", 0, 0, 8),)
    assert bool(one) and not bool(solve(A100_40, "nope"))


def test_pinned_reasons() -> None:
    r = solve(A100_40, ["4g.20gb"], fixed=[Placement("1g.5gb", 19, 0, 1)])
    assert r.reason == "no free placement for 4g.20gb (allowed start 0) once 1g.5gb@0 is placed"
    r = solve(A100_40, ["3g.20gb"], fixed=[Placement("2g.10gb", 14, 2, 2), Placement("1g.5gb", 19, 6, 1)])
    assert (
        r.reason == "no free placement for 3g.20gb (allowed starts 0, 4) once 2g.10gb@2, 1g.5gb@6 are placed"
    )
    r = solve(A100_40, ["2g.10gb"] * 3, fixed=[Placement("1g.5gb", 19, 0, 1)])
    assert r.reason == (
        "no arrangement of 2g.10gb x3 fits around 1g.5gb@0: e.g. once 2g.10gb@2, 2g.10gb@4 are placed too, "
        "2g.10gb (allowed starts 0, 2, 4) has no free start"
    )
    r = solve(A100_40, ["4g.20gb"], fixed=[Placement("4g.20gb", 5, 0, 4)])
    assert r.reason == "4g.20gb: at most 1 per GPU (asked for 2, 1 of them already placed)"
    r = solve(A100_40, ["1g.5gb"], fixed=[Placement("3g.20gb", 9, 2, 4)])
    assert r.reason == "3g.20gb cannot start at memory slice 2 (allowed starts 0, 4)"


def test_check_layout_reasons() -> None:
    def reason(*ps: Placement) -> str:
        r = check_layout(A100_40, ps)
        assert not r.ok
        return r.reason

    assert reason(Placement("3g.20gb", 9, 0, 4), Placement("2g.10gb", 14, 2, 2)) == (
        "3g.20gb@0 overlaps 2g.10gb@2 (memory slices 2-3)"
    )
    assert reason(Placement("1g.5gb", 19, 3, 1), Placement("1g.10gb", 15, 2, 2)) == (
        "1g.10gb@2 overlaps 1g.5gb@3 (memory slice 3)"
    )
    assert reason(Placement("1g.5gb", 19, 7, 1)) == (
        "1g.5gb cannot start at memory slice 7 (allowed starts 0, 1, 2, 3, 4, 5, 6)"
    )
    assert reason(Placement("3g.20gb", 9, 0, 3)) == "3g.20gb@0: size 3, but 3g.20gb takes 4 memory slices"
    assert reason(Placement("3g.20gb", 5, 0, 4)) == "3g.20gb@0: profile id 5 is 4g.20gb, not 3g.20gb"
    assert reason(Placement("9g.1gb", 9, 0, 4)).startswith(
        "unknown profile '9g.1gb' for A100-SXM4-40GB; valid:"
    )
    # a placement with only an id is read by id
    ok = check_layout(A100_40, [Placement("", 9, 4, 4), Placement("3G.20GB", 9, 0, 4)])
    assert ok.ok and [p.profile for p in ok.placements] == ["3g.20gb", "3g.20gb"]
    assert check_layout(A100_40, []).ok


# ------------------------------------------------------------------------------------------
# The driver's default placement: a tiny greedy "driver" over driver_order.


def greedy_driver(model: MigModel, profile_ids: Sequence[int]) -> tuple[list[tuple[str, int]], int | None]:
    """`nvidia-smi mig -cgi a,b,c`: each GI goes at the first free start of its driver_order.
    Returns (created as (name, start), the profile id that failed with Insufficient Resources)."""
    taken: set[int] = set()
    made: list[tuple[GpuInstanceProfile, int]] = []
    for pid in profile_ids:
        p = model.profile(pid)
        for s in p.driver_order:
            cells = set(range(s, s + p.memory_slices))
            if not cells & taken and layout_is_valid(model, [*made, (p, s)]):
                taken |= cells
                made.append((p, s))
                break
        else:
            return [(q.name, s) for q, s in made], pid
    return [(q.name, s) for q, s in made], None


def test_driver_transcript_creation_order() -> None:
    """`-cgi 19,19,14,9` fails with Insufficient Resources on the 3g; `9,19,14,19` works."""
    for model in (MODELS["A100-SXM4-40GB"], MODELS["A100-80GB"], MODELS["H100-80GB"]):
        made, failed = greedy_driver(model, [19, 19, 14, 9])
        assert failed == 9, model.key
        assert [s for _, s in made] == [6, 4, 2]
        made, failed = greedy_driver(model, [9, 19, 14, 19])
        assert failed is None, model.key
        assert [s for _, s in made] == [4, 0, 2, 1]
        # and the solver agrees that the four fit
        assert solve(model, [19, 19, 14, 9]).ok


def test_driver_1g_slots() -> None:
    made, failed = greedy_driver(A100_40, [19] * 7)
    assert failed is None
    assert [s for _, s in made] == [6, 4, 5, 0, 1, 2, 3]
    _, failed = greedy_driver(A100_40, [19] * 8)
    assert failed == 19


def test_first_3g_lands_at_4() -> None:
    made, _ = greedy_driver(A100_40, [9, 9])
    assert made == [("3g.20gb", 4), ("3g.20gb", 0)]


def test_driver_start_matches_the_greedy_driver() -> None:
    for model in MODELS.values():
        for seq in itertools.product([p.id for p in model.profiles], repeat=3):
            made, failed = greedy_driver(model, seq)
            existing: list[Placement] = []
            for pid in seq:
                s = driver_start(model, existing, pid)
                if s is None:
                    assert failed == pid
                    break
                p = model.profile(pid)
                existing.append(Placement(p.name, p.id, s, p.memory_slices))
            assert [(p.profile, p.start) for p in existing] == made


def test_available_starts() -> None:
    three_g = [Placement("3g.20gb", 9, 4, 4)]
    assert available_starts(A100_40, three_g, "1g.5gb") == (0, 1, 2, 3)
    assert available_starts(A100_40, three_g, 9) == (0,)
    assert available_starts(A100_40, three_g, "4g.20gb") == (0,)
    assert available_starts(A100_40, [Placement("4g.20gb", 5, 0, 4)], "4g.20gb") == ()
    assert available_starts(A100_40, [], "nope") == ()
    assert driver_start(A100_40, [], "nope") is None
