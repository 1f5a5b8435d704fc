"""The agent of this host, run as a child process: the same protocol as over SSH; and
`LocalSource`, the fleet source of this host's GPUs (`gpuops tui` without a fleet.yaml)."""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import sys
import time
from collections import deque
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace

from gpuops.fleet.agent_client import AgentClient, AgentError
from gpuops.fleet.source import (
    CONNECTING,
    LIVE,
    MAX_EVENTS,
    STALE,
    UNREACHABLE,
    FleetEvent,
    FleetSnapshot,
    NodeView,
    wait_and_clear,
)

STOP_TIMEOUT = 5.0


@asynccontextmanager
async def local_agent(backend: str = "nvml", sim_spec: str | None = None) -> AsyncIterator[AgentClient]:
    """Start `python -m gpuops.node agent --stdio` and yield a greeted client."""
    argv = [sys.executable, "-m", "gpuops.node", "agent", "--stdio", "--backend", backend]
    if sim_spec is not None:
        argv += ["--sim-spec", sim_spec]
    process = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=None
    )
    assert process.stdin is not None and process.stdout is not None
    client = AgentClient(process.stdout, process.stdin, name="local agent")
    try:
        await client.start()
        yield client
    finally:
        await client.close()
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT)
        except TimeoutError:
            process.kill()
            await process.wait()


class LocalSource:
    """This host's GPUs through a local agent (a child process speaking the protocol), with the
    collector's node states: connecting, live, stale, unreachable with the reason and retries. A
    `FleetSource` (gpuops/fleet/source.py)."""

    def __init__(
        self, interval: float = 1.0, backend: str = "nvml", sim_spec: str | None = None, name: str = ""
    ) -> None:
        self._interval = interval
        self.backend = backend
        self.sim_spec = sim_spec
        self.name = name or socket.gethostname()
        self.view = NodeView(self.name, "local", since=time.time())
        self._events: deque[FleetEvent] = deque(maxlen=MAX_EVENTS)
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    @property
    def label(self) -> str:
        return f"this host ({self.name}, {self.backend})"

    @property
    def interval(self) -> float:
        return self._interval

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="local agent")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None

    def snapshot(self, now: float | None = None) -> FleetSnapshot:
        now = time.time() if now is None else now
        view = self.view
        age = view.age(now)
        if view.state == LIVE and age is not None and age > 2 * self._interval:
            view = replace(view, state=STALE, reason=f"no sample for {age:.0f}s")
        return FleetSnapshot(now, self._interval, (view,))

    def events(self) -> Sequence[FleetEvent]:
        return tuple(self._events)

    async def wait_changed(self, timeout: float | None = None) -> bool:
        return await wait_and_clear(self._changed, timeout)

    async def discover(self, timeout: float) -> FleetSnapshot:
        """Until the agent has answered or failed its first attempt (or `timeout`)."""
        deadline = time.monotonic() + timeout
        while self.view.state == CONNECTING:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._update(reason=f"no answer within {timeout:g}s")
                break
            await self.wait_changed(min(remaining, 0.5))
        return self.snapshot()

    def _update(self, **changes: object) -> None:
        old = self.view
        new = replace(old, **changes)  # type: ignore[arg-type]
        if new.state != old.state:
            new = replace(new, since=time.time())
            if new.state != CONNECTING:
                self._events.append(FleetEvent(time.time(), self.name, new.state, new.reason or new.state))
        self.view = new
        self._changed.set()

    async def _run(self) -> None:
        backoff = 1.0
        while True:
            try:
                async with local_agent(self.backend, self.sim_spec) as client:
                    await self._session(client)
                reason = "the local agent ended"
            except AgentError as exc:
                reason = f"agent: {exc.message}"
            except OSError as exc:
                reason = f"cannot start the local agent: {exc}"
            self._update(state=UNREACHABLE, reason=reason)
            await asyncio.sleep(backoff * random.uniform(0.8, 1.2))
            backoff = min(backoff * 2, 30.0)

    async def _session(self, client: AgentClient) -> None:
        hello = client.hello
        if hello is not None and hello.backend_error:
            raise AgentError("backend_unavailable", hello.backend_error)
        inventory = await client.inventory()
        self._update(hello=hello, inventory=inventory)
        async for item in client.watch(self._interval):
            if isinstance(item, AgentError):
                self._events.append(FleetEvent(time.time(), self.name, "agent-error", item.message))
                self._changed.set()
                continue
            self._update(state=LIVE, reason="", sample=item, last_seen=time.time())
