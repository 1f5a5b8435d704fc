"""Pools in fleet.yaml: GPUs taken out of their owners' silos and shared between teams.

A pool names its member GPUs (selections, as carve entries select), how guarantees are enforced
(`policy`), whether teams may use more than their guarantee or run there without one
(`borrowing`), how its GPUs are carved (`carving`: limiter shares or MIG slices) and the teams'
guarantees as shares of the pool's GPU capacity. A member GPU keeps its owner (who paid for it,
whose idle capacity it was); what changes is who is guaranteed its time.

The per-GPU carving that enforces a pool (limiter tenant tables or MIG layouts) is written as
ordinary carve entries marked `pool: NAME`, so that `gpuops plan`/`apply` treat them like any other
and an operator can read exactly what a node will get. `gpuops rebalance` rewrites the marked
entries of the pool it plans; docs/pools.md.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema, model_validator

from gpuops.spec.base import SpecModel
from gpuops.spec.carve_entry import MemoryCap, Select, check_compute_share, format_share
from gpuops.spec.errors import FieldProblem, show
from gpuops.spec.resolve import same_model
from gpuops.spec.selectors import parse_gpu_indices, parse_selector
from gpuops.spec.types import Flag, PoolName, TeamName, Text

POOL_POLICIES = ("burst-share", "fixed-share")
CARVINGS = ("limiter", "mig")


def _choice(kind: str, choices: tuple[str, ...]) -> Any:
    def check(value: Any) -> str:
        if value not in choices:
            raise FieldProblem(f"{kind} must be one of {', '.join(choices)} (got {show(value)})")
        return str(value)

    return check


def check_pool_share(value: Any) -> float:
    try:
        return check_compute_share(value)
    except FieldProblem as exc:
        raise FieldProblem(
            exc.message, "a share of the pool's GPU capacity, e.g. 25%; leave the team out for none"
        ) from None


PoolShare = Annotated[
    float,
    BeforeValidator(check_pool_share),
    PlainSerializer(format_share, return_type=Any, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*%?\s*$"},
            ],
            "examples": ["25%"],
        }
    ),
]


class PoolGuarantee(SpecModel):
    """One team's guarantee in a pool."""

    share: PoolShare
    """Share of the pool's GPU capacity guaranteed to the team, e.g. 25% of a 8-GPU pool is 2 GPUs'
    worth of GPU time."""
    memory: MemoryCap | None = None
    """Memory the team's work needs on one GPU (its workloads' p95), e.g. 40GiB: the limiter cap on
    each GPU where it has a share (never below it), and the slice size under MIG carving."""

    @model_validator(mode="before")
    @classmethod
    def _share_shorthand(cls, data: Any) -> Any:
        # `vision: 25%` is `vision: {share: 25%}`.
        if isinstance(data, (str, int, float)) and not isinstance(data, bool):
            return {"share": data}
        return data


class Pool(SpecModel):
    """GPUs shared by teams, with guarantees (docs/pools.md)."""

    description: Text = ""
    gpus: list[Select] = Field(default_factory=list)
    """Member GPUs, as carve entries select them: [{nodes: "gpu-b-*"}, {nodes: gpu-c-01, gpus: "0-3"}]."""
    policy: Annotated[
        Literal["burst-share", "fixed-share"],
        BeforeValidator(_choice("policy", POOL_POLICIES)),
    ] = "burst-share"
    """burst-share (default): a team's share is a guarantee; it may use idle time beyond it.
    fixed-share: shares are caps, even when the GPU is idle."""
    borrowing: Flag = True
    """Teams without a guarantee may run on the pool's GPUs as offline work (they yield to
    guaranteed teams). false: only teams with a guarantee run there."""
    carving: Annotated[Literal["limiter", "mig"], BeforeValidator(_choice("carving", CARVINGS))] = "limiter"
    """limiter (default): each GPU's time is shared by the interception limiter's shares.
    mig: MIG-capable GPUs are cut into slices sized to the teams' memory; others use the limiter."""
    guarantees: dict[TeamName, PoolGuarantee] = Field(default_factory=dict)
    """Per team: {speech: 50%, vision: {share: 25%, memory: 40GiB}}; shares add up to at most 100%."""


__all__ = ["CARVINGS", "POOL_POLICIES", "Pool", "PoolGuarantee", "PoolName", "pool_selects"]


def pool_selects(sel: Select, node: Any, index: int, uuid: str | None, model: str | None) -> bool:
    """Whether a member selection selects GPU `index` of `node` (a spec NodeEntry). A selection by UUID
    or model matches only when the GPU's UUID or model is given."""
    if not parse_selector(sel.nodes).matches(node.name, node.labels):
        return False
    gpus = sel.gpus
    if gpus is None:
        return True
    if gpus.indices is not None and index not in parse_gpu_indices(gpus.indices):
        return False
    if gpus.uuids is not None and (uuid is None or uuid.lower() not in {u.lower() for u in gpus.uuids}):
        return False
    return not (
        gpus.model is not None and (model is None or not any(same_model(m, model) for m in gpus.model))
    )
