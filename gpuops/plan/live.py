"""What a node has now, as the plan needs it: the agent's inventory and sample (GPUs, MIG layout,
processes) and its `config` (MPS daemons and the limiter tenant table)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from gpuops.core.codec import DecodeError, from_json
from gpuops.core.model import Gpu, Node, NodeSample
from gpuops.core.protocol import LimiterConfig
from gpuops.core.tenant_table import TenantSpec
from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.fleet.errors import SshError

if TYPE_CHECKING:  # the SSH side is loaded by what reads nodes, not by what plans (--help)
    from gpuops.fleet.session import NodeTarget

READ_TIMEOUT = 60.0


@dataclass(frozen=True)
class MpsDaemon:
    """One MPS control daemon as the agent reports it (per GPU, or per MIG device)."""

    device: str  # GPU-... or MIG-... UUID
    gpu: int
    pipe_directory: str
    log_directory: str
    running: bool
    active_thread_percentage: int | None
    pinned_memory_limit: int | None
    tenants: dict[str, dict[str, Any]] = field(default_factory=dict)
    clients: tuple[int, ...] = ()  # pids of the clients of its servers

    def settings(self) -> dict[str, Any]:
        """What a plan compares (not the pids that come and go)."""
        return {
            "running": self.running,
            "pipe_directory": self.pipe_directory,
            "active_thread_percentage": mps_threads(self.active_thread_percentage),
            "pinned_memory_limit": self.pinned_memory_limit,
            "tenants": {k: dict(sorted(v.items())) for k, v in sorted(self.tenants.items())},
        }


@dataclass(frozen=True)
class NodeLive:
    """One node's live state, or why it could not be read (`error`, with `kind`)."""

    name: str
    node: Node | None = None
    sample: NodeSample | None = None
    mps: tuple[MpsDaemon, ...] | None = None  # None: the agent cannot say (too old)
    limiter: tuple[TenantSpec, ...] | None = None  # the node's table, GPUs by index or UUID
    limiter_generation: int = 0
    error: str = ""
    kind: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and self.sample is not None

    @property
    def gpus(self) -> tuple[Gpu, ...]:
        return self.sample.gpus if self.sample is not None else ()

    def daemons_of(self, gpu: Gpu) -> list[MpsDaemon]:
        return [d for d in self.mps or () if d.gpu == gpu.info.index]

    def lines_of(self, gpu: Gpu) -> list[TenantSpec]:
        """The tenant lines that apply to a GPU, as that GPU's lines (no `gpus`), sorted: what a
        plan's limiter payload for the GPU is compared with."""
        index, uuid = gpu.info.index, gpu.info.uuid
        lines = [replace(line, gpus=()) for line in self.limiter or () if line.applies_to(index, uuid)]
        return sorted(lines, key=TenantSpec.sort_key)


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _mps_values(values: Any) -> dict[str, Any]:
    """A tenant's MPS values as compared (its users are the fleet's business, not the daemon's)."""
    return {
        "active_thread_percentage": mps_threads(_int_or_none(values.get("active_thread_percentage"))),
        "pinned_memory_limit": _int_or_none(values.get("pinned_memory_limit")),
    }


def mps_threads(value: int | None) -> int:
    """MPS's default active thread percentage is 100: unset and 100 are the same setting."""
    return 100 if value is None else value


def parse_config(data: Any) -> tuple[tuple[MpsDaemon, ...], tuple[TenantSpec, ...], int]:
    """The agent's `config` reply; raises AgentError when it is not what the protocol says."""
    try:
        limiter = from_json(LimiterConfig, data["limiter"], "config.limiter")
    except (KeyError, TypeError) as exc:
        raise AgentError("invalid_request", f"malformed config reply ({type(exc).__name__}: {exc})") from None
    except DecodeError as exc:
        raise AgentError("invalid_request", f"malformed config reply ({exc})") from None
    try:
        daemons = []
        for d in data["mps"]:
            clients: list[int] = []
            for server in d.get("servers") or ():
                clients += [int(pid) for pid in server.get("clients") or ()]
            daemons.append(
                MpsDaemon(
                    device=str(d["device"]),
                    gpu=int(d["gpu"]),
                    pipe_directory=str(d.get("pipe_directory") or ""),
                    log_directory=str(d.get("log_directory") or ""),
                    running=bool(d.get("running")),
                    active_thread_percentage=_int_or_none(d.get("active_thread_percentage")),
                    pinned_memory_limit=_int_or_none(d.get("pinned_memory_limit")),
                    tenants={str(k): _mps_values(v) for k, v in (d.get("tenants") or {}).items()},
                    clients=tuple(sorted(set(clients))),
                )
            )
        return tuple(daemons), limiter.tenants, limiter.generation or 0
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise AgentError("invalid_request", f"malformed config reply ({type(exc).__name__}: {exc})") from None


async def read_node(client: AgentClient, name: str) -> NodeLive:
    """Inventory, sample and config from a greeted agent."""
    node = await client.inventory()
    sample = await client.sample()
    try:
        mps, limiter, generation = parse_config(await client.request("config"))
    except AgentError as exc:
        if exc.code != "unknown_op":
            raise
        return NodeLive(name, node, sample)  # an older agent: MIG only
    return NodeLive(name, node, sample, mps, limiter, generation)


async def read_live(target: NodeTarget, handshakes: asyncio.Semaphore | None = None) -> NodeLive:
    """One node's live state; never raises for a node that cannot be read."""
    from gpuops.fleet.session import node_agent

    try:
        async with node_agent(target, handshakes) as client:
            return await asyncio.wait_for(read_node(client, target.name), READ_TIMEOUT)
    except SshError as exc:
        return NodeLive(target.name, error=exc.message, kind=exc.kind)
    except AgentError as exc:
        return NodeLive(target.name, error=exc.message, kind=exc.code)
    except TimeoutError:
        return NodeLive(target.name, error=f"no answer within {READ_TIMEOUT:.0f}s", kind="timeout")
    except OSError as exc:
        return NodeLive(target.name, error=str(exc) or type(exc).__name__, kind="network")


async def read_fleet(targets: list[NodeTarget], parallel: int = 32, handshakes: int = 32) -> list[NodeLive]:
    """Every node's live state, `parallel` at a time, in the order of `targets`."""
    slots = asyncio.Semaphore(max(1, parallel))
    shakes = asyncio.Semaphore(max(1, handshakes))

    async def one(target: NodeTarget) -> NodeLive:
        async with slots:
            return await read_live(target, shakes)

    return list(await asyncio.gather(*(one(t) for t in targets)))
