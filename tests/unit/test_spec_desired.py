# ruff: noqa: E501  (the expected error lines are long by nature)
"""carve: (the desired state in fleet.yaml): every load-time rule with the exact line it prints."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from gpuops.core.mig import MODELS
from gpuops.core.mig.layout import InstanceSpec, MigLayout
from gpuops.core.mig.placement import solve
from gpuops.node.limiter import format_table, parse_table
from gpuops.spec import (
    CarveEntry,
    DesiredLimiter,
    Fleet,
    MigSpec,
    NodeEntry,
    SpecError,
    Team,
    check_fleet,
    dump_fleet,
    fleet_json_schema,
    load_fleet,
    parse_fleet,
    solve_layout,
)

HEAD = """\
version: 1
teams: {vision: {users: [alice]}, nlp: {users: [carol]}}
nodes:
  - {name: gpu-a-01, host: h1, labels: {model: h100-80gb, zone: a}}
  - {name: gpu-a-02, host: h2, labels: {model: h100-80gb, zone: a}}
  - {name: gpu-b-01, host: h3}
  - {name: gpu-c-01, host: h4, labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-40GB}}
carve:
"""


def fleet_text(carve: str) -> str:
    """HEAD (8 lines) and the carve entries, indented under carve: (so the first is line 9)."""
    return HEAD + textwrap.indent(textwrap.dedent(carve), "  ")


def errors(carve: str) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_fleet(fleet_text(carve), "f.yaml")
    return [str(e) for e in info.value.errors]


# (description, carve entries, the line(s) it must print)
CASES: list[tuple[str, str, str | list[str]]] = [
    (
        "unknown profile for the model of the node label",
        """\
        - select: {nodes: "gpu-a-*"}
          mig: {enabled: true, profiles: {"3g.71gb": 1}}
        """,
        "f.yaml:10:37: carve[0].mig.profiles[\"3g.71gb\"]: unknown profile '3g.71gb' for H100-80GB; valid: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb; gpu-a-01 is an H100-80GB by its label model; try: gpuops mig check H100-80GB 3g.71gb",
    ),
    (
        "unknown profile for gpus.model",
        """\
        - select: {gpus: {model: A100-SXM4-40GB}}
          mig: {enabled: true, profiles: {"3g.40gb": 1}}
        """,
        "f.yaml:10:37: carve[0].mig.profiles[\"3g.40gb\"]: unknown profile '3g.40gb' for A100-SXM4-40GB; valid: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb; the entry selects A100-SXM4-40GB GPUs; try: gpuops mig check A100-SXM4-40GB 3g.40gb",
    ),
    (
        "unknown profile for the GPU product label",
        """\
        - select: {nodes: gpu-c-01, gpus: "0-3"}
          mig: {enabled: true, profiles: {"1g.10gb": 1, "1g.18gb": 1}}
        """,
        "f.yaml:10:51: carve[0].mig.profiles[\"1g.18gb\"]: unknown profile '1g.18gb' for A100-SXM4-40GB; valid: 1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb; gpu-c-01 is an A100-SXM4-40GB by its label nvidia.com/gpu.product; try: gpuops mig check A100-SXM4-40GB 1g.10gb 1g.18gb",
    ),
    (
        "over-committed memory slices",
        """\
        - select: {nodes: "gpu-a-*"}
          mig: {enabled: true, profiles: {"3g.40gb": 2, "1g.10gb": 1}}
        """,
        "f.yaml:10:36: carve[0].mig.profiles: needs 9 memory slices (3g.40gb x2: 8, 1g.10gb: 1), the GPU has 8; gpu-a-01 is an H100-80GB by its label model; try: gpuops mig check H100-80GB 3g.40gb 3g.40gb 1g.10gb",
    ),
    (
        "over-committed max count",
        """\
        - select: {nodes: "gpu-a-*", gpus: 0}
          mig: {enabled: true, profiles: {"1g.10gb": 8}}
        """,
        "f.yaml:10:36: carve[0].mig.profiles: 1g.10gb: at most 7 per GPU (asked for 8); gpu-a-01 is an H100-80GB by its label model; try: gpuops mig check H100-80GB 1g.10gb 1g.10gb 1g.10gb 1g.10gb 1g.10gb 1g.10gb 1g.10gb 1g.10gb",
    ),
    (
        "over-committed on every model (model unknown)",
        """\
        - select: {nodes: gpu-b-01}
          mig: {enabled: true, profiles: {"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}}
        """,
        "f.yaml:10:36: carve[0].mig.profiles: needs 9 memory slices (4g.40gb: 4, 3g.40gb: 4, 1g.10gb: 1), the GPU has 8 (on A100-80GB); fits no model with these profiles (A100-80GB, H100-80GB, H100-PCIE-80GB); try: gpuops mig check A100-80GB 4g.40gb 3g.40gb 1g.10gb",
    ),
    (
        "profiles of no single model (model unknown)",
        """\
        - select: {nodes: gpu-b-01}
          mig: {enabled: true, profiles: {"1g.5gb": 1, "3g.40gb": 1}}
        """,
        "f.yaml:10:36: carve[0].mig.profiles: no MIG model has all of 1g.5gb, 3g.40gb; 1g.5gb: A100-SXM4-40GB; 3g.40gb: A100-80GB, H100-80GB, H100-PCIE-80GB",
    ),
    (
        "explicit placements that overlap",
        """\
        - select: {nodes: gpu-a-01}
          mig:
            enabled: true
            placements: ["3g.40gb@0", "2g.20gb@2"]
        """,
        "f.yaml:12:19: carve[0].mig.placements: 3g.40gb@0 overlaps 2g.20gb@2 (memory slices 2-3); gpu-a-01 is an H100-80GB by its label model; try: gpuops mig check H100-80GB 3g.40gb:0 2g.20gb:2",
    ),
    (
        "explicit placement at a start the profile does not allow",
        """\
        - select: {nodes: gpu-a-01}
          mig:
            enabled: true
            placements: ["3g.40gb@2"]
        """,
        "f.yaml:12:19: carve[0].mig.placements: 3g.40gb cannot start at memory slice 2 (allowed starts 0, 4); gpu-a-01 is an H100-80GB by its label model; try: gpuops mig check H100-80GB 3g.40gb:2",
    ),
    (
        "placement syntax",
        """\
        - select: {nodes: gpu-a-01}
          mig:
            enabled: true
            placements: ["3g.40gb", "3g.40gb@9"]
        """,
        [
            "f.yaml:12:20: carve[0].mig.placements[0]: expected PROFILE@START (got '3g.40gb'); e.g. 3g.40gb@4: the first memory slice it takes",
            "f.yaml:12:31: carve[0].mig.placements[1]: the start of 3g.40gb must be a memory slice from 0 to 7 (got '9'); e.g. 3g.40gb@4; gpuops mig profiles MODEL shows the allowed starts",
        ],
    ),
    (
        "profiles and placements together",
        """\
        - select: {nodes: gpu-a-01}
          mig:
            enabled: true
            profiles: {"1g.10gb": 1}
            placements: ["1g.10gb@0"]
        """,
        "f.yaml:13:7: carve[0].mig.placements: profiles and placements both given; give counts (profiles:) and let the solver place them, or explicit placements, not both",
    ),
    (
        "profiles with MIG disabled",
        """\
        - select: {nodes: gpu-a-01}
          mig: {enabled: false, profiles: {"1g.10gb": 1}}
        """,
        "f.yaml:10:27: carve[0].mig.profiles: profiles with MIG disabled; a GPU with MIG off has no instances: remove it, or set enabled: true",
    ),
    (
        "MIG enabled is required",
        """\
        - select: {nodes: gpu-a-01}
          mig: {profiles: {"1g.10gb": 1}}
        """,
        "f.yaml:10:5: carve[0].mig: missing required key 'enabled'; enabled: true or enabled: false",
    ),
    (
        "a CI-level profile among the GI profiles",
        """\
        - select: {nodes: gpu-a-01}
          mig: {enabled: true, profiles: {"1c.3g.40gb": 3}}
        """,
        "f.yaml:10:37: carve[0].mig.profiles[\"1c.3g.40gb\"]: unknown MIG profile '1c.3g.40gb'; compute-instance splits go under compute: (3g.40gb: [1c, ...])",
    ),
    (
        "a profile id instead of a name",
        """\
        - select: {nodes: gpu-a-01}
          mig: {enabled: true, profiles: {19: 7}}
        """,
        "f.yaml:10:37: carve[0].mig.profiles[\"19\"]: unknown MIG profile '19'; write the profile name (e.g. 3g.40gb): profile ids differ between models",
    ),
    (
        # Issue 28: spelling distance offered an H200's 1g.18gb; the nearest sizes of a 1g are meant.
        "a profile size no model has",
        """\
        - select: {nodes: gpu-a-01}
          mig: {enabled: true, profiles: {1g.11gb: 7}}
        """,
        "f.yaml:10:37: carve[0].mig.profiles[\"1g.11gb\"]: unknown MIG profile '1g.11gb'; did you mean '1g.10gb' (A100-SXM4-40GB, A100-80GB, H100-80GB, ...) or '1g.12gb' (H100-NVL-94GB, H100-96GB, GH200-96GB, ...)?",
    ),
    (
        "a profile in capitals",
        """\
        - select: {nodes: gpu-a-01}
          mig: {enabled: true, profiles: {3G.40GB: 1}}
        """,
        "f.yaml:10:37: carve[0].mig.profiles[\"3G.40GB\"]: not a MIG profile name (got '3G.40GB'); did you mean '3g.40gb'?",
    ),
    (
        "a negative count",
        """\
        - select: {nodes: gpu-a-01}
          mig: {enabled: true, profiles: {"1g.10gb": -1}}
        """,
        'f.yaml:10:48: carve[0].mig.profiles["1g.10gb"]: must be between 0 and 64 (got -1)',
    ),
    (
        "too many compute instances in a GPU instance",
        """\
        - select: {nodes: gpu-a-01}
          mig:
            enabled: true
            profiles: {"3g.40gb": 1}
            compute: {"3g.40gb": [1c, 1c, 1c, 1c]}
        """,
        'f.yaml:13:28: carve[0].mig.compute["3g.40gb"]: 3g.40gb: at most 3 1c compute instances (asked for 4); gpu-a-01 is an H100-80GB by its label model; try: gpuops mig check H100-80GB 3g.40gb',
    ),
    (
        "compute instances over the GPU instance's slices",
        """\
        - select: {nodes: gpu-a-01}
          mig:
            enabled: true
            profiles: {"4g.40gb": 1}
            compute: {"4g.40gb": [2c, 2c, 1c]}
        """,
        'f.yaml:13:28: carve[0].mig.compute["4g.40gb"]: 2c, 2c, 1c need 5 compute slices, a 4g.40gb has 4; gpu-a-01 is an H100-80GB by its label model; try: gpuops mig check H100-80GB 4g.40gb',
    ),
    (
        "a compute profile that the GPU instance does not have",
        """\
        - select: {nodes: gpu-a-01}
          mig:
            enabled: true
            profiles: {"4g.40gb": 1}
            compute: {"4g.40gb": [3c]}
        """,
        'f.yaml:13:28: carve[0].mig.compute["4g.40gb"]: 4g.40gb has no 3c compute instance (valid: 1c, 2c, 4c); gpu-a-01 is an H100-80GB by its label model; try: gpuops mig check H100-80GB 4g.40gb',
    ),
    (
        "a compute split for a profile not in the layout",
        """\
        - select: {nodes: gpu-a-01}
          mig:
            enabled: true
            profiles: {"3g.40gb": 2}
            compute: {"2g.20gb": [1c, 1c]}
        """,
        'f.yaml:13:17: carve[0].mig.compute["2g.20gb"]: no 2g.20gb instance in this layout; instances: 3g.40gb',
    ),
    (
        "a compute split of another GI's name",
        """\
        - select: {nodes: gpu-a-01}
          mig:
            enabled: true
            profiles: {"3g.40gb": 2}
            compute: {"3g.40gb": [1c.2g.20gb]}
        """,
        'f.yaml:13:28: carve[0].mig.compute["3g.40gb"]: 1c.2g.20gb is not a compute profile of 3g.40gb (write 1c); gpu-a-01 is an H100-80GB by its label model; try: gpuops mig check H100-80GB 3g.40gb 3g.40gb',
    ),
    (
        "not a compute profile",
        """\
        - select: {nodes: gpu-a-01}
          mig:
            enabled: true
            profiles: {"3g.40gb": 2}
            compute: {"3g.40gb": [1g]}
        """,
        "f.yaml:13:29: carve[0].mig.compute[\"3g.40gb\"][0]: not a compute-instance profile (got '1g'); 1c, 2c, 3c, 4c or 7c (or in full: 1c.3g.40gb)",
    ),
    (
        "MIG on a model without MIG",
        """\
        - select: {gpus: {model: NVIDIA L40S}}
          mig: {enabled: true}
        """,
        "f.yaml:9:20: carve[0].select.gpus: 'NVIDIA L40S' has no MIG in gpuops' catalog; MIG models: A100-SXM4-40GB, A100-80GB, H100-80GB, H100-PCIE-80GB, H200-141GB, A30-24GB, "
        "H100-NVL-94GB, H100-96GB, GH200-96GB, GH200-144GB, H20-96GB, PG506-96GB, B200, GB200, B300, GB300, "
        "RTX-PRO-6000-96GB",
    ),
    (
        "MPS percentage 0",
        """\
        - select: {nodes: gpu-b-01}
          mps: {enabled: true, active_thread_percentage: 0}
        """,
        "f.yaml:10:52: carve[0].mps.active_thread_percentage: must be between 1 and 100 (got 0); 0% would leave MPS clients no threads at all; leave it out for the default 100",
    ),
    (
        "MPS percentage 150",
        """\
        - select: {nodes: gpu-b-01}
          mps: {enabled: true, active_thread_percentage: 150}
        """,
        "f.yaml:10:52: carve[0].mps.active_thread_percentage: must be between 1 and 100 (got 150); it is the share of the GPU's (or MIG instance's) SMs one MPS client may use",
    ),
    (
        "MPS percentage as text over 100",
        """\
        - select: {nodes: gpu-b-01}
          mps: {enabled: true, active_thread_percentage: "150%"}
        """,
        "f.yaml:10:52: carve[0].mps.active_thread_percentage: must be between 1 and 100 (got 150); it is the share of the GPU's (or MIG instance's) SMs one MPS client may use",
    ),
    (
        "MPS percentage not whole",
        """\
        - select: {nodes: gpu-b-01}
          mps: {enabled: true, active_thread_percentage: 12.5}
        """,
        "f.yaml:10:52: carve[0].mps.active_thread_percentage: expected a whole percentage from 1 to 100 (got 12.5); e.g. 50 or 50%",
    ),
    (
        "MPS per-tenant percentage 0",
        """\
        - select: {nodes: gpu-b-01}
          mps:
            enabled: true
            per_tenant:
              nlp: {active_thread_percentage: 0}
        """,
        "f.yaml:13:41: carve[0].mps.per_tenant.nlp.active_thread_percentage: must be between 1 and 100 (got 0); 0% would leave MPS clients no threads at all; leave it out for the default 100",
    ),
    (
        "MPS pinned limit over the GPU's memory",
        """\
        - select: {nodes: gpu-a-01}
          mps: {enabled: true, pinned_memory_limit: 100GiB}
        """,
        "f.yaml:10:47: carve[0].mps.pinned_memory_limit: 100GiB is more than the 79.65GiB of the H100-80GB, on the GPUs of gpu-a-01; the limit applies to each client of each MPS daemon (one per GPU or MIG instance)",
    ),
    (
        "MPS pinned limit over a MIG instance's memory",
        """\
        - select: {nodes: gpu-a-01, gpus: "0-3"}
          mig: {enabled: true, profiles: {"1g.10gb": 3, "3g.40gb": 1}}
        - select: {nodes: "gpu-a-*", gpus: "0-1"}
          mps:
            enabled: true
            pinned_memory_limit: 8GiB
            per_tenant:
              nlp: {pinned_memory_limit: 12GiB}
        """,
        "f.yaml:16:36: carve[1].mps.per_tenant.nlp.pinned_memory_limit: 12GiB is more than the 9.75GiB of a 1g.10gb instance (MIG from carve[0]), on gpu-a-01 GPU 0 and 1 more GPU; the limit applies to each client of each MPS daemon (one per GPU or MIG instance)",
    ),
    (
        "MPS pinned limit without a unit",
        """\
        - select: {nodes: gpu-b-01}
          mps: {enabled: true, pinned_memory_limit: 20}
        """,
        "f.yaml:10:47: carve[0].mps.pinned_memory_limit: a size needs a unit (got 20); write e.g. 20GiB or 20MiB",
    ),
    (
        "MPS pinned limit not in whole MiB",
        """\
        - select: {nodes: gpu-b-01}
          mps: {enabled: true, pinned_memory_limit: 1.5MiB}
        """,
        "f.yaml:10:47: carve[0].mps.pinned_memory_limit: MPS takes whole MiB (got '1.5MiB'); e.g. 1MiB; set_default_device_pinned_mem_limit accepts M or G values",
    ),
    (
        "MPS per-tenant team unknown",
        """\
        - select: {nodes: gpu-b-01}
          mps:
            enabled: true
            per_tenant:
              nlpp: {active_thread_percentage: 30}
        """,
        "f.yaml:13:9: carve[0].mps.per_tenant.nlpp: no team named 'nlpp'; did you mean 'nlp'?",
    ),
    (
        "MPS settings while disabled",
        """\
        - select: {nodes: gpu-b-01}
          mps: {enabled: false, active_thread_percentage: 30}
        """,
        "f.yaml:10:27: carve[0].mps.active_thread_percentage: active_thread_percentage with MPS disabled; remove it, or set enabled: true",
    ),
    (
        "limiter shares over 100% under fixed-share",
        """\
        - select: {nodes: gpu-b-01}
          limiter:
            policy: fixed-share
            tenants:
              vision: {memory: 20GiB, compute: 40%, class: online}
              nlp: {memory: 40GiB, compute: 70%, class: offline}
        """,
        "f.yaml:12:7: carve[0].limiter.tenants: compute shares add up to 110%, over 100% (vision 40%, nlp 70%); under fixed-share each share is a cap on the GPU's time: together at most 100%",
    ),
    (
        "limiter guarantees over 100% under burst-share",
        """\
        - select: {nodes: gpu-b-01}
          limiter:
            policy: burst-share
            tenants:
              vision: {compute: 60%}
              nlp: {compute: 60%}
        """,
        "f.yaml:12:7: carve[0].limiter.tenants: compute guarantees add up to 120%, over 100% (vision 60%, nlp 60%); burst-share guarantees cannot promise more than the whole GPU",
    ),
    (
        "limiter shares over 100% with the default tenant and mixed policies",
        """\
        - select: {nodes: gpu-b-01}
          limiter:
            tenants:
              vision: {compute: 50%}
              nlp: {compute: 40%, policy: burst-share}
              "*": {compute: 20%}
        """,
        "f.yaml:11:7: carve[0].limiter.tenants: compute shares add up to 110%, over 100% (vision 50% fixed-share, nlp 40% burst-share, * 20% fixed-share); caps (fixed-share) and guarantees (burst-share) together must fit in 100%",
    ),
    (
        "limiter tenant not a team",
        """\
        - select: {nodes: gpu-b-01}
          limiter:
            tenants:
              visoin: {compute: 30%}
        """,
        "f.yaml:12:9: carve[0].limiter.tenants.visoin: no team named 'visoin'; did you mean 'vision'?",
    ),
    (
        "limiter compute under best-effort",
        """\
        - select: {nodes: gpu-b-01}
          limiter:
            policy: best-effort
            tenants:
              vision: {compute: 30%}
        """,
        "f.yaml:13:27: carve[0].limiter.tenants.vision.compute: a compute share under best-effort (30%); best-effort tenants get what the others leave: remove compute, or use burst-share for a guarantee",
    ),
    (
        "limiter fixed-share without a share",
        """\
        - select: {nodes: gpu-b-01}
          limiter:
            policy: fixed-share
            tenants:
              vision: {memory: 8GiB}
        """,
        "f.yaml:13:9: carve[0].limiter.tenants.vision: fixed-share needs a compute share; add compute: (e.g. 30%), or policy: best-effort for a memory cap only",
    ),
    (
        "limiter share 0 and over 100",
        """\
        - select: {nodes: gpu-b-01}
          limiter:
            tenants:
              vision: {compute: 0%}
              nlp: {compute: 150%}
        """,
        [
            "f.yaml:12:27: carve[0].limiter.tenants.vision.compute: must be more than 0% (got '0%'); leave compute out (policy best-effort) for no share",
            "f.yaml:13:24: carve[0].limiter.tenants.nlp.compute: must be more than 0% and at most 100% (got '150%')",
        ],
    ),
    (
        "limiter policy and class spelled wrong",
        """\
        - select: {nodes: gpu-b-01}
          limiter:
            policy: fixed
            tenants:
              vision: {compute: 30%, class: batch}
        """,
        [
            "f.yaml:11:15: carve[0].limiter.policy: must be one of fixed-share | burst-share | best-effort (got 'fixed'); did you mean 'fixed-share'?",
            "f.yaml:13:39: carve[0].limiter.tenants.vision.class: must be one of online | offline (got 'batch')",
        ],
    ),
    (
        "limiter class key written klass",
        """\
        - select: {nodes: gpu-b-01}
          limiter:
            tenants:
              vision: {compute: 30%, klass: online}
        """,
        "f.yaml:12:32: carve[0].limiter.tenants.vision.klass: unknown key 'klass'; did you mean 'class'?",
    ),
    (
        "limiter memory cap over the GPU's memory",
        """\
        - select: {nodes: "gpu-a-*"}
          limiter:
            tenants:
              vision: {memory: 96GiB, compute: 30%}
        """,
        "f.yaml:12:26: carve[0].limiter.tenants.vision.memory: 96GiB is more than the 79.65GiB of the H100-80GB, on the GPUs of gpu-a-01 and 1 more GPU; a memory cap is per GPU",
    ),
    (
        "limiter on a GPU that an earlier entry puts in MIG mode",
        """\
        - select: {nodes: "gpu-a-*"}
          mig: {enabled: true, profiles: {"7g.80gb": 1}}
        - select: {nodes: gpu-a-01, gpus: 2}
          limiter: {tenants: {vision: {compute: 30%}}}
        """,
        "f.yaml:12:5: carve[1].limiter: the limiter cannot share a GPU in MIG mode (MIG from carve[0]), on gpu-a-01 GPU 2; MIG instances already split memory and compute; share an instance with MPS instead",
    ),
    (
        "MIG on a GPU that an earlier entry gives to the limiter",
        """\
        - select: {nodes: "gpu-a-*"}
          limiter: {tenants: {vision: {compute: 30%}}}
        - select: {nodes: "gpu-a-*", gpus: "4-7"}
          mig: {enabled: true, profiles: {"7g.80gb": 1}}
        """,
        "f.yaml:12:5: carve[1].mig: MIG on a GPU that carve[0] gives to the limiter, on gpu-a-01 GPU 4 and 7 more GPUs; MIG instances already split memory and compute; share an instance with MPS instead",
    ),
    (
        "limiter and MPS on the same GPU",
        """\
        - select: {nodes: "gpu-b-01"}
          mps: {enabled: true}
        - select: {nodes: "gpu-b-01", gpus: 3}
          limiter: {tenants: {vision: {compute: 30%}}}
        """,
        "f.yaml:12:5: carve[1].limiter: the limiter and MPS (from carve[0]) on the same GPU, on gpu-b-01 GPU 3; use one per GPU: the limiter hands the GPU to one tenant at a time, which serializes MPS clients",
    ),
    (
        "duplicate selector",
        """\
        - select: {nodes: "gpu-a-*,zone=a", gpus: "0-3"}
          mig: {enabled: true, profiles: {"1g.10gb": 7}}
        - select: {nodes: "zone=a, gpu-a-*", gpus: [0, 1, 2, 3]}
          mig: {enabled: false}
        """,
        "f.yaml:11:5: carve[1].select: duplicate selector: carve[0] at line 9 already sets mig for the same GPUs; merge the two entries; a later entry overrides an earlier one only where selections overlap",
    ),
    (
        "duplicate selector of every GPU",
        """\
        - select: {nodes: "*"}
          mps: {enabled: true}
        - select: {gpus: {}}
          mps: {enabled: false}
        """,
        "f.yaml:11:5: carve[1].select: duplicate selector: carve[0] at line 9 already sets mps for the same GPUs; merge the two entries; a later entry overrides an earlier one only where selections overlap",
    ),
    (
        "an entry without a kind",
        """\
        - select: {nodes: gpu-a-01}
        """,
        "f.yaml:9:5: carve[0]: an entry needs mig:, mps:, limiter: or partition:; say what the selected GPUs should have",
    ),
    (
        "an entry without select",
        """\
        - mps: {enabled: true}
        """,
        "f.yaml:9:5: carve[0]: missing required key 'select'; which GPUs: select: {nodes: gpu-a-*, gpus: 0-3}",
    ),
    (
        "a selector that selects no node",
        """\
        - select: {nodes: "gpu-x-01"}
          mps: {enabled: true}
        """,
        "f.yaml:9:21: carve[0].select.nodes: selects no node (selector 'gpu-x-01'); did you mean 'gpu-c-01'?",
    ),
    (
        "a malformed node selector",
        """\
        - select: {nodes: "zone==a"}
          mps: {enabled: true}
        """,
        "f.yaml:9:21: carve[0].select.nodes: '=a' is not a label value (in 'zone==a'); node-name globs (gpu-a-*) and label terms (zone=a, zone!=b), comma-separated",
    ),
    (
        "a model that the selected nodes are not",
        """\
        - select: {nodes: "gpu-a-*", gpus: {model: A100-80GB}}
          mps: {enabled: true}
        """,
        "f.yaml:9:38: carve[0].select.gpus: selects no GPU: the selected nodes are labelled as other models (gpu-a-01: model='h100-80gb'); fix the model, the node selector or the nodes' labels",
    ),
    (
        "an ambiguous model",
        """\
        - select: {gpus: {model: H100}}
          mps: {enabled: true}
        """,
        "f.yaml:9:21: carve[0].select.gpus.model[0]: ambiguous GPU model 'H100'; name the memory size too: H100-80GB, H100-96GB, H100-NVL-94GB, H100-PCIE-80GB",
    ),
    (
        "GPU indices out of range",
        """\
        - select: {gpus: "0-300"}
          mps: {enabled: true}
        """,
        "f.yaml:9:20: carve[0].select.gpus: GPU index 300 is out of range (0 to 255); GPU indices: 3, 0-3, 4,5 or 0-1,6 (0 to 255)",
    ),
    (
        "a MIG UUID",
        """\
        - select: {gpus: MIG-5f0c3b8e-2a8e-4d0e-9f6d-1b2c3d4e5f60}
          mps: {enabled: true}
        """,
        "f.yaml:9:20: carve[0].select.gpus: not a GPU UUID (got 'MIG-5f0c3b8e-2a8e-4d0e-9f6d-1b2c3d4e5f60'); MIG instances are not selected one by one",
    ),
    (
        "a list of indices and UUIDs mixed",
        """\
        - select: {gpus: [0, GPU-5f0c3b8e-2a8e-4d0e-9f6d-1b2c3d4e5f60]}
          mps: {enabled: true}
        """,
        "f.yaml:9:20: carve[0].select.gpus: a GPU list holds indices or UUIDs, one kind; e.g. [0, 1] or [GPU-8f2c..., GPU-1a2b...]",
    ),
    (
        "a relative pipe directory",
        """\
        - select: {gpus: 0}
          mps: {enabled: true, pipe_directory: run/mps}
        """,
        "f.yaml:10:42: carve[0].mps.pipe_directory: not a usable absolute directory (got 'run/mps'); an absolute path of letters, digits and _ . / + @ = , - (e.g. /run/gpuops/mps)",
    ),
    (
        "an unknown key in mig with a close match",
        """\
        - select: {nodes: gpu-a-01}
          mig: {enabled: true, profile: {"1g.10gb": 1}}
        """,
        "f.yaml:10:26: carve[0].mig.profile: unknown key 'profile'; did you mean 'profiles'?",
    ),
]


@pytest.mark.parametrize(("carve", "expected"), [(c, e) for _, c, e in CASES], ids=[c[0] for c in CASES])
def test_rule(carve: str, expected: str | list[str]) -> None:
    assert errors(carve) == ([expected] if isinstance(expected, str) else expected)


def test_every_error_is_one_located_line() -> None:
    for _, carve, _ in CASES:
        for line in errors(carve):
            assert "\n" not in line
            assert line.startswith("f.yaml:")
            head = line.split(": ", 1)[0]
            _, row, column = head.split(":")
            assert int(row) >= 9 and int(column) >= 1, line


# ---- what loads ---------------------------------------------------------------------------------


def load(carve: str) -> Fleet:
    return parse_fleet(fleet_text(carve), "f.yaml")


def test_every_spelling_of_a_selection_loads() -> None:
    fleet = load(
        """\
        - select: {nodes: gpu-b-01, gpus: 3}
          mps: {enabled: true}
        - select: {nodes: gpu-b-01, gpus: "4,5"}
          mps: {enabled: true}
        - select: {nodes: gpu-b-01, gpus: [6, 7]}
          mps: {enabled: true}
        - select: {nodes: gpu-b-01, gpus: GPU-5F0C3B8E-2A8E-4D0E-9F6D-1B2C3D4E5F60}
          mps: {enabled: true}
        - select: {nodes: gpu-b-01, gpus: [GPU-00000000-0000-0000-0000-000000000001]}
          mps: {enabled: true}
        - select: {nodes: "gpu-a-*", gpus: {model: NVIDIA H100 80GB HBM3, indices: "0-3"}}
          mps: {enabled: true}
        - select: {gpus: {model: [h100-sxm5-80gb, A100-80GB]}}
          mig: {enabled: true}
        - select: {nodes: "nvidia.com/gpu.product=NVIDIA-A100*"}
          limiter: {tenants: {vision: {compute: 30}}}
        """
    )
    gpus = [e.select.gpus for e in fleet.carve]
    assert [g.indices if g else None for g in gpus[:3]] == ["3", "4,5", "6,7"]
    assert gpus[3] is not None and gpus[3].uuids == ["GPU-5F0C3B8E-2A8E-4D0E-9F6D-1B2C3D4E5F60"]
    assert gpus[5] is not None and gpus[5].model == ["H100-80GB"] and gpus[5].indices == "0-3"
    assert gpus[6] is not None and gpus[6].model == ["H100-80GB", "A100-80GB"]
    assert fleet.carve[7].select.nodes == "nvidia.com/gpu.product=NVIDIA-A100*" and gpus[7] is None


def test_values_are_read_in_their_units() -> None:
    fleet = load(
        """\
        - select: {nodes: gpu-b-01, gpus: 0}
          mps:
            enabled: yes
            active_thread_percentage: "40%"
            pinned_memory_limit: 1.5GiB
            per_tenant: {nlp: {pinned_memory_limit: 512MiB}}
        - select: {nodes: gpu-b-01, gpus: 1}
          limiter:
            tenants:
              vision: {memory: 8GB, compute: 12.5%}
              nlp: {compute: "30"}
              "*":
        """
    )
    mps = fleet.carve[0].mps
    assert mps is not None and mps.enabled is True
    assert mps.active_thread_percentage == 40 and mps.pinned_memory_limit == 1536 * 1024**2
    assert mps.per_tenant["nlp"].pinned_memory_limit == 512 * 1024**2
    limiter = fleet.carve[1].limiter
    assert limiter is not None
    assert limiter.tenants["vision"].memory == 8 * 1000**3 and limiter.tenants["vision"].compute == 12.5
    assert limiter.tenants["nlp"].compute == 30.0 and limiter.tenants["*"].memory is None


def test_mig_counts_of_zero_and_an_empty_layout() -> None:
    fleet = load(
        """\
        - select: {nodes: gpu-b-01, gpus: 0}
          mig: {enabled: true, profiles: {"1g.10gb": 0, "3g.40gb": 2}}
        - select: {nodes: gpu-b-01, gpus: 1}
          mig: {enabled: true, profiles: {}}
        - select: {nodes: gpu-b-01, gpus: 2}
          mig: {enabled: true}
        """
    )
    d0 = fleet.desired_for("gpu-b-01", 0, None, "A100-80GB").mig
    d1 = fleet.desired_for("gpu-b-01", 1, None, "A100-80GB").mig
    d2 = fleet.desired_for("gpu-b-01", 2, None, "A100-80GB").mig
    assert d0 is not None and d0.profiles == (("3g.40gb", 2),) and not d0.keeps_instances
    assert d1 is not None and d1.profiles == () and not d1.keeps_instances
    assert d2 is not None and d2.keeps_instances


def test_overlapping_selections_later_wins_per_kind() -> None:
    fleet = load(
        """\
        - select: {nodes: "gpu-a-*"}
          mig: {enabled: true, profiles: {"3g.40gb": 2}}
          mps: {enabled: true, active_thread_percentage: 50}
        - select: {nodes: gpu-a-01, gpus: "2-3"}
          mps: {enabled: true, active_thread_percentage: 25}
        - select: {nodes: gpu-a-01, gpus: 3}
          mig: {enabled: false}
        """
    )
    h100 = "NVIDIA H100 80GB HBM3"
    g0 = fleet.desired_for("gpu-a-01", 0, None, h100)
    g2 = fleet.desired_for("gpu-a-01", 2, None, h100)
    g3 = fleet.desired_for("gpu-a-01", 3, None, h100)
    assert (
        g0.mig is not None
        and g0.mig.entry == 0
        and g0.mps is not None
        and g0.mps.active_thread_percentage == 50
    )
    assert g2.mig is not None and g2.mig.entry == 0 and g2.mps is not None and g2.mps.entry == 1
    assert g3.mig is not None and not g3.mig.enabled and g3.mig.entry == 2 and g3.mps is not None
    assert g3.mps.active_thread_percentage == 25 and g3.limiter is None
    assert g3.mps_per_instance() is False and g2.mps_per_instance() is True
    other = fleet.desired_for("gpu-b-01", 0, None, h100)
    assert other.empty and other.ok and other.mig is None and other.mps is None and other.limiter is None


# ---- the example --------------------------------------------------------------------------------

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "fleet.yaml"
UUID = "GPU-5f0c3b8e-2a8e-4d0e-9f6d-1b2c3d4e5f60"


def test_the_example_resolves() -> None:
    fleet = load_fleet(EXAMPLE)
    assert len(fleet.carve) == 5
    a = fleet.desired_for("dgx-a-01", 0, UUID, "NVIDIA A100-SXM4-80GB")
    assert a.ok and a.mig is not None and a.solved_layout is not None and a.solved_layout.ok
    assert [str(p) for p in a.solved_layout.placements] == [
        "2g.20gb@0",
        "1g.10gb@2",
        "1g.10gb@3",
        "3g.40gb@4",
    ]
    assert a.solved_layout.result == solve(MODELS["A100-80GB"], {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2})
    training = fleet.desired_for("dgx-a-02", 7, UUID, "NVIDIA A100-SXM4-80GB")
    assert training.mig is not None and not training.mig.enabled and training.solved_layout is None
    b = fleet.desired_for("dgx-b-01", 4, UUID, "NVIDIA H100 80GB HBM3")
    assert b.ok and b.mig is not None and b.mps is not None and b.mps_per_instance() is True
    assert b.solved_layout is not None
    assert [str(p) for p in b.solved_layout.placements] == [
        "2g.20gb@0",
        "1g.10gb@2",
        "1g.10gb@3",
        "3g.40gb@4",
    ]
    three_g = b.solved_layout.instances[-1]
    assert [c.name for c in three_g.compute] == ["1c.3g.40gb"] * 3 and three_g.compute_starts == (0, 1, 2)
    assert b.mig.location == f"{EXAMPLE}:133:5" and b.mps.location == b.mig.location
    assert b.mps.pipe_directory_for("MIG-1") == "/run/gpuops/mps/MIG-1"
    assert b.mps.log_directory_for("MIG-1") == "/var/log/gpuops/mps/MIG-1"
    assert fleet.desired_for("dgx-b-01", 0, UUID, "NVIDIA H100 80GB HBM3").empty
    l40s = fleet.desired_for("l40s-c-02", 3, UUID, "NVIDIA L40S")
    assert (
        l40s.ok and l40s.mig is None and l40s.mps is not None and l40s.mps.pinned_memory_limit == 10 * 1024**3
    )
    assert l40s.mps.for_tenant("recsys").active_thread_percentage == 50
    assert l40s.mps.for_tenant("vision").pinned_memory_limit == 10 * 1024**3
    assert fleet.desired_for("l40s-c-02", 3, UUID, "NVIDIA A100-SXM4-80GB").mps is None
    shared = fleet.desired_for("dgx-b-02.dc1.example.com", 1, UUID, "NVIDIA H100 80GB HBM3")
    assert shared.limiter is not None
    assert [(t.name, t.policy, t.klass) for t in shared.limiter.tenants] == [
        ("vision", "fixed-share", "online"),
        ("nlp", "fixed-share", "offline"),
        ("*", "best-effort", "online"),
    ]


def test_limiter_tenants_are_lines_the_limiter_reads() -> None:
    fleet = load_fleet(EXAMPLE)
    shared = fleet.desired_for("dgx-b-02.dc1.example.com", 1, UUID, "NVIDIA H100 80GB HBM3")
    assert shared.limiter is not None
    specs = shared.limiter.tenant_specs(gpus=[UUID])
    generation, back = parse_table(format_table(specs, 7))
    assert generation == 7 and tuple(back) == specs
    assert format_table(specs, 1).splitlines()[3] == (
        f"tenant vision memory=21474836480 compute=30 policy=fixed-share class=online gpus={UUID}"
    )
    off = DesiredLimiter(enabled=False, tenants=(), entry=0, location="")
    assert off.tenant_specs(["0"]) == ()


# ---- plan time ----------------------------------------------------------------------------------


def test_a_layout_that_fits_some_model_is_checked_against_the_live_one() -> None:
    fleet = load(
        """\
        - select: {nodes: gpu-b-01}
          mig: {enabled: true, profiles: {"3g.40gb": 2}}
        """
    )
    fine = fleet.desired_for("gpu-b-01", 0, UUID, "NVIDIA H100 80GB HBM3")
    assert fine.ok and fine.solved_layout is not None and fine.solved_layout.ok
    wrong = fleet.desired_for("gpu-b-01", 0, UUID, "NVIDIA A100-SXM4-40GB")
    assert wrong.solved_layout is not None and not wrong.solved_layout.ok
    assert [str(p) for p in wrong.problems] == [
        "f.yaml:10:37: carve[0].mig.profiles[\"3g.40gb\"]: unknown profile '3g.40gb' for A100-SXM4-40GB; valid: "
        "1g.5gb, 1g.5gb+me, 1g.10gb, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb; gpu-b-01 GPU 0 is an A100-SXM4-40GB; "
        "try: gpuops mig check A100-SXM4-40GB 3g.40gb 3g.40gb"
    ]


def test_mig_skips_gpus_without_mig_unless_named() -> None:
    fleet = load(
        """\
        - select: {nodes: gpu-b-01}
          mig: {enabled: true, profiles: {"1g.10gb": 7}}
        - select: {nodes: gpu-b-01, gpus: 2}
          mig: {enabled: true, profiles: {"1g.10gb": 7}}
        - select: {nodes: gpu-b-01, gpus: 3}
          mig: {enabled: false}
        """
    )
    skipped = fleet.desired_for("gpu-b-01", 0, UUID, "NVIDIA L40S")
    assert skipped.ok and skipped.mig is None
    assert fleet.desired_for("gpu-b-01", 3, UUID, "NVIDIA L40S").ok
    named = fleet.desired_for("gpu-b-01", 2, UUID, "NVIDIA L40S")
    assert named.mig is None
    assert [str(p) for p in named.problems] == [
        "f.yaml:11:37: carve[1].select.gpus: MIG on a GPU without MIG (NVIDIA L40S, not in gpuops' MIG catalog), "
        "on gpu-b-01 GPU 2; select MIG-capable GPUs only; by node or model, GPUs without MIG are skipped"
    ]


def test_uuid_and_model_selections_decide_at_plan_time() -> None:
    fleet = load(
        f"""\
        - select: {{nodes: gpu-b-01}}
          mps: {{enabled: true}}
        - select: {{nodes: gpu-b-01, gpus: {{model: L40S}}}}
          limiter: {{tenants: {{vision: {{compute: 30%}}}}}}
        - select: {{nodes: gpu-b-01, gpus: [{UUID.upper().replace("GPU-", "GPU-")}]}}
          mps: {{enabled: true, active_thread_percentage: 10}}
        """
    )
    mine = fleet.desired_for("gpu-b-01", 5, UUID, "NVIDIA A100-SXM4-80GB")
    assert (
        mine.ok and mine.mps is not None and mine.mps.active_thread_percentage == 10 and mine.limiter is None
    )
    other = fleet.desired_for("gpu-b-01", 5, UUID.replace("5f", "00"), "NVIDIA A100-SXM4-80GB")
    assert other.ok and other.mps is not None and other.mps.active_thread_percentage is None
    l40s = fleet.desired_for("gpu-b-01", 1, "GPU-00000000-0000-0000-0000-000000000000", "NVIDIA L40S")
    assert l40s.limiter is not None and l40s.mps is not None
    assert [str(p) for p in l40s.problems] == [
        "f.yaml:12:5: carve[1].limiter: the limiter and MPS (from carve[0]) on the same GPU, on gpu-b-01 GPU 1; "
        "use one per GPU: the limiter hands the GPU to one tenant at a time, which serializes MPS clients"
    ]


def test_live_facts_given_by_the_plan_are_checked() -> None:
    fleet = load(
        """\
        - select: {nodes: gpu-b-01, gpus: 0}
          limiter: {tenants: {vision: {compute: 30%, memory: 40GiB}}}
        - select: {nodes: gpu-b-01, gpus: 1}
          mps: {enabled: true, pinned_memory_limit: 60GiB}
        """
    )
    in_mig = fleet.desired_for("gpu-b-01", 0, UUID, "NVIDIA H100 80GB HBM3", mig_mode=True)
    assert [str(p) for p in in_mig.problems] == [
        "f.yaml:10:5: carve[0].limiter: the limiter cannot share a GPU in MIG mode (MIG from its live MIG mode), "
        "on gpu-b-01 GPU 0; MIG instances already split memory and compute; share an instance with MPS instead"
    ]
    assert fleet.desired_for("gpu-b-01", 0, UUID, "NVIDIA H100 80GB HBM3", mig_mode=False).ok
    small = fleet.desired_for("gpu-b-01", 0, UUID, "NVIDIA L4", memory_total=24 * 1024**3)
    assert [p.message for p in small.problems] == [
        "40GiB is more than the 24GiB of the NVIDIA L4, on gpu-b-01 GPU 0"
    ]
    assert fleet.desired_for("gpu-b-01", 1, UUID, "NVIDIA L40S").ok  # memory not known
    l40s = fleet.desired_for("gpu-b-01", 1, UUID, "NVIDIA L40S", memory_total=48 * 1024**3)
    assert [p.path for p in l40s.problems] == ["carve[1].mps.pinned_memory_limit"]


def test_a_fleet_built_in_code() -> None:
    fleet = Fleet(
        version=1,
        teams={"vision": Team()},
        nodes=[NodeEntry(name="n1", host="n1")],
        carve=[
            CarveEntry.model_validate(
                {"select": {"gpus": 0}, "mig": {"enabled": True, "profiles": {"3g.40gb": 3}}}
            )
        ],
    )
    assert [str(i) for i in check_fleet(fleet)] == [
        "<fleet>: carve[0].mig.profiles: 3g.40gb: at most 2 per GPU (asked for 3) (on A100-80GB); fits no model "
        "with these profiles (A100-80GB, H100-80GB, H100-PCIE-80GB); try: gpuops mig check A100-80GB 3g.40gb "
        "3g.40gb 3g.40gb"
    ]
    d = fleet.desired_for("n1", 0, None, MODELS["H100-80GB"])
    assert d.mig is not None and d.mig.location == "carve[0]" and fleet.carve_location(0) == "carve[0]"
    assert [str(p) for p in d.problems] == [
        "<fleet>: carve[0].mig.profiles: 3g.40gb: at most 2 per GPU (asked for 3); n1 GPU 0 is an H100-80GB; "
        "try: gpuops mig check H100-80GB 3g.40gb 3g.40gb 3g.40gb"
    ]
    assert parse_fleet("version: 1\nnodes: [{host: n1}]\n").desired_for("n1", 0).empty


# ---- solve_layout --------------------------------------------------------------------------------


def test_solve_layout() -> None:
    spec = MigSpec.model_validate(
        {"enabled": True, "profiles": {"7g.80gb": 1}, "compute": {"7g.80gb": ["1c", "3c", "3c"]}}
    )
    layout = solve_layout(spec, "H100-80GB")
    assert layout.ok and layout.result.ok and [str(p) for p in layout.placements] == ["7g.80gb@0"]
    (inst,) = layout.instances
    assert [c.slices for c in inst.compute] == [3, 3, 1] and inst.compute_starts == (0, 4, 3)
    entry = CarveEntry.model_validate({"select": {}, "mig": {"enabled": True, "placements": ["1g.10gb@6"]}})
    assert [str(p) for p in solve_layout(entry, MODELS["A100-80GB"]).placements] == ["1g.10gb@6"]
    assert not solve_layout(entry, "V100").ok
    assert (
        solve_layout(entry, "V100").reason == "'V100' is not a MIG model gpuops knows (see gpuops mig models)"
    )
    off = solve_layout(MigSpec(enabled=False), "A30")
    assert off.ok and off.placements == () and off.instances == ()
    a30 = solve_layout(
        MigSpec.model_validate({"enabled": True, "profiles": {"2g.12gb+me": 1, "1g.6gb+me": 1}}), "A30"
    )
    assert not a30.ok and a30.reason.startswith("needs 2 JPEG engines") and a30.path == ("profiles",)
    wrong_ci = solve_layout(
        MigSpec.model_validate(
            {"enabled": True, "profiles": {"4g.40gb": 1}, "compute": {"4g.40gb": ["4c.3g.40gb"]}}
        ),
        "H100-80GB",
    )
    assert wrong_ci.reason == "4c.3g.40gb is not a compute profile of 4g.40gb (write 4c)"
    assert wrong_ci.path == ("compute", "4g.40gb")
    with pytest.raises(ValueError):
        solve_layout(CarveEntry.model_validate({"select": {}, "mps": {"enabled": True}}), "A30")


def test_a_solved_layout_gives_the_core_layout_nodes_apply() -> None:
    h100 = MODELS["H100-80GB"]
    seven, four, two = h100.profile("7g.80gb"), h100.profile("4g.40gb"), h100.profile("2g.20gb")
    ci = {cp.slices: cp.id for cp in seven.compute_profiles}
    spec = MigSpec.model_validate(
        {"enabled": True, "profiles": {"7g.80gb": 1}, "compute": {"7g.80gb": ["1c", "3c", "3c"]}}
    )
    # the solver lists compute instances largest first; the core layout, in placement order (by
    # compute-slice start) as the node reads them back
    assert solve_layout(spec, h100).layout() == MigLayout(
        True, (InstanceSpec(seven.id, 0, (ci[3], ci[1], ci[3])),)
    )
    spec = MigSpec.model_validate({"enabled": True, "profiles": {"2g.20gb": 1, "4g.40gb": 1}})
    layout = solve_layout(spec, h100).layout()
    assert layout == MigLayout(
        True,
        (
            InstanceSpec(four.id, 0, (four.default_compute_profile.id,)),
            InstanceSpec(two.id, 4, (two.default_compute_profile.id,)),
        ),
    )
    assert MigLayout.from_json(layout.to_json()) == layout
    assert solve_layout(MigSpec(enabled=False), "A30").layout() == MigLayout(False)
    with pytest.raises(ValueError, match="keeps the live instances"):
        solve_layout(MigSpec(enabled=True), "A30").layout()
    with pytest.raises(ValueError, match="at most"):
        solve_layout(
            MigSpec.model_validate({"enabled": True, "profiles": {"7g.80gb": 2}}), "H100-80GB"
        ).layout()


# ---- round trip ----------------------------------------------------------------------------------


def test_dump_writes_carve_back() -> None:
    fleet = load_fleet(EXAMPLE)
    text = dump_fleet(fleet)
    assert "carve:" in text and "class: offline" in text and "compute: 30%" in text
    assert "pinned_memory_limit: 8GiB" in text and "gpus: {model: L40S}" in text
    back = parse_fleet(text, "dumped.yaml")
    assert back == fleet and back.carve == fleet.carve


def test_the_schema_describes_carve() -> None:
    schema = fleet_json_schema()
    assert schema["properties"]["carve"]["items"] == {"$ref": "#/$defs/CarveEntry"}
    entry = schema["$defs"]["CarveEntry"]
    assert entry["required"] == ["select"] and entry["additionalProperties"] is False
    gpus = schema["$defs"]["GpuSelect"]["anyOf"]
    assert gpus[0]["type"] == "object" and {"type": "integer", "minimum": 0, "maximum": 255} in gpus
    assert (
        "3g.40gb" in schema["$defs"]["MigSpec"]["properties"]["profiles"]["anyOf"][0]["propertyNames"]["enum"]
    )
    tenant = schema["$defs"]["LimiterTenantSpec"]["properties"]
    assert set(tenant) == {"memory", "compute", "policy", "class"}
    assert all("description" in spec for spec in tenant.values())
    # a tenant written empty (nlp:) is a valid tenant
    tenants = schema["$defs"]["LimiterSpec"]["properties"]["tenants"]
    assert {"type": "null"} in tenants["additionalProperties"]["anyOf"]


def test_mig_for_every_node_leaves_a_node_labelled_without_mig_to_the_plan() -> None:
    fleet = parse_fleet(
        textwrap.dedent(
            """\
            version: 1
            teams: {vision: {}}
            nodes:
              - {name: gpu-a-01, host: h1, labels: {model: h100-80gb}}
              - {name: l40s-01, host: h2, labels: {model: l40s}}
            carve:
              - select: {nodes: "*"}
                mig: {enabled: true, profiles: {"7g.80gb": 1}}
              - select: {nodes: l40s-01}
                limiter: {tenants: {vision: {compute: 30%}}}
            """
        ),
        "f.yaml",
    )
    l40s = fleet.desired_for("l40s-01", 0, UUID, "NVIDIA L40S")
    assert l40s.ok and l40s.mig is None and l40s.limiter is not None
    # were it a MIG GPU after all, the plan says so
    odd = fleet.desired_for("l40s-01", 0, UUID, "NVIDIA H100 80GB HBM3")
    assert [p.message for p in odd.problems] == [
        "the limiter cannot share a GPU in MIG mode (MIG from carve[0]), on l40s-01 GPU 0"
    ]
