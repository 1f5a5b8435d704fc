"""Simulated fleets: which nodes, which teams own them, and a sim spec per node.

`build_fleet(scenario, nodes, seed, epoch)` is a pure function: the same arguments give the same
specs, byte for byte. Every node gets its own sim spec dict (the format of docs/simulator.md);
the sim fleet server builds one `SimBackend` from each.

Node profiles (what a team does with its silo):

- `training`: a busy training team, DDP jobs on every card (~96%);
- `inference`: online serving with a daily rhythm (diurnal load, peak in working hours);
- `notebooks`: interactive notebooks, mostly idle with bursts, and a stale kernel holding memory;
- `mig`: a platform node carved with MIG, serving small tenants of other teams;
- `saturated`: every card at ~98% and queued work waiting (pending workloads);
- `idle`: an idle silo, its cards with nothing on them (or a forgotten kernel at 0%).

Scenarios:

- `silos` (the demo, 8 nodes by default): seven teams, one per profile and two idle silos, each
  node hand-shaped. Fewer nodes take a prefix of a list ordered for variety (3 nodes: busy,
  saturated with a queue, idle); more nodes repeat the templates with new names.
- `large` (benchmarks, 200 nodes by default, any number up to 5000): ~1 team per 20 nodes, each
  with a profile drawn from the seed, nodes in contiguous blocks. Nodes are kept cheap to sample:
  few workloads (one DDP job spans a node), so the sample cost is mostly per GPU.
- `mixed` (6 nodes by default): NVIDIA and AMD Instinct MI300X nodes side by side; vision and chat
  own both kinds, one MI300X node is carved into compute/memory partitions (CPX/NPS4, DPX) and
  serves chat and vision, research owns an idle MI300X silo, platform a MIG-carved H100 node.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

SCENARIOS = ("silos", "large", "mixed")
DEFAULT_NODES = {"silos": 8, "large": 200, "mixed": 6}
MAX_NODES = 5000
PROFILES = ("training", "inference", "notebooks", "mig", "saturated", "idle")
# Queued work (a node's pending workloads, demand.py) runs this much faster than real time by
# default (`sim up --queue-speed`); here, not in demand.py, so that starting a fleet needs no
# more than this module.
DEFAULT_SPEED = 60.0

Spec = dict[str, Any]


class ScenarioError(ValueError):
    """Unknown scenario or a node count out of range; the message is one line for a person."""


@dataclass(frozen=True)
class SimNode:
    """One simulated node: its fleet.yaml entry and the sim spec its backend is built from."""

    name: str
    owner: str
    profile: str
    spec: Spec = field(compare=False, repr=False)
    labels: tuple[tuple[str, str], ...] = ()

    @property
    def gpu_count(self) -> int:
        return sum(int(g.get("count", 1)) for g in self.spec["gpus"])

    def queued(self) -> list[str]:
        """Names of the workloads queued at the epoch (start "pending" or in the future)."""
        out = []
        for w in self.spec.get("workloads", []):
            start = w.get("start")
            if start == "pending" or (isinstance(start, str) and start.startswith("+")):
                out.append(str(w["name"]))
        return out


@dataclass(frozen=True)
class SimFleetPlan:
    scenario: str
    seed: int
    epoch: float
    teams: dict[str, tuple[str, ...]]  # team -> its unix users
    nodes: tuple[SimNode, ...]


# ---- people ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Team:
    name: str
    users: tuple[str, ...]
    service: str | None = None  # a service account that runs the team's servers

    @property
    def members(self) -> tuple[str, ...]:
        return self.users + ((self.service,) if self.service else ())


class _People:
    """Unix users and teams, with stable uids in order of first appearance."""

    def __init__(self) -> None:
        self.teams: dict[str, _Team] = {}
        self.uids: dict[str, int] = {}
        self._next = {"person": 1001, "service": 2001}

    def add(self, team: _Team) -> _Team:
        self.teams[team.name] = team
        for user in team.members:
            if user not in self.uids:
                kind = "service" if user.startswith("svc-") else "person"
                self.uids[user] = self._next[kind]
                self._next[kind] += 1
        return team


def _seed_for(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{seed}/{name}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def _spec(
    name: str,
    seed: int,
    epoch: float,
    utc_offset: str,
    people: _People,
    gpus: list[Any],
    workloads: list[dict[str, Any]],
    description: str,
    driver: str = "550.54.15",
    runtime: str = "12.4",
) -> Spec:
    """A sim spec dict with only the users and teams this node mentions."""
    teams: set[str] = set()
    for g in gpus:
        if isinstance(g, dict) and g.get("owner"):
            teams.add(str(g["owner"]))
    for w in workloads:
        if w.get("tenant"):
            teams.add(str(w["tenant"]))
        else:
            teams.update(t.name for t in people.teams.values() if w["user"] in t.members)
    tenants = {t: list(people.teams[t].members) for t in sorted(teams)}
    users = {u: people.uids[u] for t in sorted(teams) for u in people.teams[t].members}
    return {
        "version": 1,
        "description": description,
        "hostname": name,
        "seed": _seed_for(seed, name),
        "epoch": epoch,
        "utc_offset": utc_offset,
        "driver_version": driver,
        "cuda_driver_version": runtime,
        "users": users,
        "tenants": tenants,
        "gpus": gpus,
        "workloads": workloads,
    }


# ---- node templates (shared by both scenarios) ------------------------------------------------


@dataclass(frozen=True)
class _Shape:
    """What varies between nodes of one profile in `large`; `silos` uses the defaults."""

    gpus: int = 8
    model: str = "A100-80GB"
    util: float = 96.0
    variant: int = 0  # picks among a template's alternatives


def _training(name: str, team: _Team, shape: _Shape) -> tuple[list[Any], list[dict[str, Any]], str]:
    n = shape.gpus
    lead, other = team.users[0], team.users[-1]
    gpus: list[Any] = [{"model": shape.model, "count": n, "owner": team.name}]
    if shape.variant % 2 == 0 and n >= 4:
        half = n // 2
        workloads = [
            {
                "name": f"{team.name}-pretrain",
                "kind": "training",
                "user": lead,
                "gpus": list(range(half)),
                "memory": "90%",
                "start": "-2d3h17m",
                "command": f"torchrun --nproc-per-node {half} train.py",
                "params": {"util": shape.util, "checkpoint_every": "1h", "checkpoint_seconds": 40},
            },
            {
                "name": f"{team.name}-finetune",
                "kind": "training",
                "user": other,
                "gpus": list(range(half, n)),
                "memory": "80%",
                "start": "-7h20m",
                "command": f"torchrun --nproc-per-node {n - half} finetune.py",
                "params": {"util": max(shape.util - 4, 90.0)},
            },
        ]
    else:
        workloads = [
            {
                "name": f"{team.name}-ddp",
                "kind": "training",
                "user": lead,
                "gpus": list(range(n)),
                "memory": "92%",
                "start": "-4d1h43m",
                "command": f"torchrun --nproc-per-node {n} train.py",
                "params": {"util": shape.util, "checkpoint_every": "2h"},
            },
        ]
    return gpus, workloads, f"{team.name}: training on every card"


def _inference(name: str, team: _Team, shape: _Shape) -> tuple[list[Any], list[dict[str, Any]], str]:
    n = shape.gpus
    svc = team.service or team.users[0]
    gpus: list[Any] = [{"model": shape.model, "count": n, "owner": team.name}]
    workloads: list[dict[str, Any]] = []
    first = 0
    if n >= 4:
        workloads.append(
            {
                "name": f"{team.name}-llm",
                "kind": "inference",
                "user": svc,
                "gpus": [0, 1],
                "memory": "92%",
                "limiter": True,
                "command": "python -m vllm.entrypoints.openai.api_server --tensor-parallel-size 2",
                "params": {"peak_util": 90, "night_util": 8},
            }
        )
        first = 2
    # One replica per remaining card but the last, kept free as headroom.
    for i, g in enumerate(range(first, max(first + 1, n - 1))):
        workloads.append(
            {
                "name": f"{team.name}-replica-{i}",
                "kind": "inference",
                "user": svc,
                "gpu": g,
                "memory": "70%",
                "command": "tritonserver --model-repository /models",
                "params": {"peak_util": 80 - 4 * (i % 3), "night_util": 5},
            }
        )
    return gpus, workloads, f"{team.name}: online inference with a daily rhythm"


def _notebooks(name: str, team: _Team, shape: _Shape) -> tuple[list[Any], list[dict[str, Any]], str]:
    n = max(shape.gpus, 2)
    gpus: list[Any] = [{"model": shape.model, "count": n, "owner": team.name}]
    users = team.users
    workloads: list[dict[str, Any]] = [
        {
            "name": f"{users[0]}-notebook",
            "kind": "notebook",
            "user": users[0],
            "gpu": 0,
            "memory": "30%",
            "params": {"burst_probability": 0.25},
        },
        {"name": f"{users[-1]}-notebook-2", "kind": "notebook", "user": users[-1], "gpu": 0, "memory": "20%"},
        {
            "name": f"{users[0]}-stale-kernel",
            "kind": "idle",
            "user": users[0],
            "gpu": n - 1,
            "memory": "25%",
            "start": "-9d",
        },
    ]
    if n >= 4 and len(users) > 2:
        workloads.append(
            {
                "name": f"{users[1]}-notebook",
                "kind": "notebook",
                "user": users[1],
                "gpu": 1,
                "memory": "40%",
                "params": {"burst_probability": 0.15},
            }
        )
    return gpus, workloads, f"{team.name}: notebooks, mostly idle, and a forgotten kernel"


def _mig(
    name: str, team: _Team, shape: _Shape, tenants: list[_Team]
) -> tuple[list[Any], list[dict[str, Any]], str]:
    """A platform node carved with MIG; its slices serve small tenants of other teams."""
    big, mid, small = "3g.40gb", "2g.20gb", "1g.10gb"  # A100-80GB and H100-80GB alike
    n = shape.gpus
    half = max(n // 2, 1)
    gpus: list[Any] = [
        {
            "model": shape.model,
            "count": half,
            "owner": team.name,
            "mig": {"enabled": True, "layout": [big, mid, small, small]},
        },
    ]
    if n - half > 0:
        gpus.append(
            {
                "model": shape.model,
                "count": n - half,
                "owner": team.name,
                "mig": {"enabled": True, "layout": [small] * 7},
            }
        )
    workloads: list[dict[str, Any]] = []
    others = tenants or [team]
    for g in range(half):
        t = others[g % len(others)]
        workloads.append(
            {
                "name": f"{t.name}-embed-{g}",
                "kind": "inference",
                "user": t.service or t.users[0],
                "tenant": t.name,
                "gpu": g,
                "instance": 0,
                "memory": "80%",
                "limiter": True,
                "command": "python serve_embeddings.py",
                "params": {"peak_util": 70, "night_util": 10},
            }
        )
        u = others[(g + 1) % len(others)]
        workloads.append(
            {
                "name": f"{u.users[0]}-mig-notebook-{g}",
                "kind": "notebook",
                "user": u.users[0],
                "tenant": u.name,
                "gpu": g,
                "instance": 2,
                "memory": "60%",
            }
        )
    for g in range(half, n):
        t = others[g % len(others)]
        for k in range(0, 7, 3):  # three of the seven 1g slices in use
            workloads.append(
                {
                    "name": f"{t.name}-small-{g}-{k}",
                    "kind": "inference",
                    "user": t.service or t.users[0],
                    "tenant": t.name,
                    "gpu": g,
                    "instance": k,
                    "memory": "75%",
                    "limiter": True,
                    "command": "python serve_small.py",
                    "params": {"peak_util": 60, "night_util": 4},
                }
            )
    return gpus, workloads, f"{team.name}: MIG-carved platform node serving other teams"


def _saturated(name: str, team: _Team, shape: _Shape) -> tuple[list[Any], list[dict[str, Any]], str]:
    n = shape.gpus
    users = team.users
    gpus: list[Any] = [{"model": shape.model, "count": n, "owner": team.name}]
    half = max(n // 2, 1)
    workloads: list[dict[str, Any]] = [
        {
            "name": f"{team.name}-train-a",
            "kind": "training",
            "user": users[0],
            "gpus": list(range(half)),
            "memory": "95%",
            "start": "-12d",
            "params": {"util": max(shape.util, 97.0)},
        },
    ]
    if n > half:
        workloads.append(
            {
                "name": f"{team.name}-train-b",
                "kind": "training",
                "user": users[-1],
                "gpus": list(range(half, n)),
                "memory": "93%",
                "start": "-9d",
                "params": {"util": max(shape.util, 98.0)},
            }
        )
    queue = [("sweep", "6h", "40GiB"), ("distill", "12h", "60GiB"), ("eval", "2h", "20GiB")]
    for i, (job, duration, memory) in enumerate(queue[: 2 + shape.variant % 2]):
        workloads.append(
            {
                "name": f"{team.name}-{job}-queued",
                "kind": "training",
                "user": users[i % len(users)],
                "memory": memory,
                "start": "pending",
                "duration": duration,
                "command": f"python {job}.py",
            }
        )
    for trial in range(4):  # a hyperparameter search: small jobs that fit any free card
        workloads.append(
            {
                "name": f"{team.name}-hpo-t{trial}-queued",
                "kind": "training",
                "user": users[trial % len(users)],
                "memory": "24GiB",
                "start": "pending",
                "duration": "3h",
                "command": f"python hpo.py --trial {trial}",
            }
        )
    return gpus, workloads, f"{team.name}: every card saturated, work queued"


def _idle(name: str, team: _Team, shape: _Shape) -> tuple[list[Any], list[dict[str, Any]], str]:
    gpus: list[Any] = [{"model": shape.model, "count": shape.gpus, "owner": team.name}]
    workloads: list[dict[str, Any]] = []
    if shape.variant % 3 == 1:
        workloads.append(
            {
                "name": f"{team.users[0]}-forgotten-kernel",
                "kind": "idle",
                "user": team.users[0],
                "gpu": 0,
                "memory": "15%",
                "start": "-21d",
            }
        )
    return gpus, workloads, f"{team.name}: idle silo, the project ended"


_Template = Callable[[str, _Team, _Shape], tuple[list[Any], list[dict[str, Any]], str]]
_TEMPLATES: dict[str, _Template] = {
    "training": _training,
    "inference": _inference,
    "notebooks": _notebooks,
    "saturated": _saturated,
    "idle": _idle,
}


# ---- silos ---------------------------------------------------------------------------------------

_SILO_TEAMS = (
    _Team("vision", ("alice", "bob")),
    _Team("speech", ("heidi", "ivan")),
    _Team("robotics", ("judy",)),
    _Team("chat", ("carol", "dave"), "svc-chat"),
    _Team("platform", ("olga",)),
    _Team("research", ("erin", "frank", "gina")),
    _Team("analytics", ("ken", "leo")),
)

# (team, profile, shape), in the order nodes are taken: the first few already show the story.
_SILO_NODES: tuple[tuple[str, str, _Shape], ...] = (
    ("vision", "training", _Shape(8, "A100-80GB", 96.0, 0)),
    ("speech", "saturated", _Shape(4, "A100-80GB", 98.0, 1)),
    ("robotics", "idle", _Shape(8, "A100-SXM4-40GB", 0.0, 0)),
    ("chat", "inference", _Shape(8, "H100-80GB", 0.0, 0)),
    ("platform", "mig", _Shape(4, "H100-80GB", 0.0, 0)),
    ("research", "notebooks", _Shape(4, "A100-SXM4-40GB", 0.0, 0)),
    ("analytics", "idle", _Shape(4, "L40S", 0.0, 1)),
    ("vision", "training", _Shape(8, "A100-80GB", 95.0, 1)),
)


def _silos(nodes: int, seed: int, epoch: float, utc_offset: str) -> SimFleetPlan:
    people = _People()
    for team in _SILO_TEAMS:
        people.add(team)
    counters: dict[str, int] = {}
    out: list[SimNode] = []
    mig_tenants = [people.teams[t] for t in ("chat", "research", "vision")]
    for i in range(nodes):
        team_name, profile, shape = _SILO_NODES[i % len(_SILO_NODES)]
        counters[team_name] = counters.get(team_name, 0) + 1
        name = f"sim-{team_name}-{counters[team_name]:02d}"
        out.append(
            _node(
                name,
                people.teams[team_name],
                profile,
                shape,
                people,
                mig_tenants,
                "silos",
                seed,
                epoch,
                utc_offset,
            )
        )
    return SimFleetPlan("silos", seed, epoch, _teams_in(out, _SILO_TEAMS), tuple(out))


def _node(
    name: str,
    team: _Team,
    profile: str,
    shape: _Shape,
    people: _People,
    mig_tenants: list[_Team],
    scenario: str,
    seed: int,
    epoch: float,
    utc_offset: str,
) -> SimNode:
    if profile == "mig":
        gpus, workloads, description = _mig(name, team, shape, mig_tenants)
    else:
        gpus, workloads, description = _TEMPLATES[profile](name, team, shape)
    spec = _spec(name, seed, epoch, utc_offset, people, gpus, workloads, description)
    labels = (("scenario", scenario), ("profile", profile), ("gpu", shape.model))
    return SimNode(name, team.name, profile, spec, labels)


# ---- large ---------------------------------------------------------------------------------------

_WORDS = (
    "vision",
    "speech",
    "nlp",
    "robotics",
    "search",
    "ads",
    "recsys",
    "chat",
    "maps",
    "finance",
    "genomics",
    "weather",
    "video",
    "audio",
    "security",
    "health",
    "retail",
    "games",
    "legal",
    "code",
    "translate",
    "ocr",
    "fraud",
    "pricing",
)
# Profile weights: most silos idle or lightly used, as in public traces; a few saturated.
_LARGE_WEIGHTS = {"idle": 30, "training": 25, "inference": 17, "notebooks": 12, "saturated": 10, "mig": 6}
_LARGE_MODELS = ("A100-80GB", "A100-80GB", "A100-SXM4-40GB", "H100-80GB", "H100-80GB", "L40S")


def _large(nodes: int, seed: int, epoch: float, utc_offset: str) -> SimFleetPlan:
    rng = random.Random(f"large/{nodes}/{seed}")
    team_count = max(6, round(nodes / 20))
    people = _People()
    teams: list[_Team] = []
    for k in range(team_count):
        word = _WORDS[k % len(_WORDS)]
        name = word if k < len(_WORDS) else f"{word}{k // len(_WORDS) + 1}"
        users = tuple(f"{name}{j}" for j in range(1, 2 + rng.randrange(3)))
        teams.append(people.add(_Team(name, users, f"svc-{name}")))
    # Every profile appears once before weights decide the rest.
    profiles = list(PROFILES) + rng.choices(
        list(_LARGE_WEIGHTS), weights=list(_LARGE_WEIGHTS.values()), k=team_count - len(PROFILES)
    )
    rng.shuffle(profiles)
    models = [rng.choice(_LARGE_MODELS) for _ in teams]
    out: list[SimNode] = []
    counters: dict[str, int] = {}
    for i in range(nodes):
        k = i * team_count // nodes
        team, profile = teams[k], profiles[k]
        model = models[k]
        if profile == "mig" and model not in ("A100-80GB", "H100-80GB"):
            model = "H100-80GB"
        gpus = 8 if rng.random() < 0.7 else 4
        shape = _Shape(gpus, model, round(rng.uniform(92.0, 98.0), 1), rng.randrange(6))
        counters[team.name] = counters.get(team.name, 0) + 1
        name = f"sim-{team.name}-{counters[team.name]:03d}"
        mig_tenants = [teams[(k + j) % team_count] for j in (1, 2, 3)]
        out.append(_node(name, team, profile, shape, people, mig_tenants, "large", seed, epoch, utc_offset))
    return SimFleetPlan("large", seed, epoch, _teams_in(out, teams), tuple(out))


def _teams_in(nodes: list[SimNode], teams: Sequence[_Team]) -> dict[str, tuple[str, ...]]:
    """The teams that own a node or run work on one, in the order given."""
    present = {t for node in nodes for t in node.spec["tenants"]}
    return {t.name: t.members for t in teams if t.name in present}


# ---- mixed ---------------------------------------------------------------------------------------

AMD_MODELS = ("MI300X",)
_AMD_DRIVER, _ROCM = "6.8.5", "6.2.0"  # amdgpu driver and ROCm release, in the CUDA version's place

_MIXED_TEAMS = (
    _Team("vision", ("alice", "bob")),
    _Team("chat", ("carol", "dave"), "svc-chat"),
    _Team("platform", ("olga",)),
    _Team("research", ("erin", "frank")),
)
_MIXED_NODES: tuple[tuple[str, str, _Shape], ...] = (
    ("vision", "training", _Shape(8, "A100-80GB", 96.0, 0)),
    ("vision", "training", _Shape(8, "MI300X", 94.0, 1)),
    ("chat", "inference", _Shape(8, "H100-80GB", 0.0, 0)),
    ("chat", "partitioned", _Shape(8, "MI300X", 0.0, 0)),
    ("platform", "mig", _Shape(4, "H100-80GB", 0.0, 0)),
    ("research", "idle", _Shape(4, "MI300X", 0.0, 1)),
)


def _partitioned(
    name: str, team: _Team, shape: _Shape, tenants: list[_Team]
) -> tuple[list[Any], list[dict[str, Any]], str]:
    """An MI300X node carved by modes: half its GPUs CPX/NPS4 (eight logical GPUs each), a
    quarter DPX, the rest whole; small services of other teams run on the carved GPUs."""
    n = shape.gpus
    cpx, dpx = max(n // 2, 1), max(n // 4, 0)
    gpus: list[Any] = [
        {
            "model": shape.model,
            "count": cpx,
            "owner": team.name,
            "partition": {"compute": "CPX", "memory": "NPS4"},
        }
    ]
    if dpx:
        gpus.append({"model": shape.model, "count": dpx, "owner": team.name, "partition": {"compute": "DPX"}})
    if n - cpx - dpx > 0:
        gpus.append({"model": shape.model, "count": n - cpx - dpx, "owner": team.name})
    others = tenants or [team]
    workloads: list[dict[str, Any]] = []
    for g in range(cpx):
        t = others[g % len(others)]
        workloads.append(
            {
                "name": f"{t.name}-small-{g}",
                "kind": "inference",
                "user": t.service or t.users[0],
                "tenant": t.name,
                "gpu": g,
                "memory": "45%",
                "limiter": True,
                "command": "vllm serve --tensor-parallel-size 1 small-model",
                "params": {"peak_util": 65, "night_util": 6},
            }
        )
    if n - cpx - dpx > 0:
        workloads.append(
            {
                "name": f"{team.name}-llm-amd",
                "kind": "inference",
                "user": team.service or team.users[0],
                "gpus": list(range(cpx + dpx, n)),
                "memory": "85%",
                "command": "vllm serve --tensor-parallel-size 2 large-model",
                "params": {"peak_util": 85, "night_util": 10},
            }
        )
    return gpus, workloads, f"{team.name}: MI300X node carved into partitions, serving other teams"


def _mixed(nodes: int, seed: int, epoch: float, utc_offset: str) -> SimFleetPlan:
    people = _People()
    for team in _MIXED_TEAMS:
        people.add(team)
    counters: dict[str, int] = {}
    out: list[SimNode] = []
    tenants = [people.teams[t] for t in ("chat", "vision", "research")]
    for i in range(nodes):
        team_name, profile, shape = _MIXED_NODES[i % len(_MIXED_NODES)]
        team = people.teams[team_name]
        counters[team_name] = counters.get(team_name, 0) + 1
        name = f"sim-{team_name}-{counters[team_name]:02d}"
        if shape.model not in AMD_MODELS:
            out.append(_node(name, team, profile, shape, people, tenants, "mixed", seed, epoch, utc_offset))
            continue
        if profile == "partitioned":
            gpus, workloads, description = _partitioned(name, team, shape, tenants)
        else:
            gpus, workloads, description = _TEMPLATES[profile](name, team, shape)
        spec = _spec(name, seed, epoch, utc_offset, people, gpus, workloads, description, _AMD_DRIVER, _ROCM)
        labels = (("scenario", "mixed"), ("profile", profile), ("gpu", shape.model), ("vendor", "amd"))
        out.append(SimNode(name, team.name, profile, spec, labels))
    return SimFleetPlan("mixed", seed, epoch, _teams_in(out, _MIXED_TEAMS), tuple(out))


# ---- entry ---------------------------------------------------------------------------------------


def build_fleet(
    scenario: str = "silos",
    nodes: int | None = None,
    seed: int = 0,
    epoch: float = 0.0,
    utc_offset: str = "+00:00",
) -> SimFleetPlan:
    """The fleet of a scenario; `epoch` (seconds since 1970) anchors every relative time."""
    if scenario not in SCENARIOS:
        raise ScenarioError(f"unknown scenario {scenario!r} (known: {', '.join(SCENARIOS)})")
    count = DEFAULT_NODES[scenario] if nodes is None else nodes
    if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= MAX_NODES:
        raise ScenarioError(f"--nodes must be between 1 and {MAX_NODES} (got {count!r})")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ScenarioError(f"--seed must be a non-negative integer (got {seed!r})")
    if scenario == "silos":
        return _silos(count, seed, float(epoch), utc_offset)
    if scenario == "mixed":
        return _mixed(count, seed, float(epoch), utc_offset)
    return _large(count, seed, float(epoch), utc_offset)
