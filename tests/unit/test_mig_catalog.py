"""The MIG catalog against reference/mig-mps.md section 2, table by table, row by row."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from gpuops.core.mig import catalog
from gpuops.core.mig.catalog import (
    MODELS,
    Engines,
    MigModel,
    UnknownProfileError,
    find_model,
    model_for_gpu,
    model_for_pci_device_id,
)

A100_40 = MODELS["A100-SXM4-40GB"]
A100_80 = MODELS["A100-80GB"]
H100 = MODELS["H100-80GB"]
H100_PCIE = MODELS["H100-PCIE-80GB"]
H200 = MODELS["H200-141GB"]
A30 = MODELS["A30-24GB"]
EIGHT_SLICE = (A100_40, A100_80, H100, H100_PCIE, H200)


def test_the_models() -> None:
    assert set(MODELS) == {
        "A100-SXM4-40GB",
        "A100-80GB",
        "H100-80GB",
        "H100-PCIE-80GB",
        "H200-141GB",
        "A30-24GB",
        "H100-NVL-94GB",
        "H100-96GB",
        "GH200-96GB",
        "GH200-144GB",
        "H20-96GB",
        "PG506-96GB",
        "B200",
        "GB200",
        "B300",
        "GB300",
        "RTX-PRO-6000-96GB",
    }
    for key, model in MODELS.items():
        assert model.key == key


# ------------------------------------------------------------------------------------------
# 8-slice table: enum, id, name per model, max, placements {starts}:size.
# (enum, id, A100-40GB, A100-80GB, H100-80GB, H200-141GB, max, starts, size)
EIGHT_SLICE_TABLE = [
    (0, 19, "1g.5gb", "1g.10gb", "1g.10gb", "1g.18gb", 7, (0, 1, 2, 3, 4, 5, 6), 1),
    (7, 20, "1g.5gb+me", "1g.10gb+me", "1g.10gb+me", "1g.18gb+me", 1, (0, 1, 2, 3, 4, 5, 6), 1),
    (9, 15, "1g.10gb", "1g.20gb", "1g.20gb", "1g.35gb", 4, (0, 2, 4, 6), 2),
    (1, 14, "2g.10gb", "2g.20gb", "2g.20gb", "2g.35gb", 3, (0, 2, 4), 2),
    (2, 9, "3g.20gb", "3g.40gb", "3g.40gb", "3g.71gb", 2, (0, 4), 4),
    (3, 5, "4g.20gb", "4g.40gb", "4g.40gb", "4g.71gb", 1, (0,), 4),
    (4, 0, "7g.40gb", "7g.80gb", "7g.80gb", "7g.141gb", 1, (0,), 8),
]


@pytest.mark.parametrize("row", EIGHT_SLICE_TABLE, ids=[r[2] for r in EIGHT_SLICE_TABLE])
def test_eight_slice_profile_table(row: tuple) -> None:  # type: ignore[type-arg]
    enum, pid, n40, n80, nh100, nh200, max_count, starts, size = row
    for model, name in ((A100_40, n40), (A100_80, n80), (H100, nh100), (H100_PCIE, nh100), (H200, nh200)):
        p = model.profile(pid)
        assert (p.enum, p.id, p.name) == (enum, pid, name), model.key
        assert p.max_count == max_count
        assert p.placements == starts
        assert p.memory_slices == size
        assert p.compute_slices == int(name.split("g.")[0])
        assert model.profile(name) is p
        assert model.profile_by_enum(enum) is p


def test_slice_counts() -> None:
    for m in EIGHT_SLICE:
        assert (m.memory_slice_count, m.compute_slice_count) == (8, 7), m.key
    assert (A30.memory_slice_count, A30.compute_slice_count) == (4, 4)


# Resources from `nvidia-smi mig -lgip` [obs]: id -> (GiB, SMs, DEC/CE/JPG/OFA).
A100_40_RESOURCES = {
    19: (4.75, 14, (0, 1, 0, 0)),
    20: (4.75, 14, (1, 1, 1, 1)),
    15: (9.62, 14, (1, 1, 0, 0)),
    14: (9.62, 28, (1, 2, 0, 0)),
    9: (19.50, 42, (2, 3, 0, 0)),
    5: (19.50, 56, (2, 4, 0, 0)),
    0: (39.25, 98, (5, 7, 1, 1)),
}
A100_80_RESOURCES = {
    19: (9.50, 14),
    20: (9.50, 14),
    15: (19.50, 14),
    14: (19.50, 28),
    9: (39.25, 42),
    5: (39.25, 56),
    0: (79.00, 98),
}
H100_RESOURCES = {
    19: (9.75, 16, (1, 1, 1, 0)),
    20: (9.75, 16, (1, 1, 1, 1)),
    15: (19.62, 26, (1, 1, 1, 0)),
    14: (19.62, 32, (2, 2, 2, 0)),
    9: (39.50, 60, (3, 3, 3, 0)),
    5: (39.50, 64, (4, 4, 4, 0)),
    0: (79.25, 132, (7, 8, 7, 1)),
}


def _gib_matches(mib: int, gib: float) -> bool:
    """nvidia-smi prints MiB / 1024 with two decimals (9.625 shows as 9.62)."""
    return abs(mib / 1024 - gib) <= 0.0051


@pytest.mark.parametrize("pid", sorted(A100_40_RESOURCES))
def test_a100_40gb_resources(pid: int) -> None:
    gib, sms, engines = A100_40_RESOURCES[pid]
    p = A100_40.profile(pid)
    assert _gib_matches(p.memory_mib, gib)
    assert p.multiprocessor_count == sms
    assert p.engines == Engines(*engines)
    assert not p.inferred or p.inferred_fields == ("driver_order",)


def test_a100_40gb_memory_size_mb_exact() -> None:
    """NVML memorySizeMB = GiB x 1024, as the reference gives it."""
    assert [A100_40.profile(i).memory_mib for i in (19, 14, 9, 0)] == [4864, 9856, 19968, 40192]


@pytest.mark.parametrize("pid", sorted(A100_80_RESOURCES))
def test_a100_80gb_resources(pid: int) -> None:
    gib, sms = A100_80_RESOURCES[pid]
    p = A100_80.profile(pid)
    assert _gib_matches(p.memory_mib, gib)
    assert p.multiprocessor_count == sms
    # engines are not in the reference: the A100-40GB figures, marked inferred
    assert p.engines == A100_40.profile(pid).engines
    assert "engines" in p.inferred_fields and p.inferred


@pytest.mark.parametrize("pid", sorted(H100_RESOURCES))
def test_h100_80gb_resources(pid: int) -> None:
    gib, sms, engines = H100_RESOURCES[pid]
    p = H100.profile(pid)
    assert _gib_matches(p.memory_mib, gib)
    assert p.multiprocessor_count == sms
    assert p.engines == Engines(*engines)
    assert set(p.inferred_fields) <= {"driver_order"}


def test_h100_pcie_is_a_114_sm_part_and_marked_inferred() -> None:
    assert H100_PCIE.multiprocessor_count == 114
    assert H100_PCIE.profile("7g.80gb").multiprocessor_count == 114
    assert all(p.multiprocessor_count <= 114 for p in H100_PCIE.profiles)
    assert all(p.inferred and "multiprocessor_count" in p.inferred_fields for p in H100_PCIE.profiles)
    # not the SXM figures copied
    assert H100_PCIE.profile(19).multiprocessor_count != H100.profile(19).multiprocessor_count


def test_h200_is_marked_inferred() -> None:
    assert all(p.inferred for p in H200.profiles)
    data = {"memory_mib", "multiprocessor_count", "engines", "placements"}
    assert all(data <= set(p.inferred_fields) for p in H200.profiles)
    assert H200.profile("7g.141gb").memory_mib <= H200.memory_total_mib


# A30-24GB [obs]: (enum, id, name, max, GiB, SMs, starts, size)
A30_TABLE = [
    (0, 14, "1g.6gb", 4, 5.81, 14, (0, 1, 2, 3), 1),
    (7, 21, "1g.6gb+me", 1, 5.81, 14, (0, 1, 2, 3), 1),
    (1, 5, "2g.12gb", 2, 11.69, 28, (0, 2), 2),
    (8, 6, "2g.12gb+me", 1, 11.69, 28, (0, 2), 2),
    (3, 0, "4g.24gb", 1, 23.44, 56, (0,), 4),
]


@pytest.mark.parametrize("row", A30_TABLE, ids=[r[2] for r in A30_TABLE])
def test_a30_table(row: tuple) -> None:  # type: ignore[type-arg]
    enum, pid, name, max_count, gib, sms, starts, size = row
    p = A30.profile(name)
    assert (p.enum, p.id, p.name, p.max_count) == (enum, pid, name, max_count)
    assert _gib_matches(p.memory_mib, gib)
    assert p.multiprocessor_count == sms
    assert p.placements == starts and p.memory_slices == size
    assert "engines" in p.inferred_fields  # engines are not in the reference
    assert A30.profile(pid) is p


def test_a30_has_exactly_these_profiles() -> None:
    assert [p.name for p in A30.profiles] == [r[2] for r in A30_TABLE]


def test_minimum_drivers() -> None:
    for m in (*EIGHT_SLICE, A30):
        for p in m.profiles:
            if p.name.endswith("+me") and p.compute_slices == 1:
                assert p.min_driver == 470, (m.key, p.name)
    assert A100_40.profile("1g.10gb").min_driver == 525
    assert A100_80.profile("1g.20gb").min_driver == 525
    assert A30.profile("2g.12gb+me").min_driver == 525
    assert A100_40.profile("3g.20gb").min_driver == 0


# ------------------------------------------------------------------------------------------
# Compute instance profiles.

CI_TABLE = {  # GI compute slices -> {CI slices: max count}; the largest is the default
    1: {1: 1},
    2: {1: 2, 2: 1},
    3: {1: 3, 2: 1, 3: 1},
    4: {1: 4, 2: 2, 4: 1},
    7: {1: 7, 2: 3, 3: 2, 4: 1, 7: 1},
}
CI_IDS = {1: 0, 2: 1, 3: 2, 4: 3, 7: 4}


@pytest.mark.parametrize("model", list(MODELS.values()), ids=list(MODELS))
def test_compute_profiles(model: MigModel) -> None:
    for gi in model.profiles:
        cps = gi.compute_profiles
        assert {c.slices: c.max_count for c in cps} == CI_TABLE[gi.compute_slices], gi.name
        defaults = [c for c in cps if c.default]
        assert len(defaults) == 1
        d = defaults[0]
        assert d.slices == gi.compute_slices and d.name == gi.name
        assert d.multiprocessor_count == gi.multiprocessor_count
        assert gi.default_compute_profile is d
        for c in cps:
            assert c.id == CI_IDS[c.slices]
            if not c.default:
                assert c.name == f"{c.slices}c.{gi.name}"
            assert len(c.placements) >= c.max_count
            assert all(s >= 0 and s + c.slices <= gi.compute_slices for s in c.placements)
            # the largest number of CIs of one profile never needs more SMs than the GI has
            assert c.max_count * c.multiprocessor_count <= gi.multiprocessor_count
            assert gi.compute_profile(c.id) is c
            assert gi.compute_profile(c.name.upper()) is c
            assert gi.compute_profile(f"{c.slices}c") is c


def test_compute_profile_examples() -> None:
    gi = A100_40.profile("3g.20gb")
    assert [(c.name, c.id, c.multiprocessor_count) for c in gi.compute_profiles] == [
        ("1c.3g.20gb", 0, 14),
        ("2c.3g.20gb", 1, 28),
        ("3g.20gb", 2, 42),
    ]
    assert 2 not in {c.slices for c in A100_40.profile("1g.10gb").compute_profiles}
    assert 3 not in {c.slices for c in A100_40.profile("4g.20gb").compute_profiles}  # no 3c in 4g
    with pytest.raises(KeyError, match=r"1c\.3g\.20gb"):
        gi.compute_profile("4c")


# ------------------------------------------------------------------------------------------
# Structural invariants and the driver's default order.


INFERABLE = {"id", "memory_mib", "multiprocessor_count", "engines", "placements", "driver_order"}


@pytest.mark.parametrize("model", list(MODELS.values()), ids=list(MODELS))
def test_invariants(model: MigModel) -> None:
    ids = [p.id for p in model.profiles]
    names = [p.name.lower() for p in model.profiles]
    assert len(set(ids)) == len(ids) and len(set(names)) == len(names)
    assert len({p.enum for p in model.profiles}) == len(model.profiles)
    for p in model.profiles:
        assert p.placements == tuple(sorted(p.placements))
        assert all(s >= 0 and s + p.memory_slices <= model.memory_slice_count for s in p.placements)
        assert sorted(p.driver_order) == list(p.placements), p.name
        assert 1 <= p.max_count <= len(p.placements)
        assert p.compute_slices <= model.compute_slice_count
        assert p.memory_mib <= model.memory_total_mib
        assert p.multiprocessor_count <= model.multiprocessor_count
        assert p.inferred == bool(p.inferred_fields)
        assert set(p.inferred_fields) <= INFERABLE
        if "driver_order" not in p.inferred_fields and len(p.placements) > 1:
            assert p.compute_slices == 1 and not p.name.endswith("+me")  # only 1g's order is observed
        for attr in ("decoders", "copy_engines", "jpeg", "ofa"):
            assert getattr(p.engines, attr) <= getattr(model.engines, attr)
    full = model.full_profile
    assert full.memory_slices == model.memory_slice_count
    assert full.compute_slices == model.compute_slice_count


def test_driver_order_of_1g_is_the_observed_one() -> None:
    for m in EIGHT_SLICE:
        p = m.profile(19)
        assert p.driver_order == (6, 4, 5, 0, 1, 2, 3)
        assert "driver_order" not in p.inferred_fields
    assert A100_40.profile("3g.20gb").driver_order == (4, 0)
    assert A100_40.profile("2g.10gb").driver_order == (4, 2, 0)


def test_dataclasses_are_frozen() -> None:
    p = A100_40.profile(19)
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.max_count = 3  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        A100_40.key = "x"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.engines.ofa = 2  # type: ignore[misc]


def test_catalog_module_is_pure() -> None:
    """core/mig imports nothing that does I/O."""
    allowed = {
        "__future__",
        "dataclasses",
        "typing",
        "re",
        "hashlib",
        "json",
        "gpuops.core.mig.catalog",
        "gpuops.core.model",
    }
    for path in Path(catalog.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                mods = {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                mods = {node.module or ""}
            else:
                continue
            assert mods <= allowed, (path.name, mods)


# ------------------------------------------------------------------------------------------
# Finding a model.


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("a100-sxm4-40gb", "A100-SXM4-40GB"),
        ("A100-40GB", "A100-SXM4-40GB"),
        ("A100-PCIE-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100-SXM4-40GB", "A100-SXM4-40GB"),
        ("NVIDIA A100-PCIE-40GB", "A100-SXM4-40GB"),
        ("  nvidia a100-pcie-40gb ", "A100-SXM4-40GB"),
        ("A100-80GB", "A100-80GB"),
        ("A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB"),
        ("A100-PCIE-80GB", "A100-80GB"),
        ("H100-80GB", "H100-80GB"),
        ("NVIDIA H100 80GB HBM3", "H100-80GB"),
        ("H100-SXM5-80GB", "H100-80GB"),
        ("H100-PCIE-80GB", "H100-PCIE-80GB"),
        ("NVIDIA H100 PCIe", "H100-PCIE-80GB"),
        ("h100-pcie", "H100-PCIE-80GB"),
        ("H200-141GB", "H200-141GB"),
        ("H200", "H200-141GB"),
        ("NVIDIA H200", "H200-141GB"),
        ("NVIDIA H200 NVL", "H200-141GB"),
        ("A30-24GB", "A30-24GB"),
        ("A30", "A30-24GB"),
        ("NVIDIA A30", "A30-24GB"),
        ("a30", "A30-24GB"),
    ],
)
def test_find_model(text: str, key: str) -> None:
    m = find_model(text)
    assert m is not None and m.key == key


@pytest.mark.parametrize(
    "text", ["", "A100", "H100", "B100", "NVIDIA H100 SXM9", "V100", "NVIDIA", "A30-48GB"]
)
def test_find_model_unknown(text: str) -> None:
    assert find_model(text) is None


def test_every_spelling_finds_its_own_model() -> None:
    for m in MODELS.values():
        for name in m.names:
            assert find_model(name) is m
            assert find_model(name.upper()) is m
            assert find_model(name.lower()) is m


@pytest.mark.parametrize(
    ("device", "key"),
    [
        (0x20B0, "A100-SXM4-40GB"),
        (0x20F1, "A100-SXM4-40GB"),
        (0x20B2, "A100-80GB"),
        (0x20B5, "A100-80GB"),
        (0x20B7, "A30-24GB"),
        (0x2330, "H100-80GB"),
        (0x2331, "H100-PCIE-80GB"),
        (0x2335, "H200-141GB"),
        (0x233B, "H200-141GB"),
        # every id NVIDIA's mig-parted configs name
        (0x20B1, "A100-SXM4-40GB"),
        (0x20F6, "A100-SXM4-40GB"),
        (0x20F3, "A100-80GB"),
        (0x20F5, "A100-80GB"),
        (0x2324, "H100-80GB"),
        (0x2322, "H100-PCIE-80GB"),
        (0x2321, "H100-NVL-94GB"),
        (0x233A, "H100-NVL-94GB"),
        (0x233D, "H100-96GB"),
        (0x2342, "GH200-96GB"),
        (0x2348, "GH200-144GB"),
        (0x2329, "H20-96GB"),
        (0x20B6, "PG506-96GB"),
        (0x2901, "B200"),
        (0x2941, "GB200"),
        (0x3182, "B300"),
        (0x31C2, "GB300"),
        (0x2BB5, "RTX-PRO-6000-96GB"),
    ],
)
def test_model_for_pci_device_id(device: int, key: str) -> None:
    full = (device << 16) | 0x10DE
    for value in (device, full):
        m = model_for_pci_device_id(value)
        assert m is not None and m.key == key
        assert full in m.pci_device_ids


@pytest.mark.parametrize("value", [0x26B9, 0x26B910DE, 0x1FB0, 0x1DB4, 0x20B01002, 0, -1])
def test_model_for_pci_device_id_unknown(value: int) -> None:
    """GPUs without MIG (L40S 26B9, the DGX Station's display GPU 1FB0) and other vendors."""
    assert model_for_pci_device_id(value) is None


def test_model_for_gpu_prefers_the_pci_id() -> None:
    assert model_for_gpu("NVIDIA A30", 0x233010DE) is H100
    assert model_for_gpu("NVIDIA A30", 0x1DB410DE) is A30  # unknown id: falls back to the name
    assert model_for_gpu("NVIDIA A30") is A30
    assert model_for_gpu("Tesla V100-SXM2-16GB", 0x1DB110DE) is None


# ------------------------------------------------------------------------------------------
# Profile lookup.


def test_profile_lookup() -> None:
    p = A100_40.profile("3g.20gb")
    assert A100_40.profile("3G.20GB") is p
    assert A100_40.profile(" MIG 3g.20gb ") is p
    assert A100_40.profile(9) is p
    assert A100_40.profile("9") is p
    assert A100_40.find_profile("nope") is None
    assert A100_40.find_profile(True) is None


@pytest.mark.parametrize("bad", ["3g.40gb", "5g.20gb", "", 99, "99", 2])
def test_profile_lookup_errors_list_the_valid_profiles(bad: object) -> None:
    with pytest.raises(KeyError) as info:
        A100_40.profile(bad)  # type: ignore[arg-type]
    assert isinstance(info.value, UnknownProfileError)
    message = str(info.value)
    for p in A100_40.profiles:
        assert p.name in message
    assert "A100-SXM4-40GB" in message
    assert "\n" not in message


def test_sizes_belong_to_the_model_not_the_profile_name() -> None:
    """1g.18gb: 16.00 GiB on the H200 (mig-parted issue #120), 17.50 on the GH200 144G (PR #139)."""
    assert MODELS["H200-141GB"].profile("1g.18gb").memory_mib == 16384
    assert MODELS["GH200-144GB"].profile("1g.18gb").memory_mib == 17920
    b200 = MODELS["B200"].profile("1g.23gb")  # 22.00 GiB (PR #166); PR #187 printed 20.50
    assert (b200.memory_mib, b200.multiprocessor_count, b200.id) == (22528, 18, 19)
    nvl = MODELS["H100-NVL-94GB"]
    assert _gib_matches(nvl.profile("1g.12gb").memory_mib, 10.75)
    assert _gib_matches(nvl.profile("1g.24gb").memory_mib, 21.62)
    rtx = MODELS["RTX-PRO-6000-96GB"].profile("1g.24gb")
    assert (rtx.id, rtx.multiprocessor_count, rtx.memory_slices) == (14, 46, 1)
    assert _gib_matches(rtx.memory_mib, 23.12) and rtx.inferred_fields == ("placements", "driver_order")
    assert MODELS["GB200"].profile("3g.95gb") is MODELS["GB200"].profile("3g.93gb")  # older name


def test_attributes_of_blackwell_profiles() -> None:
    rtx = MODELS["RTX-PRO-6000-96GB"]
    assert [p.name for p in rtx.profiles if p.media_extensions] == [
        "1g.24gb+me",
        "1g.24gb+me.all",
        "2g.48gb+me.all",
    ]
    assert rtx.profile("1g.24gb-me").engines.decoders == 0
