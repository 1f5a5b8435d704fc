"""The simulated AMD Instinct MI300X: partition modes with the amd backend's refusals, the figures
amdsmi gives (and the ones it does not), spec mistakes as one line with their path."""

from __future__ import annotations

import pytest

from gpuops.core.model import NotAvailable
from gpuops.node.backends.base import BackendError, BackendUnavailable
from gpuops.node.backends.sim import SimBackend

SPEC = {
    "hostname": "amd-a01",
    "gpus": [
        {"model": "MI300X", "count": 2, "owner": "llm", "partition": {"compute": "CPX", "memory": "NPS4"}},
        {"model": "AMD Instinct MI300X"},
        {"model": "H100-80GB"},
    ],
    "workloads": [{"kind": "training", "gpu": 1, "tenant": "llm"}],
}


def backend() -> SimBackend:
    return SimBackend(spec=SPEC, clock=lambda: 1.7e9)


def test_mi300x_identity_figures_and_modes() -> None:
    gpus = backend().sample().gpus
    amd, whole, nvidia = gpus[0], gpus[2], gpus[3]
    assert amd.info.name == "AMD Instinct MI300X" and amd.info.pci_device_id == 0x74A11002
    assert amd.info.memory_total_bytes == 196592 * 1024 * 1024 and amd.info.multiprocessor_count == 304
    assert amd.info.power_limit_watts == NotAvailable("NOT_SUPPORTED") and not amd.info.mig_capable
    assert amd.info.pci_bus_id == "0000:0c:00.0" and not amd.info.uuid.startswith("GPU-")
    assert amd.mig is None and amd.partition is not None
    assert (amd.partition.compute_mode, amd.partition.memory_mode, amd.partition.partitions) == (
        "CPX",
        "NPS4",
        8,
    )
    assert whole.partition is not None and whole.partition.compute_mode == "SPX"
    assert whole.partition.memory_mode == "NPS1" and whole.partition.partitions == 1
    assert nvidia.partition is None and nvidia.info.pci_bus_id.startswith("00000000:")
    assert amd.sample is not None and isinstance(amd.sample.power_watts, float)
    assert amd.sample.power_watts <= 750.0


def test_set_partition_refuses_busy_and_bad_modes_then_changes_an_idle_gpu() -> None:
    b = backend()
    with pytest.raises(BackendError) as busy:
        b.set_partition(1, "SPX", "NPS1")  # the training job runs there
    assert busy.value.code == "IN_USE"
    assert b.inventory().gpus[1].partition.compute_mode == "CPX"  # type: ignore[union-attr]
    with pytest.raises(BackendError) as bad:
        b.set_partition(0, "TPX")  # MI300A's mode
    assert bad.value.code == "INVALID_ARGUMENT" and "SPX/DPX/QPX/CPX" in bad.value.message
    with pytest.raises(BackendError) as nvidia:
        b.set_partition(3, "CPX")
    assert nvidia.value.code == "NOT_SUPPORTED"
    after = b.set_partition(0, "DPX", "NPS1")
    assert (after.compute_mode, after.memory_mode, after.partitions) == ("DPX", "NPS1", 2)
    assert b.sample().gpus[0].partition == after
    # The sim fleet keeps the modes across its saved state.
    state = b.export_state()
    other = backend()
    other.import_state(state)
    assert other.inventory().gpus[0].partition == after


@pytest.mark.parametrize(
    ("gpu", "message"),
    [
        ({"model": "H100-80GB", "partition": {"compute": "CPX"}}, "gpus[0].partition: NVIDIA H100"),
        (
            {"model": "MI300X", "partition": {"compute": "TPX"}},
            "gpus[0].partition.compute: MI300X has no compute mode 'TPX'",
        ),
        (
            {"model": "MI300X", "partition": {"memory": "NPS2"}},
            "gpus[0].partition.memory: MI300X has no memory mode",
        ),
        ({"model": "MI300X", "partition": {"cpx": 1}}, "gpus[0].partition.cpx: unknown key"),
        ({"model": "MI300X", "mig": True}, "gpus[0].mig.enabled: AMD Instinct MI300X does not support MIG"),
    ],
)
def test_spec_mistakes_name_their_field(gpu: dict[str, object], message: str) -> None:
    with pytest.raises(BackendUnavailable) as err:
        SimBackend(spec={"gpus": [gpu]})
    assert message in str(err.value) and "\n" not in str(err.value)
