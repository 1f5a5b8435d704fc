"""Reading every node's history rollups over SSH (the `history` request), for `gpuops tenants`,
`gpuops rebalance` and the TUI's Pool screen."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable
from typing import TYPE_CHECKING

from gpuops.core.history import History, screened
from gpuops.fleet.agent_client import AgentError
from gpuops.fleet.errors import SshError
from gpuops.tenancy.accounting import Window

if TYPE_CHECKING:  # the SSH client is loaded when nodes are read, not by `--help`
    from gpuops.fleet.session import NodeTarget

READ_TIMEOUT = 60.0


async def read_history(
    target: NodeTarget, window: Window, now: float, handshakes: asyncio.Semaphore | None = None
) -> History | str:
    """A node's buckets over the window, or why they could not be read (never raises). Buckets
    whose figures cannot be true are unreadable time (`screened`), whoever sent them: this
    agent's reader leaves them out itself, an older agent's does not."""
    from gpuops.fleet.session import node_agent

    since = window.starts(now)[0]
    try:
        async with node_agent(target, handshakes) as client:
            history = await asyncio.wait_for(
                client.history(window.resolution, since, now + 1.0), READ_TIMEOUT
            )
        return screened(history)
    except SshError as exc:
        return exc.message
    except AgentError as exc:
        if exc.code == "unknown_op":
            return "its agent is too old to keep history (no history request)"
        return exc.message
    except TimeoutError:
        return f"no answer within {READ_TIMEOUT:.0f}s"
    except OSError as exc:
        return str(exc) or type(exc).__name__


# Called as each node's read ends (its name, what it gave), for progress: the CLI's bar, the Pool
# screen's line. A cold read of a week on hundreds of nodes takes long enough to need one.
Done = Callable[[str, "History | str"], None]


async def read_histories(
    targets: list[NodeTarget],
    window: Window,
    now: float,
    parallel: int = 32,
    handshakes: int = 32,
    done: Done | None = None,
) -> dict[str, History | str]:
    """Every node's history (or the reason it has none), `parallel` at a time, in target order;
    `done` is told of each node as it ends, in the order they end."""
    slots = asyncio.Semaphore(max(1, parallel))
    shakes = asyncio.Semaphore(max(1, handshakes))

    async def one(target: NodeTarget) -> History | str:
        async with slots:
            result = await read_history(target, window, now, shakes)
        if done is not None:
            done(target.name, result)
        return result

    # Replies are parsed into millions of containers, which live on as decoded histories until
    # the accounting. Each time enough of them have survived, the cyclic collector walks the
    # whole heap again: over half the operator's CPU on 100 nodes, for objects with no cycles.
    # Off while reading, back as it was after (the TUI tunes it too, gpuops/tui/app.py).
    collecting = gc.isenabled()
    gc.disable()
    try:
        results = await asyncio.gather(*(one(t) for t in targets))
    finally:
        if collecting:
            gc.enable()
    return {t.name: r for t, r in zip(targets, results, strict=True)}


def no_history(histories: dict[str, History | str]) -> dict[str, str]:
    """Nodes that answered but have no bucket in the window: why that usually is."""
    return {
        name: "no history recorded (is the recorder running? gpuops agent --record, docs/history.md)"
        for name, h in histories.items()
        if isinstance(h, History) and not h.buckets
    }
