"""Pools in fleet.yaml: members, guarantees, carving; located errors for what is wrong."""

from __future__ import annotations

import textwrap

import pytest

from gpuops.spec import SpecError, parse_fleet

BASE = """\
version: 1
teams:
  vision: {users: [alice]}
  speech: {users: [heidi]}
nodes:
  - {name: a, host: 127.0.0.1, owner: vision, labels: {rack: r1}}
  - {name: b, host: 127.0.0.2, owner: speech}
"""


def _errors(text: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_fleet(BASE + textwrap.dedent(text), "f.yaml")
    return [str(i) for i in info.value.errors]


def test_a_pool_selects_its_members_and_keeps_owners() -> None:
    fleet = parse_fleet(
        BASE
        + textwrap.dedent(
            """\
            pools:
              shared:
                gpus: [{nodes: "rack=r1"}, {nodes: b, gpus: "2-3"}]
                policy: fixed-share
                borrowing: false
                carving: mig
                guarantees: {vision: 30%, speech: {share: 50, memory: 40GiB}}
            carve:
              - {select: {nodes: a}, pool: shared, limiter: {tenants: {vision: {compute: 30%}}}}
            """
        ),
        "f.yaml",
    )
    assert fleet.pool_of("a", 5) == "shared"
    assert [fleet.pool_of("b", i) for i in range(5)] == [None, None, "shared", "shared", None]
    pool = fleet.pools["shared"]
    assert (pool.policy, pool.borrowing, pool.carving) == ("fixed-share", False, "mig")
    assert pool.guarantees["speech"].share == 50.0 and pool.guarantees["speech"].memory == 40 << 30
    assert fleet.gpu_owner("b", 2) == "speech"  # a pooled GPU keeps its owner
    assert fleet.carve[0].pool == "shared"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "pools: {shared: {gpus: [{nodes: a}], guarantees: {vision: 60%, speech: 50%}}}\n",
            "f.yaml:8:38: pools.shared.guarantees: the guarantees add up to 110% of the pool; at most 100%",
        ),
        (
            "pools: {shared: {guarantees: {vison: 10%}}}\n",
            "f.yaml:8:31: pools.shared.guarantees.vison: no team named 'vison'; did you mean 'vision'?",
        ),
        (
            "pools: {p1: {gpus: [{nodes: b, gpus: '0-1'}]}, p2: {gpus: [{nodes: b, gpus: '1'}]}}\n",
            "f.yaml:8:60: pools.p2.gpus[0]: GPUs of node 'b' are already in pool 'p1'",
        ),
        (
            "pools: {shared: {carving: slices}}\n",
            "f.yaml:8:27: pools.shared.carving: carving must be one of limiter, mig",
        ),
        (
            "pools: {shared: {policy: best-effort}}\n",
            "f.yaml:8:26: pools.shared.policy: policy must be one of",
        ),
        (
            "pools: {shared: {guarantees: {vision: 0%}}}\n",
            "f.yaml:8:31: pools.shared.guarantees.vision.share: must be more than 0% (got '0%'); "
            "a share of the pool",
        ),
        (
            "carve: [{select: {nodes: a}, pool: sharde, limiter: {tenants: {vision: {compute: 5%}}}}]\n"
            "pools: {shared: {}}\n",
            "f.yaml:8:36: carve[0].pool: no pool named 'sharde'; did you mean 'shared'?",
        ),
    ],
)
def test_pool_mistakes_are_located(text: str, expected: str) -> None:
    errors = _errors(text)
    assert any(e.startswith(expected) for e in errors), errors
    assert all("\n" not in e for e in errors)
