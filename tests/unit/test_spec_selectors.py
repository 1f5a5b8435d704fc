"""Node selectors and GPU index sets."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuops.spec import (
    LabelTerm,
    Selector,
    SelectorError,
    format_gpu_indices,
    parse_gpu_indices,
    parse_selector,
)
from gpuops.spec.selectors import MAX_GPU_INDEX


def test_parse_selector() -> None:
    assert parse_selector("*") == Selector()
    assert parse_selector("gpu-a-*") == Selector(names=("gpu-a-*",))
    assert parse_selector(" gpu-a-* , zone=a ,rack!=r1") == Selector(
        names=("gpu-a-*",), labels=(LabelTerm("zone", "a"), LabelTerm("rack", "r1", negate=True))
    )
    assert parse_selector("topology.kubernetes.io/zone=eu-*") == Selector(
        labels=(LabelTerm("topology.kubernetes.io/zone", "eu-*"),)
    )
    assert str(parse_selector("a*,b,zone!=x")) == "a*,b,zone!=x"


def test_selector_semantics() -> None:
    sel = parse_selector("a1,a2,zone=a")
    assert sel.matches("a1", {"zone": "a"})
    assert not sel.matches("a1", {"zone": "b"})
    assert not sel.matches("a3", {"zone": "a"})
    assert parse_selector("zone!=a").matches("x", {})  # no label: not equal
    assert not parse_selector("zone=a").matches("x", {})
    assert parse_selector("zone=").matches("x", {"zone": ""})
    assert parse_selector("*").matches("anything", {})
    assert not parse_selector("A*").matches("a1", {})  # case-sensitive


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty selector (use '*' for every node)"),
        ("  ", "empty selector (use '*' for every node)"),
        ("a,,b", "empty term in selector 'a,,b'"),
        ("zone==a", "'=a' is not a label value (in 'zone==a')"),
        ("bad key=a", "'bad key' is not a label name (in 'bad key=a')"),
        ("=a", "'' is not a label name (in '=a')"),
        ("zone=a b", "'a b' is not a label value (in 'zone=a b')"),
        ("gpu 1", "'gpu 1' is neither a node-name glob nor label=value"),
        ("-oFoo", "'-oFoo' is neither a node-name glob nor label=value"),
        ("a;b", "'a;b' is neither a node-name glob nor label=value"),
    ],
)
def test_bad_selectors(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_selector(text)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("text", "indices"),
    [
        ("0", {0}),
        (3, {3}),
        ("0-3", {0, 1, 2, 3}),
        ("4,5", {4, 5}),
        (" 0 - 1 , 6 ", {0, 1, 6}),
        ("7-7", {7}),
        (f"0-{MAX_GPU_INDEX}", set(range(MAX_GPU_INDEX + 1))),
    ],
)
def test_parse_gpu_indices(text: str | int, indices: set[int]) -> None:
    assert parse_gpu_indices(text) == frozenset(indices)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "no GPU indices given"),
        ("a", "'a' is not a GPU index or range such as 0-3"),
        ("-1", "'-1' is not a GPU index or range such as 0-3"),
        ("1.5", "'1.5' is not a GPU index or range such as 0-3"),
        ("3-1", "range '3-1' runs backwards (write 1-3)"),
        ("0,0", "GPU 0 is listed twice in '0,0'"),
        ("0-3,2-5", "GPU 2 is listed twice in '0-3,2-5'"),
        ("256", "GPU index 256 is out of range (0 to 255)"),
        ("0-9999999999", "'0-9999999999' is not a GPU index or range such as 0-3"),
        ("0,", "'' is not a GPU index or range such as 0-3"),
    ],
)
def test_bad_gpu_indices(text: str, message: str) -> None:
    with pytest.raises(SelectorError) as info:
        parse_gpu_indices(text)
    assert str(info.value) == message


def test_bool_is_not_an_index() -> None:
    with pytest.raises(SelectorError):
        parse_gpu_indices(True)


def test_format_gpu_indices() -> None:
    assert format_gpu_indices({0, 1, 2, 3, 6}) == "0-3,6"
    assert format_gpu_indices(set()) == ""
    assert format_gpu_indices({5}) == "5"


@given(st.sets(st.integers(0, MAX_GPU_INDEX), min_size=1))
def test_gpu_index_format_round_trips(indices: set[int]) -> None:
    assert parse_gpu_indices(format_gpu_indices(indices)) == indices
