"""spec/edit.py: an operator's fleet.yaml edited in place (a pool and its carve entries, or the
carve: section), read back by the real loader; everything not edited stays as written."""

from __future__ import annotations

import textwrap

import pytest

from gpuops.spec import parse_fleet
from gpuops.spec.edit import EditError, set_carve, set_pool

FLEET = textwrap.dedent(
    """\
    # our fleet: keep this comment
    version: 1
    teams:
      vision: {users: [alice]}
      robotics: {users: [judy]}
    nodes:
      - {name: gpu-a-01, host: "10.0.0.1", owner: robotics}   # the idle one
      - {name: gpu-b-01, host: 10.0.0.2, owner: vision}
    pools:
      other: {gpus: [{nodes: gpu-b-01, gpus: '1'}]}   # another pool, untouched
      shared:
        gpus: [{nodes: gpu-a-01, gpus: '0'}]
        guarantees: {vision: 50%}
    carve:
      - select: {nodes: gpu-b-01}   # the owner's own entry
        limiter: {tenants: {vision: {compute: 100%}}}
      - select: {nodes: gpu-a-01, gpus: '0'}
        pool: shared
        limiter: {policy: burst-share, tenants: {vision: {compute: 50%}}}
    """
)


def new_pool(gpus: list[dict[str, str]], carve: list[dict[str, object]]) -> dict[str, object]:
    """The whole new fleet.yaml data, as the rebalance planner hands it over."""
    return {"pools": {"shared": {"gpus": gpus, "guarantees": {"vision": "100%"}}}, "carve": carve}


OWNERS_ENTRY = {"select": {"nodes": "gpu-b-01"}, "limiter": {"tenants": {"vision": {"compute": "100%"}}}}


def test_a_pool_and_its_entries_are_replaced_and_the_rest_kept_as_written() -> None:
    pooled = {
        "select": {"nodes": "gpu-a-01", "gpus": "0-1"},
        "pool": "shared",
        "limiter": {"policy": "burst-share", "tenants": {"vision": {"compute": "100%"}}},
    }
    data = new_pool([{"nodes": "gpu-a-01", "gpus": "0-1"}], [OWNERS_ENTRY, pooled])
    text = set_pool(FLEET, "shared", data)
    for kept in (
        "# our fleet: keep this comment\n",
        '  - {name: gpu-a-01, host: "10.0.0.1", owner: robotics}   # the idle one\n',
        "  other: {gpus: [{nodes: gpu-b-01, gpus: '1'}]}   # another pool, untouched\n",
        "  - select: {nodes: gpu-b-01}   # the owner's own entry\n",
    ):
        assert kept in text
    fleet = parse_fleet(text)
    assert [fleet.pool_of("gpu-a-01", i) for i in range(3)] == ["shared", "shared", None]
    assert fleet.pool_of("gpu-b-01", 1) == "other"
    assert fleet.pools["shared"].guarantees["vision"].share == 100.0
    limiter = fleet.desired_for("gpu-a-01", 1).limiter
    assert limiter is not None and [t.name for t in limiter.tenants] == ["vision"]
    assert text.count("pool: shared") == 1


def test_a_new_pool_and_entries_come_after_what_is_written() -> None:
    bare = FLEET.split("pools:\n")[0]
    clear = {"select": {"nodes": "gpu-a-01", "gpus": "2"}, "pool": "fresh", "limiter": {"enabled": False}}
    data = {"pools": {"fresh": {"gpus": [{"nodes": "gpu-a-01", "gpus": "2"}]}}, "carve": [clear]}
    text = set_pool(bare, "fresh", data)
    assert text.startswith(bare)
    fleet = parse_fleet(text)
    assert fleet.pool_of("gpu-a-01", 2) == "fresh"
    cleared = fleet.desired_for("gpu-a-01", 2).limiter
    assert cleared is not None and not cleared.enabled


def test_strings_that_need_quotes_on_one_line_get_them() -> None:
    """`?pu-a-01` is a valid node glob; written bare inside `{...}` it is not valid YAML, and the
    Pool screen then wrote the whole file anew, dropping the operator's comments."""
    data = new_pool([{"nodes": "?pu-a-01", "gpus": "0-1"}], [OWNERS_ENTRY])
    text = set_pool(FLEET, "shared", data)
    assert "{nodes: '?pu-a-01', gpus: 0-1}" in text
    assert parse_fleet(text).pool_of("gpu-a-01", 1) == "shared"


def test_entries_that_do_not_line_up_are_refused() -> None:
    data = new_pool([{"nodes": "gpu-a-01"}], [])  # the owner's entry went missing
    with pytest.raises(EditError, match="do not line up"):
        set_pool(FLEET, "shared", data)
    with pytest.raises(EditError, match="no pool shared"):
        set_pool(FLEET, "shared", {"pools": {}})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("- a\n- b\n", "the fleet file is not a mapping"),
        ("version: 1\ncarve: {a: 1}\n", "carve is not a list"),
        ("version: [1\n", "not YAML: "),
    ],
)
def test_text_that_cannot_be_edited_is_one_line(text: str, message: str) -> None:
    with pytest.raises(EditError) as info:
        set_pool(text, "shared", new_pool([{"nodes": "x"}], []))
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_the_carve_section_is_replaced_as_export_writes_it() -> None:
    entries = [
        {"select": {"nodes": "gpu-a-01", "gpus": "0-1,3"}, "mig": {"enabled": False}},
        {
            "select": {"nodes": "gpu-b-01"},
            "mig": {"enabled": True, "placements": ["3g.40gb@0", "1g.10gb@4"]},
        },
    ]
    text = set_carve(FLEET, entries)
    assert text.startswith("# our fleet: keep this comment\n") and "# the idle one" in text
    assert "  - select: {nodes: gpu-a-01, gpus: '0-1,3'}\n    mig: {enabled: false}\n" in text
    assert "      placements: [3g.40gb@0, 1g.10gb@4]\n" in text
    assert "pool: shared" not in text
    fleet = parse_fleet(text)
    off = fleet.desired_for("gpu-a-01", 3, None, "NVIDIA A100-SXM4-80GB").mig
    assert off is not None and not off.enabled
    assert fleet.pool_of("gpu-a-01", 0) == "shared"  # pools: as written
    with pytest.raises(EditError, match="not a mapping"):
        set_carve("[]\n", entries)
