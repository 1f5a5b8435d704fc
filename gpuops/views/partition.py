"""AMD mode partitions in words, the same in every screen: the grid's cell profile ("CPX/NPS4"),
the GPU table's MIG column ("CPX (8) / NPS4", as `gpuops discover` prints it), the GPU panel.

A partitioned GPU stays one cell and one GPU in the figures: the node reports one sample and one
process list per physical GPU, not per logical GPU, so its partitions are not GPU fractions as
MIG slices are (docs/backends.md)."""

from __future__ import annotations

from gpuops.core.model import Gpu, PartitionState


def partition_label(gpu: Gpu) -> str:
    """ "CPX/NPS4"; "" for a GPU without partition modes."""
    p = gpu.partition
    if p is None:
        return ""
    return f"{p.compute_mode or '?'}/{p.memory_mode or '?'}"


def partition_column(p: PartitionState) -> str:
    return f"{p.compute_mode or '?'} ({p.partitions}) / {p.memory_mode or '?'}"


def partition_summary(p: PartitionState) -> str:
    """The GPU panel's line: the modes now and the ones the GPU takes."""
    logical = "logical GPU" if p.partitions == 1 else "logical GPUs"
    text = f"compute {p.compute_mode or '?'} ({p.partitions} {logical}) · memory {p.memory_mode or '?'}"
    if p.compute_modes or p.memory_modes:
        text += (
            f" · takes compute {'/'.join(p.compute_modes) or '?'}, memory {'/'.join(p.memory_modes) or '?'}"
        )
    return text
