"""History windows from Prometheus: the same `History` per node the SSH path reads from each node's
rollups (gpuops/tenancy/gather.py), built from query_range over the recording rules of
deploy/prometheus/gpuops-history.rules.yml, so `tenants` and `rebalance` (and their view models:
gpuops/tenancy/accounting.py, rebalance.py) work on it unchanged.

The rules record, at every evaluation, the shares a node's recorder integrates (core/history.py's
`gpu_shares`): each GPU's busy fraction and each key's (user, tenant, MIG instance) held and busy
GPU-equivalents and memory. Per window bucket (a minute, or an hour beyond 2 hours) the operator
asks `sum_over_time`, `count_over_time` and `max_over_time` of those records with the bucket as
the step: a fixed dozen requests whatever the fleet's size; the answers grow with the GPUs and
buckets, not the number of requests. A record's sum times the group's evaluation interval is the
integral the node's recorder keeps (its samples stand for the interval before them).

What differs from a node's own history, and is said in docs/prometheus-source.md: the keys have no
unix groups (not exported, so a `group` attribution rule sees none); Prometheus holds what it
scraped since it started and for its retention; a bucket is (end - span, end], not [start, end).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TypeVar

from gpuops.core.history import MINUTE, Bucket, GpuUsage, History, UserUsage
from gpuops.core.metric_schema import GPU_INFO, GPU_MEMORY_TOTAL, GPU_MEMORY_USED
from gpuops.fleet.promql.client import PromClient, PromError, RangeAnswer
from gpuops.fleet.promql.decode import LIMITER_SOURCE
from gpuops.tenancy.accounting import Window

RULE_GROUP = "gpuops.history"
RULES_HINT = "load deploy/prometheus/gpuops-history.rules.yml (docs/prometheus-source.md#history)"
NO_SERIES = "Prometheus has no series of this node in the window (is its exporter scraped?)"
KEY_LABELS = ("node", "gpu", "GPU_I_ID", "user", "tenant")

# (field, query): per GPU, then per key; `{S}` is the bucket's span, as a range. The exporters'
# series by the schema's names (core/metric_schema.py), the rules' records by theirs.
_USED = GPU_MEMORY_USED.name
GPU_QUERIES = (
    ("count", "count_over_time(gpu:gpuops_gpu_time:ratio[{S}])"),
    ("busy", "sum_over_time(gpu:gpuops_gpu_time:ratio[{S}])"),
    ("memory", f"max by (node, gpu) (avg_over_time({_USED}[{{S}}]))"),
    ("memory_max", f"max by (node, gpu) (max_over_time({_USED}[{{S}}]))"),
)
KEY_QUERIES = (
    ("count", "count_over_time(gpu_key:gpuops_gpu_held:ratio[{S}])"),
    ("held", "sum_over_time(gpu_key:gpuops_gpu_held:ratio[{S}])"),
    ("busy", "sum_over_time(gpu_key:gpuops_gpu_busy:ratio[{S}])"),
    ("memory", "sum_over_time(gpu_key:gpuops_process_memory_used_bytes:sum[{S}])"),
    ("memory_max", "max_over_time(gpu_key:gpuops_process_memory_used_bytes:sum[{S}])"),
    ("process_max", "max_over_time(gpu_key:gpuops_process_memory_used_bytes:max[{S}])"),
    ("processes", "max_over_time(gpu_key:gpuops_processes:count[{S}])"),
)
INFO_QUERY = f"max by (node, gpu, UUID, modelName, mig_mode) (last_over_time({GPU_INFO.name}[{{W}}]))"
TOTAL_QUERY = f"max by (node, gpu) (last_over_time({GPU_MEMORY_TOTAL.name}[{{W}}]))"

GpuId = tuple[str, int]  # (node, GPU index)
KeyId = tuple[str, int, str, str, str]  # (node, GPU index, GPU instance, user, tenant)
Ident = TypeVar("Ident", GpuId, KeyId)


@dataclass
class _Figures:
    """One GPU's or key's figures per bucket start."""

    per_bucket: dict[float, dict[str, float]] = field(default_factory=dict)

    def put(self, start: float, name: str, value: float) -> None:
        if math.isfinite(value):
            self.per_bucket.setdefault(start, {})[name] = value


def _seconds(span: float) -> str:
    return f"{round(span)}s"


def _gpu_id(labels: Mapping[str, str]) -> GpuId | None:
    try:
        return labels.get("node", ""), int(labels.get("gpu", ""))
    except ValueError:
        return None


def _key_id(labels: Mapping[str, str]) -> KeyId | None:
    gpu = _gpu_id(labels)
    if gpu is None:
        return None
    return (*gpu, labels.get("GPU_I_ID", ""), labels.get("user", ""), labels.get("tenant", ""))


def _fill(
    answer: RangeAnswer,
    name: str,
    span: float,
    into: dict[Ident, _Figures],
    ident: Callable[[Mapping[str, str]], Ident | None],
) -> None:
    for series in answer.series:
        found = ident(series.labels)
        if found is None or not found[0]:
            continue
        figures = into.setdefault(found, _Figures())
        for at, value in series.points:
            # The point at t sums (t - span, t]: the bucket that starts at t - span.
            figures.put(round((at - span) / span) * span, name, value)


async def _range(
    client: PromClient, expr: str, start: float, end: float, step: float, timeout: float
) -> RangeAnswer:
    return await client.query_range(expr, start, end, step, timeout=timeout)


async def read_histories_promql(
    client: PromClient,
    window: Window,
    now: float,
    nodes: Iterable[str] | None = None,
    timeout: float = 60.0,
) -> dict[str, History | str]:
    """Every node's history over `window` (or why it has none), as `read_histories` gives it
    over SSH: `nodes` (fleet.yaml's; all Prometheus has when None). Raises PromError when
    Prometheus does not answer or lacks the rules."""
    groups = await client.rule_groups(timeout=timeout)
    interval = groups.get(RULE_GROUP)
    if not interval or interval <= 0:
        raise PromError(
            "query", f"Prometheus at {client.url} has no {RULE_GROUP} recording rules: {RULES_HINT}"
        )
    span = window.span
    starts = window.starts(now)
    first, last = starts[0] + span, starts[-1] + span
    S = _seconds(span)
    W = _seconds(window.seconds + span)
    gpu_requests = [_range(client, q.format(S=S), first, last, span, timeout) for _, q in GPU_QUERIES]
    key_requests = [_range(client, q.format(S=S), first, last, span, timeout) for _, q in KEY_QUERIES]
    info_requests = [
        client.query(INFO_QUERY.format(W=W), at=now, timeout=timeout),
        client.query(TOTAL_QUERY.format(W=W), at=now, timeout=timeout),
    ]
    ranges = await asyncio.gather(*gpu_requests, *key_requests)
    info, totals = await asyncio.gather(*info_requests)
    gpu_answers = ranges[: len(GPU_QUERIES)]
    key_answers = ranges[len(GPU_QUERIES) :]
    gpus: dict[GpuId, _Figures] = {}
    keys: dict[KeyId, _Figures] = {}
    for (name, _), answer in zip(GPU_QUERIES, gpu_answers, strict=True):
        _fill(answer, name, span, gpus, _gpu_id)
    for (name, _), answer in zip(KEY_QUERIES, key_answers, strict=True):
        _fill(answer, name, span, keys, _key_id)
    about: dict[GpuId, Mapping[str, str]] = {}
    for s in info.series:
        gpu = _gpu_id(s.labels)
        if gpu is not None:
            about[gpu] = s.labels
    memory_total: dict[GpuId, int] = {}
    for s in totals.series:
        gpu = _gpu_id(s.labels)
        if gpu is not None and math.isfinite(s.value):
            memory_total[gpu] = round(s.value)
    return _histories(window, now, interval, gpus, keys, about, memory_total, nodes)


def _histories(
    window: Window,
    now: float,
    interval: float,
    gpus: Mapping[GpuId, _Figures],
    keys: Mapping[KeyId, _Figures],
    about: Mapping[GpuId, Mapping[str, str]],
    memory_total: Mapping[GpuId, int],
    nodes: Iterable[str] | None,
) -> dict[str, History | str]:
    span = window.span
    starts = set(window.starts(now))
    users: dict[tuple[GpuId, float], list[UserUsage]] = {}
    for ident, figures in keys.items():
        node, index, gi, user, tenant = ident
        for start, f in figures.per_bucket.items():
            count = f.get("count", 0.0)
            if start not in starts or count <= 0:
                continue
            users.setdefault(((node, index), start), []).append(
                UserUsage(
                    user=user,
                    groups=(),
                    tenant=tenant or None,
                    tenant_source=LIMITER_SOURCE if tenant else "",
                    gpu_instance_id=int(gi) if gi.isdigit() else None,
                    seconds=min(span, count * interval),
                    held=f.get("held", 0.0) * interval,
                    busy=f.get("busy", 0.0) * interval,
                    memory=f.get("memory", 0.0) * interval,
                    memory_max=round(f.get("memory_max", 0.0)),
                    process_max=round(f.get("process_max", 0.0)),
                    processes=round(f.get("processes", 0.0)),
                )
            )
    per_node: dict[str, dict[float, list[GpuUsage]]] = {}
    for gpu_id, gpu_figures in gpus.items():
        node, index = gpu_id
        labels = about.get((node, index), {})
        for start, f in gpu_figures.per_bucket.items():
            count = f.get("count", 0.0)
            if start not in starts or count <= 0:
                continue
            seconds = min(span, count * interval)
            per_node.setdefault(node, {}).setdefault(start, []).append(
                GpuUsage(
                    index=index,
                    uuid=labels.get("UUID", ""),
                    name=labels.get("modelName", ""),
                    memory_total=memory_total.get((node, index), 0),
                    owner=None,  # fleet.yaml's owners decide, as for a node that reports none
                    mig=labels.get("mig_mode") == "enabled",
                    seconds=seconds,
                    busy=min(seconds, f.get("busy", 0.0) * interval),
                    memory=f.get("memory", 0.0) * seconds,
                    memory_max=round(f.get("memory_max", 0.0)),
                    users=tuple(sorted(users.get(((node, index), start), ()), key=_user_order)),
                )
            )
    names = list(nodes) if nodes is not None else sorted(per_node)
    since = min(starts)
    out: dict[str, History | str] = {}
    for name in names:
        buckets = per_node.get(name)
        if not buckets:
            out[name] = NO_SERIES
            continue
        ordered = tuple(
            Bucket(start, span, tuple(sorted(buckets[start], key=lambda g: g.index)))
            for start in sorted(buckets)
        )
        resolution = "minute" if span == MINUTE else "hour"
        out[name] = History(resolution, since, now, True, ordered[0].start, ordered)
    return out


def _user_order(u: UserUsage) -> tuple[str, str, int]:
    return (u.user, u.tenant or "", u.gpu_instance_id if u.gpu_instance_id is not None else -1)
