"""Which carve: entries select a GPU, and which entry decides each kind (mig, mps, limiter) for it.

A GPU is seen as far as it is known (`GpuView`): at plan time everything about it is live; at
load time only its node, the index an entry names and the model its node's labels say. An entry
then selects it YES, NO or MAYBE (known only at plan time), and the last entry that selects it
decides each kind (`resolve`), with `certain` False while a later entry MAYBE selects it too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuops.core.driver_memory import DriverMemory, Overhead, overhead_for
from gpuops.core.mig.catalog import MigModel, find_model, normalize_model_name
from gpuops.core.partition_catalog import PartitionModel, find_partition_model
from gpuops.spec.carve_entry import KINDS, MIB, CarveEntry, GpuSelect
from gpuops.spec.selectors import Selector, parse_gpu_indices, parse_selector

if TYPE_CHECKING:
    # Types only: the fleet model asks this module (through desired_gpu) at run time.
    from gpuops.spec.model import Fleet, NodeEntry

MODEL_LABELS = ("nvidia.com/gpu.product", "gpu-model", "model")
"""Node labels that say the model of a node's GPUs, first found wins (GPU feature discovery's
nvidia.com/gpu.product, or a label of your own)."""


NO, MAYBE, YES = 0, 1, 2


@dataclass(frozen=True)
class GpuView:
    """A GPU as far as it is known: at plan time everything (live), at load time the node, the
    index when an entry names it (None: a GPU that no entry names by index) and the model its
    node's labels say."""

    node: NodeEntry
    index: int | None
    uuid: str | None
    model: str | None  # catalog key or model text; None: unknown
    live: bool
    memory: int | None = None  # bytes, when known
    mig_mode: bool | None = None  # live MIG mode, when known
    driver: DriverMemory | None = None  # what its node observed of the driver's memory (plan time)

    @property
    def mig_model(self) -> MigModel | None:
        return find_model(self.model) if self.model else None

    @property
    def mig_capable(self) -> bool | None:
        """True/False when known; None at load time for a model label outside the catalog."""
        if self.mig_model is not None:
            return True
        return False if self.live and self.model is not None else None

    @property
    def partition_model(self) -> PartitionModel | None:
        return find_partition_model(self.model) if self.model else None

    @property
    def partition_capable(self) -> bool | None:
        """Whether the GPU has partition modes: known from its model, or unknown (None)."""
        if self.partition_model is not None:
            return True
        return False if self.model is not None and (self.live or self.mig_model is not None) else None

    @property
    def mig_doubtful(self) -> bool:
        """Load time: the node's label names a model outside the MIG catalog (a GPU without MIG,
        or one gpuops does not know): whether an entry by node or model applies is left to plan."""
        return not self.live and self.model is not None and self.mig_model is None

    @property
    def memory_total(self) -> int | None:
        if self.memory is not None:
            return self.memory
        m = self.mig_model
        return m.memory_total_mib * MIB if m is not None else None

    @property
    def overhead(self) -> Overhead:
        """What the driver keeps of the GPU: observed by its node, else its model's figures."""
        return overhead_for(self.model or "", self.driver)

    def describe(self) -> str:
        return (
            f"{self.node.name} GPU {self.index}"
            if self.index is not None
            else f"the GPUs of {self.node.name}"
        )


def same_model(a: str, b: str) -> bool:
    """Whether two model names are the same GPU model (catalog spellings, NVML names, labels)."""
    ma, mb = find_model(a), find_model(b)
    if ma is not None or mb is not None:
        return ma is mb
    pa, pb = find_partition_model(a), find_partition_model(b)
    if pa is not None or pb is not None:
        return pa is pb
    return normalize_model_name(a) == normalize_model_name(b)


def node_model(node: NodeEntry) -> tuple[str | None, str]:
    """The model a node's labels say (catalog key when it is one), and the label's key."""
    for key in MODEL_LABELS:
        value = node.labels.get(key)
        if value:
            found = find_model(value)
            return (found.key if found is not None else value), key
    return None, ""


class CarveSelectors:
    """Parsed selectors of the entries, and which entries select which node, cached."""

    def __init__(self, entries: Sequence[CarveEntry]) -> None:
        self.nodes: list[Selector] = []
        self.indices: list[frozenset[int] | None] = []
        for entry in entries:
            self.nodes.append(parse_selector(entry.select.nodes))
            gpus = entry.select.gpus
            self.indices.append(
                parse_gpu_indices(gpus.indices) if gpus is not None and gpus.indices is not None else None
            )
        self._hits: dict[str, tuple[NodeEntry, list[bool]]] = {}

    def selects(self, i: int, node: NodeEntry) -> bool:
        """Whether entry i's node selector selects `node`."""
        cached = self._hits.get(node.name)
        if cached is None or cached[0] is not node:
            cached = (node, [sel.matches(node.name, node.labels) for sel in self.nodes])
            self._hits[node.name] = cached
        return cached[1][i]


def selectors_for(fleet: Fleet) -> CarveSelectors:
    """The fleet's parsed carve selectors, kept on the fleet while its carve list is the same."""
    key = (id(fleet.carve), len(fleet.carve))
    cached = fleet._carve_selectors
    if isinstance(cached, tuple) and cached[0] == key and isinstance(cached[1], CarveSelectors):
        return cached[1]
    sel = CarveSelectors(fleet.carve)
    fleet._carve_selectors = (key, sel)
    return sel


def names_gpus(gpus: GpuSelect | None) -> bool:
    """Whether a selection names its GPUs by index or UUID (not only by node or model)."""
    return gpus is not None and (gpus.indices is not None or gpus.uuids is not None)


def match_entry(entry: CarveEntry, i: int, sel: CarveSelectors, gpu: GpuView) -> int:
    """Whether entry i selects the GPU: YES, NO, or MAYBE (not known before plan time)."""
    if not sel.selects(i, gpu.node):
        return NO
    gpus = entry.select.gpus
    if gpus is None:
        return YES
    result = YES
    indices = sel.indices[i]
    if indices is not None and (gpu.index is None or gpu.index not in indices):
        return NO
    if gpus.uuids is not None:
        if gpu.live:
            if gpu.uuid is None or gpu.uuid.lower() not in {u.lower() for u in gpus.uuids}:
                return NO
        else:
            result = MAYBE
    if gpus.model is not None:
        if gpu.model is None:
            result = MAYBE
        elif not any(same_model(m, gpu.model) for m in gpus.model):
            return NO
    return result


def _match_kind(entry: CarveEntry, i: int, sel: CarveSelectors, gpu: GpuView, kind: str) -> int:
    m = match_entry(entry, i, sel, gpu)
    # mig: on a GPU without MIG, an entry selecting by node or model skips it (as mig-parted
    # skips such GPUs under devices: all); one naming it by index or UUID is an error (below).
    if kind == "mig" and m != NO:
        if gpu.mig_capable is False:
            return NO
        if gpu.mig_doubtful and not names_gpus(entry.select.gpus):
            return MAYBE
    # partition: the same for GPUs without partition modes (every NVIDIA GPU).
    if kind == "partition" and m != NO:
        if gpu.partition_capable is False:
            return NO
        if gpu.partition_capable is None and not names_gpus(entry.select.gpus):
            return MAYBE
    return m


@dataclass(frozen=True)
class Winner:
    entry: int | None  # the entry that decides this kind for the GPU; None: no entry does
    certain: bool  # False: a later entry may still select the GPU (known at plan time)


def resolve(entries: Sequence[CarveEntry], sel: CarveSelectors, gpu: GpuView) -> dict[str, Winner]:
    out: dict[str, Winner] = {}
    for kind in KINDS:
        last: int | None = None
        maybe_after = False
        for i, entry in enumerate(entries):
            if getattr(entry, kind) is None:
                continue
            m = _match_kind(entry, i, sel, gpu, kind)
            if m == YES:
                last, maybe_after = i, False
            elif m == MAYBE:
                maybe_after = True
        out[kind] = Winner(last, not maybe_after)
    return out


__all__ = [
    "MAYBE",
    "MODEL_LABELS",
    "NO",
    "YES",
    "CarveSelectors",
    "GpuView",
    "Winner",
    "match_entry",
    "names_gpus",
    "node_model",
    "resolve",
    "same_model",
    "selectors_for",
]
