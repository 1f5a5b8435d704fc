"""Client of the node agent protocol over any pair of async byte streams.

One reader task dispatches every incoming line by request id, so requests and watch streams
share one connection. A malformed line from the agent ends the session with an AgentError:
the caller reconnects rather than trusting a confused peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from typing import Any

from gpuops.core import protocol as proto
from gpuops.core.codec import DecodeError, from_delta, from_json
from gpuops.core.model import Node, NodeSample
from gpuops.node.agent import ByteReader, ByteWriter, read_lines


class AgentError(Exception):
    """The agent answered with an error, or the session broke; `code` says which."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}" if code else message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Hello:
    protocol: int
    agent_version: str
    python: str
    hostname: str
    backend: str
    backend_error: str
    capabilities: tuple[str, ...] = field(default_factory=tuple)


_CLOSED = object()


class AgentClient:
    def __init__(self, reader: ByteReader, writer: ByteWriter, name: str = "agent") -> None:
        self.name = name
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[proto.RequestId, asyncio.Future[proto.Message]] = {}
        self._streams: dict[proto.RequestId, asyncio.Queue[Any]] = {}
        self._failure: AgentError | None = None
        self._task: asyncio.Task[None] | None = None
        self.hello: Hello | None = None

    async def start(self) -> Hello:
        """Start reading and greet the agent; raises AgentError if it cannot serve."""
        self._task = asyncio.create_task(self._read_loop())
        result = await self.request("hello", {"versions": list(proto.SUPPORTED_VERSIONS), "client": "gpuops"})
        try:
            hello = Hello(
                protocol=int(result["protocol"]),
                agent_version=str(result["agent_version"]),
                python=str(result["python"]),
                hostname=str(result["hostname"]),
                backend=str(result["backend"]),
                backend_error=str(result.get("backend_error", "")),
                capabilities=tuple(str(c) for c in result.get("capabilities", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentError(proto.INVALID_REQUEST, f"{self.name}: malformed hello reply ({exc})") from None
        self.hello = hello
        return hello

    async def _read_loop(self) -> None:
        try:
            async for line in read_lines(self._reader, proto.MAX_REPLY_BYTES):
                if not isinstance(line, bytes):
                    raise AgentError(proto.TOO_LARGE, f"{self.name}: agent sent a line over the size limit")
                try:
                    message = proto.parse_message(line)
                except proto.ProtocolError as exc:
                    raise AgentError(exc.code, f"{self.name}: {exc.message}") from None
                self._dispatch(message)
            self._fail(AgentError("closed", f"{self.name}: the agent closed the connection"))
        except AgentError as exc:
            self._fail(exc)
        except (ConnectionError, OSError) as exc:
            self._fail(AgentError("closed", f"{self.name}: connection lost ({exc})"))

    def _dispatch(self, message: proto.Message) -> None:
        if message.id is None:
            # An error not tied to a request (the agent could not parse something we sent).
            if not message.ok:
                self._fail(AgentError(message.error_code, f"{self.name}: {message.error_message}"))
            return
        stream = self._streams.get(message.id)
        if stream is not None:
            stream.put_nowait(message)
            return
        future = self._pending.pop(message.id, None)
        if future is not None and not future.done():
            future.set_result(message)

    def _fail(self, error: AgentError) -> None:
        if self._failure is None:
            self._failure = error
        for future in self._pending.values():
            if not future.done():
                future.set_exception(error)
        self._pending.clear()
        for stream in self._streams.values():
            stream.put_nowait(_CLOSED)

    async def _send(self, request_id: proto.RequestId, op: str, args: dict[str, Any] | None) -> None:
        if self._failure is not None:
            raise self._failure
        try:
            self._writer.write(proto.request(request_id, op, args))
            await self._writer.drain()
        except (ConnectionError, OSError) as exc:
            error = AgentError("closed", f"{self.name}: cannot send ({exc})")
            self._fail(error)
            raise error from None

    async def request(self, op: str, args: dict[str, Any] | None = None) -> Any:
        request_id = next(self._ids)
        future: asyncio.Future[proto.Message] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        await self._send(request_id, op, args)
        message = await future
        if not message.ok:
            raise AgentError(message.error_code, message.error_message)
        return message.result

    async def inventory(self) -> Node:
        node: Node = self._decode(Node, await self.request("inventory"))
        return node

    async def sample(self) -> NodeSample:
        sample: NodeSample = self._decode(NodeSample, await self.request("sample"))
        return sample

    def _decode(self, cls: Any, data: Any) -> Any:
        try:
            return from_json(cls, data)
        except DecodeError as exc:
            raise AgentError(
                proto.INVALID_REQUEST, f"{self.name}: agent sent an invalid {cls.__name__}: {exc}"
            ) from None

    async def watch(
        self, interval: float, count: int | None = None
    ) -> AsyncGenerator[NodeSample | AgentError, None]:
        """Samples every `interval` seconds; a failed sample is yielded as an AgentError."""
        request_id = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._streams[request_id] = queue
        # Deltas cut the bytes and the decoding to what changed; older agents send full samples.
        use_delta = self.hello is not None and "delta" in self.hello.capabilities
        args: dict[str, Any] = {"interval": interval, "delta": True} if use_delta else {"interval": interval}
        if count is not None:
            args["count"] = count
        finished = False
        previous: NodeSample | None = None
        try:
            await self._send(request_id, "watch", args)
            while True:
                item = await queue.get()
                if item is _CLOSED:
                    assert self._failure is not None
                    raise self._failure
                message: proto.Message = item
                if message.event is not None:
                    if message.is_delta:
                        if previous is None:
                            raise AgentError(
                                proto.INVALID_REQUEST, f"{self.name}: a delta before any full sample"
                            )
                        try:
                            previous = from_delta(NodeSample, previous, message.delta)
                        except DecodeError as exc:
                            raise AgentError(
                                proto.INVALID_REQUEST, f"{self.name}: agent sent a bad delta: {exc}"
                            ) from None
                    else:
                        previous = self._decode(NodeSample, message.result)
                    yield previous
                elif not message.ok and message.error_code == proto.BACKEND_ERROR:
                    yield AgentError(message.error_code, message.error_message)
                elif not message.ok:
                    finished = True
                    raise AgentError(message.error_code, message.error_message)
                else:
                    finished = True
                    return
        finally:
            if not finished and self._failure is None:
                # Stop the agent's stream; its final reply lands in the queue we drop.
                with contextlib.suppress(AgentError):
                    await self._send(next(self._ids), "cancel", {"id": request_id})
            self._streams.pop(request_id, None)

    async def close(self) -> None:
        close = getattr(self._writer, "close", None)
        if close is not None:
            close()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
