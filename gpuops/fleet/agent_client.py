"""Client of the node agent protocol.

Bytes reach the client either pushed — `feed()` called straight from an SSH channel's
`data_received`, so a sample goes from the socket to the collector without waking any task —
or pulled from an async byte reader (a child process's pipe, a socket in tests). Either way one
`LineSplitter` cuts lines and one dispatcher routes each message by request id, so requests and
watch streams share one connection. A malformed line from the agent ends the session with an
AgentError: the caller reconnects rather than trusting a confused peer. So does a line longer
than `proto.MAX_REPLY_BYTES`, as soon as that many bytes came without a newline (not when the
line finally ends: an agent that never ends it would hold the session forever).

Every string the agent sends is made printable (`core/text.py`) before anything reads it, and
so is every error message: nothing a node says reaches a screen with control characters.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuops.core import protocol as proto
from gpuops.core.codec import SAMPLE_ROW_FIELDS, DecodeError, from_delta, from_json, from_rows, to_json
from gpuops.core.history import History, history_from_json
from gpuops.core.lines import READ_CHUNK, ByteReader, ByteWriter, LineSplitter
from gpuops.core.model import Node, NodeSample
from gpuops.core.tenant_table import TenantSpec
from gpuops.core.text import may_need_escaping, printable, printable_data

_loads: Callable[[bytes], Any]
try:  # a C parser: a sample's JSON in a third of the standard library's time
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a dependency; the protocol does not need it
    from json import loads as _loads


def _loads_printable(line: bytes) -> Any:
    return printable_data(_loads(line))


def _mib(size: int) -> str:
    return f"{size / (1024 * 1024):g} MiB"


class AgentError(Exception):
    """The agent answered with an error, or the session broke; `code` says which. Both come
    from the node (or quote it): they are made printable here, once for every screen."""

    def __init__(self, code: str, message: str) -> None:
        code, message = printable(code), printable(message)
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
    # One line per journal of an interrupted apply on the node: only `gpuops apply` resolves one.
    interrupted: tuple[str, ...] = field(default_factory=tuple)


_CLOSED = object()


class _SampleStream:
    """One watch stream: rebuilds samples from full events and deltas, in order."""

    def __init__(
        self, name: str, deliver: Callable[[Any], None], on_sample: Callable[[NodeSample], None] | None = None
    ) -> None:
        self.name = name
        self.deliver = deliver  # gets a NodeSample, an AgentError (one failed sample) or _CLOSED
        self.on_sample = deliver if on_sample is None else on_sample  # gets each NodeSample
        self.previous: NodeSample | None = None
        self.final: proto.Message | None = None

    def on_message(self, message: proto.Message) -> None:
        if message.event is None:
            self.final = message
            if not message.ok and message.error_code != proto.BACKEND_ERROR:
                self.deliver(AgentError(message.error_code, message.error_message))
                self.deliver(_CLOSED)
            elif not message.ok:
                self.deliver(AgentError(message.error_code, message.error_message))
            else:
                self.deliver(_CLOSED)
            return
        try:
            if message.is_delta:
                if self.previous is None:
                    raise DecodeError("a delta before any full sample")
                if message.rows:
                    self.previous = from_rows(self.previous, message.delta)
                else:
                    self.previous = from_delta(NodeSample, self.previous, message.delta)
            else:
                self.previous = from_json(NodeSample, message.result)
        except DecodeError as exc:
            raise AgentError(proto.INVALID_REQUEST, f"{self.name}: agent sent a bad sample: {exc}") from None
        self.on_sample(self.previous)


class Subscription:
    """A watch stream delivered by callback; `ended` completes (with the reason) when it stops."""

    def __init__(self, client: AgentClient, request_id: proto.RequestId) -> None:
        self._client = client
        self.request_id = request_id
        self.ended: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def _end(self, error: AgentError | None) -> None:
        if not self.ended.done():
            if error is None:
                self.ended.set_result(None)
            else:
                self.ended.set_exception(error)

    async def cancel(self) -> None:
        """Ask the agent to stop the stream (its final reply is dropped)."""
        if not self.ended.done():
            self._end(None)
            self._client._streams.pop(self.request_id, None)
            with contextlib.suppress(AgentError):
                await self._client._send(next(self._client._ids), "cancel", {"id": self.request_id})


class AgentClient:
    def __init__(self, reader: ByteReader | None, writer: ByteWriter, name: str = "agent") -> None:
        """With a `reader`, `start()` pulls from it; with None, the owner pushes bytes to `feed()`."""
        self.name = name
        self._reader = reader
        self._writer = writer
        self._ids = itertools.count(1)
        self._splitter = LineSplitter(proto.MAX_REPLY_BYTES)
        self._line_ended = True  # the last chunk ended a line: the splitter holds nothing
        self._unended = 0  # bytes of the line not ended yet
        self._pending: dict[proto.RequestId, asyncio.Future[proto.Message]] = {}
        self._streams: dict[proto.RequestId, _SampleStream] = {}
        self._failure: AgentError | None = None
        self._task: asyncio.Task[None] | None = None
        self.hello: Hello | None = None

    # ---- incoming --------------------------------------------------------------------------

    def feed(self, data: bytes) -> None:
        """Take bytes from the agent (called from a channel's data_received or the read loop)."""
        if self._failure is not None:
            return
        try:
            # The usual chunk, one whole message (a sample is one SSH packet) after a chunk that
            # ended a line: straight to the parser. Anything else goes through the splitter.
            if (
                self._line_ended
                and data[-1:] == b"\n"
                and data[:1] == b"{"
                and data.count(b"\n") == 1
                and len(data) <= proto.MAX_REPLY_BYTES
            ):
                self._line(data)
                return
            self._line_ended = data[-1:] == b"\n"
            last = data.rfind(b"\n")
            self._unended = self._unended + len(data) if last < 0 else len(data) - last - 1
            for line in self._splitter.feed(data):
                self._line(line)
            if self._unended > proto.MAX_REPLY_BYTES:
                raise AgentError(
                    proto.TOO_LARGE,
                    f"{self.name}: agent sent a line longer than {_mib(proto.MAX_REPLY_BYTES)} "
                    f"({_mib(self._unended)} without a newline so far)",
                )
        except AgentError as exc:
            self._fail(exc)

    def feed_eof(self, error: BaseException | None = None) -> None:
        """The agent's side is closed (or the connection broke with `error`)."""
        try:
            for line in self._splitter.close():
                self._line(line)
        except AgentError as exc:
            self._fail(exc)
        reason = f"connection lost ({error})" if error is not None else "the agent closed the connection"
        self._fail(AgentError("closed", f"{self.name}: {reason}"))

    def _line(self, line: bytes | object) -> None:
        if not isinstance(line, bytes):
            raise AgentError(
                proto.TOO_LARGE, f"{self.name}: agent sent a line longer than {_mib(proto.MAX_REPLY_BYTES)}"
            )
        try:
            message = proto.parse_message(line, _loads_printable if may_need_escaping(line) else _loads)
        except proto.ProtocolError as exc:
            raise AgentError(exc.code, f"{self.name}: {exc.message}") from None
        if message.event is not None:  # a stream's event: the usual message, once per sample
            stream = self._streams.get(message.id)  # type: ignore[arg-type]
            if stream is not None:
                stream.on_message(message)
                return
        self._dispatch(message)

    async def _read_loop(self) -> None:
        assert self._reader is not None
        try:
            while True:
                chunk = await self._reader.read(READ_CHUNK)
                if not chunk:
                    break
                self.feed(chunk)
            self.feed_eof()
        except (ConnectionError, OSError) as exc:
            self.feed_eof(exc)

    def _dispatch(self, message: proto.Message) -> None:
        if message.id is None:
            # An error not tied to a request (the agent could not parse something we sent).
            if not message.ok:
                self._fail(AgentError(message.error_code, f"{self.name}: {message.error_message}"))
            return
        stream = self._streams.get(message.id)
        if stream is not None:
            stream.on_message(message)
            if message.event is None:
                self._streams.pop(message.id, None)
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
        streams, self._streams = list(self._streams.values()), {}
        for stream in streams:
            stream.deliver(error)
            stream.deliver(_CLOSED)

    # ---- outgoing --------------------------------------------------------------------------

    async def start(self) -> Hello:
        """Start reading (when pulling) and greet the agent; raises AgentError if it cannot serve."""
        if self._reader is not None:
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
                interrupted=tuple(str(line)[:1000] for line in result.get("interrupted", [])[:256]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise AgentError(proto.INVALID_REQUEST, f"{self.name}: malformed hello reply ({exc})") from None
        self.hello = hello
        return hello

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

    def _extras(self) -> list[str]:
        """The optional parts of a sample this side reads, when the agent offers them: an older
        agent refuses the argument, an older operator's decoder the fields (core/protocol.py)."""
        if self.hello is not None and "extras" in self.hello.capabilities:
            return list(proto.EXTRAS)
        return []

    async def sample(self) -> NodeSample:
        extras = self._extras()
        result = await self.request("sample", {"extras": extras} if extras else None)
        sample: NodeSample = self._decode(NodeSample, result)
        return sample

    async def mig_apply(
        self, changes: Sequence[proto.MigChange], force: bool = False, holder: str = ""
    ) -> proto.MigApplyReply:
        """Per-GPU MIG changes, each a transaction on the node (node/mig_apply.py)."""
        asked = proto.MigApplyRequest(tuple(changes), force, holder)
        result = await self.request("mig_apply", to_json(asked))
        reply: proto.MigApplyReply = self._decode(proto.MigApplyReply, result)
        return reply

    async def partition_apply(
        self, changes: Sequence[proto.PartitionChange], force: bool = False, holder: str = ""
    ) -> proto.PartitionApplyReply:
        """Per-GPU partition mode changes, each a transaction on the node (node/partition_apply.py)."""
        asked = proto.PartitionApplyRequest(tuple(changes), force, holder)
        result = await self.request("partition_apply", to_json(asked))
        reply: proto.PartitionApplyReply = self._decode(proto.PartitionApplyReply, result)
        return reply

    async def history(
        self, resolution: str = "hour", since: float | None = None, until: float | None = None
    ) -> History:
        """The node's recorded minute or hour buckets overlapping [since, until) (node/history.py;
        None: until now, since 7 days (hours) or 2 hours (minutes) before `until`)."""
        args: dict[str, Any] = {"resolution": resolution}
        if since is not None:
            args["since"] = since
        if until is not None:
            args["until"] = until
        compressed = self.hello is not None and proto.HISTORY_ZLIB in self.hello.capabilities
        if compressed:
            args["compress"] = "zlib"
        result = await self.request("history", args)
        try:
            if compressed:
                text = proto.inflate_history(result)
                try:
                    result = (_loads_printable if may_need_escaping(text) else _loads)(text)
                except ValueError as exc:
                    raise ValueError(f"zlib: not JSON once inflated ({str(exc)[:100]})") from None
            return history_from_json(result)
        except ValueError as exc:
            raise AgentError(
                proto.INVALID_REQUEST, f"{self.name}: agent sent an invalid history: {exc}"
            ) from None

    def _decode(self, cls: Any, data: Any) -> Any:
        try:
            return from_json(cls, data)
        except DecodeError as exc:
            raise AgentError(
                proto.INVALID_REQUEST, f"{self.name}: agent sent an invalid {cls.__name__}: {exc}"
            ) from None

    def _watch_args(self, interval: float, count: int | None) -> dict[str, Any]:
        args: dict[str, Any] = {"interval": interval}
        # Deltas cut the bytes and the decoding to what changed; older agents send full samples.
        if self.hello is not None and "delta" in self.hello.capabilities:
            args["delta"] = True
            # Rows: each GPU's sample as a list of values, cheaper to send and to take in.
            if "rows" in self.hello.capabilities:
                args["rows"] = list(SAMPLE_ROW_FIELDS)
        # Every node samples at the same instants: one moment per snapshot, one burst to take in.
        if self.hello is not None and "align" in self.hello.capabilities:
            args["align"] = True
        extras = self._extras()
        if extras:
            args["extras"] = extras
        if count is not None:
            args["count"] = count
        return args

    async def subscribe(
        self,
        interval: float,
        on_sample: Callable[[NodeSample], None],
        on_error: Callable[[AgentError], None] | None = None,
    ) -> Subscription:
        """Samples every `interval` seconds, handed to `on_sample` as they arrive (no task per
        sample). A failed sample goes to `on_error`; the stream's end completes `ended`."""
        request_id = next(self._ids)
        subscription = Subscription(self, request_id)

        def deliver(item: Any) -> None:
            if type(item) is NodeSample:
                on_sample(item)
            elif isinstance(item, AgentError):
                if item.code == proto.BACKEND_ERROR and on_error is not None:
                    on_error(item)
                elif item.code != proto.BACKEND_ERROR:
                    subscription._end(item)
            elif item is _CLOSED:
                subscription._end(self._failure)

        self._streams[request_id] = _SampleStream(self.name, deliver, on_sample)
        await self._send(request_id, "watch", self._watch_args(interval, None))
        return subscription

    async def watch(
        self, interval: float, count: int | None = None
    ) -> AsyncGenerator[NodeSample | AgentError, None]:
        """Samples every `interval` seconds; a failed sample is yielded as an AgentError."""
        request_id = next(self._ids)
        queue: asyncio.Queue[Any] = asyncio.Queue()
        stream = _SampleStream(self.name, queue.put_nowait)
        self._streams[request_id] = stream
        finished = False
        try:
            await self._send(request_id, "watch", self._watch_args(interval, count))
            while True:
                item = await queue.get()
                if item is _CLOSED:
                    finished = True
                    if stream.final is not None and stream.final.ok:
                        return
                    raise self._failure or AgentError("closed", f"{self.name}: the stream ended")
                if isinstance(item, AgentError) and item.code != proto.BACKEND_ERROR:
                    finished = True
                    raise item
                yield item
        finally:
            if not finished and self._failure is None:
                # Stop the agent's stream; its final reply lands in a stream we drop.
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

    # ---- MPS and limiter settings (node/mps_apply.py, node/limiter.py) ----------------------

    async def config(self) -> dict[str, Any]:
        """The node's live MPS daemons and limiter table: {"mps": [...], "limiter": {...}}."""
        result = await self.request("config")
        if (
            not isinstance(result, dict)
            or not isinstance(result.get("mps"), list)
            or not isinstance(result.get("limiter"), dict)
        ):
            raise AgentError(proto.INVALID_REQUEST, f"{self.name}: malformed config reply")
        return result

    async def mps_apply(
        self, changes: Sequence[proto.MpsChange], force: bool = False, holder: str = ""
    ) -> proto.MpsApplyReply:
        """MPS wanted per device (GPU or MIG device), each a change of its own on the node."""
        asked = proto.MpsApplyRequest(tuple(changes), force, holder)
        result = await self.request("mps_apply", to_json(asked))
        reply: proto.MpsApplyReply = self._decode(proto.MpsApplyReply, result)
        return reply

    async def limiter_apply(
        self, tenants: Sequence[TenantSpec], expect_generation: int | None = None, holder: str = ""
    ) -> proto.LimiterApplyReply:
        """Replace the limiter's tenant table; AgentError("stale") when its generation is not
        `expect_generation` (None: do not check)."""
        asked = proto.LimiterApplyRequest(tuple(tenants), expect_generation, holder)
        result = await self.request("limiter_apply", to_json(asked))
        reply: proto.LimiterApplyReply = self._decode(proto.LimiterApplyReply, result)
        return reply
