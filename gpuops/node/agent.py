"""The node agent: serves the JSON-lines protocol (core/protocol.py) over any pair of async
byte streams — stdin/stdout for `gpuops agent --stdio`, an SSH channel for the fleet.

Backend calls run one at a time on a single worker thread: NVML handles are not documented as
thread-safe, and one slow call (a GPU falling off the bus) must not block the event loop, so
malformed input and cancellations are still answered while it hangs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import platform
import socket
import time
from typing import (
    TYPE_CHECKING,
    Any,
    AsyncIterator,
    Awaitable,
    Callable,
    Dict,
    List,
    Optional,
    Set,
    Tuple,
    Union,
)

from gpuops import __version__
from gpuops.core import protocol as proto
from gpuops.core.codec import (
    decode_args,
    limiter_apply_reply_json,
    mig_apply_reply_json,
    mps_apply_reply_json,
    partition_apply_reply_json,
    sample_to_json,
    to_json,
)
from gpuops.core.delta import diff, sample_rows
from gpuops.core.lines import READ_CHUNK, ByteReader, ByteWriter, LineSplitter, TooLarge
from gpuops.node.backends.base import Backend, BackendError
from gpuops.node.limiter_tags import LimiterTagger
from gpuops.node.state import interrupted_applies

if TYPE_CHECKING:
    from gpuops.core.tenant_table import TenantSpec
    from gpuops.node.health import HealthMonitor
    from gpuops.node.mps import MpsControl
    from gpuops.node.transaction import Kind

log = logging.getLogger("gpuops.agent")

MAX_IN_FLIGHT = 32
# Where a `history` result's bucket texts go, and the result in its reply: a string no bucket,
# reason or name holds (JSON writes its NULs as \u0000).
_BUCKETS_MARK = "\x00gpuops-buckets\x00"
_BUCKETS_MARK_JSON = '"\\u0000gpuops-buckets\\u0000"'


async def read_lines(reader: ByteReader, limit: int) -> AsyncIterator[Union[bytes, TooLarge]]:
    """The lines of a byte stream, as LineSplitter cuts them."""
    splitter = LineSplitter(limit)
    while True:
        chunk = await reader.read(READ_CHUNK)
        lines = splitter.feed(chunk) if chunk else splitter.close()
        for line in lines:
            yield line
        if not chunk:
            return


class Agent:
    """Answers protocol requests from one client using one backend."""

    def __init__(
        self,
        backend: Optional[Backend],
        backend_name: str,
        unavailable_reason: str = "",
        hostname: Optional[str] = None,
        inline: bool = False,
        state_dir: Optional[str] = None,
        limiter_dir: Optional[str] = None,
        mps_control: Optional[str] = None,
        history_dir: Optional[str] = None,
        before_history: Optional[Callable[[], Awaitable[None]]] = None,
        health: Optional["HealthMonitor"] = None,
    ) -> None:
        """`inline=True` calls the backend on the event loop thread: only for backends that never
        block (the simulator), so that one process can serve a thousand simulated nodes without
        a thousand threads. `limiter_dir`: where the limiter's tenant table lives (default
        node/limiter.DEFAULT_DIR). `mps_control`: the `nvidia-cuda-mps-control` to run, for any
        backend (default: the backend's own MPS control). `history_dir`: what the `history`
        request reads (default `<state_dir>/history`, node/history.py); `before_history` is
        awaited before each read (the simulator fills in a node's past there). `health`: the
        node's health events (node/health.py), carried in samples to clients that ask."""
        self.backend = backend
        self.backend_name = backend_name
        self.unavailable_reason = unavailable_reason
        self.hostname = hostname or socket.gethostname()
        if state_dir is None:
            from gpuops.node.state import default_state_dir

            state_dir = default_state_dir()
        self.state_dir = state_dir  # the node lock and the MIG journal (node/state.py)
        if limiter_dir is None:
            from gpuops.node.limiter import DEFAULT_DIR

            limiter_dir = DEFAULT_DIR
        self.limiter_dir = limiter_dir
        # Processes under the limiter carry their tenant in its regions (node/limiter_tags.py).
        self._tagger = LimiterTagger(limiter_dir)
        self.mps_binary = mps_control
        self.history_dir = history_dir or os.path.join(state_dir, "history")
        self.before_history = before_history
        self.health = health
        self._executor: Optional[concurrent.futures.ThreadPoolExecutor] = None
        if not inline:
            self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="gpuops-backend")
        self._watches: Dict[proto.RequestId, "asyncio.Task[None]"] = {}
        self._tasks: Set["asyncio.Task[None]"] = set()
        self._write_lock: Optional[asyncio.Lock] = None
        self._writer: Optional[ByteWriter] = None
        self._closed = False

    # ---- serving -------------------------------------------------------------------------

    async def serve(self, reader: ByteReader, writer: ByteWriter) -> None:
        """Serve until the client closes its side (EOF) or the connection breaks."""
        self._writer = writer
        self._write_lock = asyncio.Lock()
        slots = asyncio.Semaphore(MAX_IN_FLIGHT)
        try:
            async for line in read_lines(reader, proto.MAX_REQUEST_BYTES):
                if self._closed:
                    break
                if isinstance(line, TooLarge):
                    await self._send(
                        proto.error(
                            None,
                            proto.TOO_LARGE,
                            "request line of %d bytes exceeds %d" % (line.size, proto.MAX_REQUEST_BYTES),
                        )
                    )
                    continue
                try:
                    request = proto.parse_request(line)
                except proto.ProtocolError as exc:
                    await self._send(proto.error(exc.request_id, exc.code, exc.message))
                    continue
                await slots.acquire()
                task = asyncio.ensure_future(self._handle(request))
                self._tasks.add(task)
                task.add_done_callback(self._request_done(slots))
        except (ConnectionError, BrokenPipeError):
            pass
        finally:
            # The client is gone or done: answer what was already asked, end the streams.
            watches = list(self._watches.values())
            for watch in watches:
                watch.cancel()
            pending = list(self._tasks) + watches
            if pending:
                await asyncio.wait(pending, timeout=5)
            if self._executor is not None:
                self._executor.shutdown(wait=False)

    def _request_done(self, slots: asyncio.Semaphore) -> Callable[["asyncio.Task[None]"], None]:
        def done(task: "asyncio.Task[None]") -> None:
            self._tasks.discard(task)
            slots.release()

        return done

    async def _send(self, data: bytes) -> None:
        assert self._write_lock is not None and self._writer is not None
        if self._closed:
            return
        async with self._write_lock:
            try:
                self._writer.write(data)
                await self._writer.drain()
            except (ConnectionError, BrokenPipeError, OSError):
                # The client is gone: stop serving rather than spin on a dead pipe.
                self._closed = True

    async def _call(self, fn: Callable[[], Any]) -> Any:
        if self._executor is None:
            return fn()
        loop = asyncio.get_event_loop()
        return await loop.run_in_executor(self._executor, fn)

    # ---- requests ------------------------------------------------------------------------

    async def _handle(self, request: proto.Request) -> None:
        try:
            handler = getattr(self, "_op_" + request.op)
            await handler(request)
        except proto.ProtocolError as exc:
            await self._send(proto.error(request.id, exc.code, exc.message))
        except ValueError as exc:
            await self._send(proto.error(request.id, proto.INVALID_ARGS, str(exc)))
        except BackendError as exc:
            await self._send(proto.error(request.id, proto.BACKEND_ERROR, str(exc)))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the agent must keep serving whatever one request does
            log.exception("internal error in %s", request.op)
            await self._send(proto.error(request.id, proto.INTERNAL, "%s: %s" % (type(exc).__name__, exc)))

    def _require_backend(self) -> Backend:
        if self.backend is None:
            raise proto.ProtocolError(proto.BACKEND_UNAVAILABLE, self.unavailable_reason)
        return self.backend

    async def _op_hello(self, request: proto.Request) -> None:
        version = proto.hello_versions(request.args)
        capabilities = list(self.backend.capabilities()) if self.backend else []
        if self.backend is not None:
            capabilities += ["watch", "delta", "rows", "align", "extras"]
        capabilities.append(proto.HISTORY_ZLIB)  # history is read from files, backend or not
        await self._send(
            proto.reply(
                request.id,
                {
                    "protocol": version,
                    "agent_version": __version__,
                    "python": platform.python_version(),
                    "hostname": self.hostname,
                    "backend": self.backend_name,
                    "backend_error": self.unavailable_reason,
                    "capabilities": capabilities,
                    "ops": list(proto.OPS),
                    # Journals of interrupted applies: reported, never resolved, by a session
                    # that may only read (node/state.py).
                    "interrupted": interrupted_applies(self.state_dir),
                },
            )
        )

    async def _op_inventory(self, request: proto.Request) -> None:
        _no_args(request.args)
        backend = self._require_backend()
        result = await self._call(lambda: to_json(backend.inventory()))
        await self._send(proto.reply(request.id, result))

    def _take(self, backend: Backend, extras: Tuple[str, ...]) -> Any:
        """One sample as JSON for a client that understands `extras` (on the backend thread)."""
        sample = self._tagger.tag(backend.sample())
        if self.health is not None:
            sample = self.health.attach(sample)
        return sample_to_json(sample, extras)

    async def _op_sample(self, request: proto.Request) -> None:
        extras = proto.sample_args(request.args)
        backend = self._require_backend()
        result = await self._call(lambda: self._take(backend, extras))
        await self._send(proto.reply(request.id, result))

    async def _op_watch(self, request: proto.Request) -> None:
        interval, count, delta = proto.watch_args(request.args)
        rows = proto.watch_rows(request.args)
        align = proto.watch_align(request.args)
        extras = proto.extras_arg(request.args)
        self._require_backend()
        if request.id in self._watches:
            raise proto.ProtocolError(
                proto.DUPLICATE_ID, "a watch with id %r is already running" % (request.id,)
            )
        if len(self._watches) >= proto.MAX_WATCHES:
            raise proto.ProtocolError(
                proto.TOO_MANY_WATCHES, "at most %d watches at once" % proto.MAX_WATCHES
            )
        task = asyncio.ensure_future(self._watch(request.id, interval, count, delta, rows, align, extras))
        self._watches[request.id] = task
        task.add_done_callback(lambda _t: self._watches.pop(request.id, None))

    async def _watch(
        self,
        request_id: proto.RequestId,
        interval: float,
        count: Optional[int],
        delta: bool,
        rows: Optional[Tuple[str, ...]] = None,
        align: bool = False,
        extras: Tuple[str, ...] = (),
    ) -> None:
        backend = self._require_backend()
        loop = asyncio.get_event_loop()
        sent = 0
        previous: Any = None  # last document sent on this stream, when sending deltas
        cancelled = False
        next_tick = loop.time()
        try:
            while count is None or sent < count:
                try:
                    result = await self._call(lambda: self._take(backend, extras))
                except BackendError as exc:
                    # One failed sample does not end the stream: the client sees it and waits.
                    await self._send(proto.error(request_id, proto.BACKEND_ERROR, str(exc)))
                else:
                    await self._send(self._sample_event(request_id, sent, previous, result, rows))
                    previous = result if delta else None
                sent += 1
                if count is not None and sent >= count:
                    break
                if align:
                    # At the next multiple of the interval on the wall clock: nodes whose clocks
                    # NTP keeps within milliseconds sample at the same instants, so a fleet's
                    # snapshot is of one moment and the operator takes the samples in one burst
                    # (one wake-up instead of many). A late sample skips to the next multiple.
                    await asyncio.sleep(interval - (time.time() % interval))
                    continue
                # Keep a steady cadence; if a sample took longer than the interval, skip ticks
                # instead of bursting to catch up.
                next_tick += interval
                now = loop.time()
                if next_tick < now:
                    next_tick = now + interval - ((now - next_tick) % interval)
                await asyncio.sleep(next_tick - now)
        except asyncio.CancelledError:
            cancelled = True
        await self._send(proto.reply(request_id, {"events": sent, "cancelled": cancelled}))

    @staticmethod
    def _sample_event(
        request_id: proto.RequestId, seq: int, previous: Any, result: Any, rows: Optional[Tuple[str, ...]]
    ) -> bytes:
        """The event for one sample of a watch: the whole sample first (and whenever rows cannot
        say the change), then what changed, as rows when the client asked for them."""
        if previous is not None:
            if rows is not None:
                body = sample_rows(previous, result, rows)
                if body is not None:
                    return proto.rows_event(request_id, "sample", seq, body)
            else:
                change = diff(previous, result)
                return proto.delta_event(request_id, "sample", seq, change or {"~": {}})
        return proto.event(request_id, "sample", seq, result)

    async def _op_mig_apply(self, request: proto.Request) -> None:
        from gpuops.node.mig_apply import MIG_CHANGES

        asked = decode_args(proto.MigApplyRequest, request.op, request.args)
        backend = self._require_backend()
        results, recovered = await self._call(lambda: self._transactions(backend, asked, MIG_CHANGES))
        reply = proto.MigApplyReply(results=tuple(results), recovered=tuple(recovered))
        await self._send(proto.reply(request.id, mig_apply_reply_json(reply)))

    async def _op_partition_apply(self, request: proto.Request) -> None:
        from gpuops.node.partition_apply import PARTITION_CHANGES

        asked = decode_args(proto.PartitionApplyRequest, request.op, request.args)
        backend = self._require_backend()
        results, recovered = await self._call(lambda: self._transactions(backend, asked, PARTITION_CHANGES))
        reply = proto.PartitionApplyReply(results=tuple(results), recovered=tuple(recovered))
        await self._send(proto.reply(request.id, partition_apply_reply_json(reply)))

    def _transactions(
        self, backend: Backend, asked: Union[proto.MigApplyRequest, proto.PartitionApplyRequest], kind: Kind
    ) -> Tuple[List[Any], List[str]]:
        """Under the node lock: first finish what a killed agent left, then each GPU's change,
        each a transaction of its own (node/transaction.py; one GPU refused does not stop the
        others)."""
        from gpuops.node.state import NodeState
        from gpuops.node.transaction import run

        state, lock = self._node_lock(asked.holder)
        try:
            return run(backend, state, asked.changes, asked.force, kind)
        finally:
            NodeState.unlock(lock)

    # ---- MPS and limiter settings ----------------------------------------------------------

    def _mps_control(self) -> Tuple[Optional["MpsControl"], str]:
        """The MPS control to use, or (None, why there is none)."""
        from gpuops.node.mps import BinaryMpsControl

        if self.mps_binary:
            return BinaryMpsControl(self.mps_binary), ""
        if self.backend is None:
            return None, self.unavailable_reason
        try:
            return self.backend.mps_control(), ""
        except BackendError as exc:
            return None, str(exc)

    def _user_name(self, uid: int) -> str:
        from gpuops.node.backends.base import unix_user_name

        return self.backend.user_name(uid) if self.backend is not None else unix_user_name(uid)

    async def _op_config(self, request: proto.Request) -> None:
        _no_args(request.args)
        result = await self._call(self._config)
        await self._send(proto.reply(request.id, result))

    def _config(self) -> Dict[str, Any]:
        from gpuops.node.limiter import LimiterError, read_table
        from gpuops.node.mps_apply import MpsRecord, live_config

        control, why = self._mps_control()
        mps = live_config(self._user_name, control, MpsRecord(self.state_dir), why)
        try:
            generation, specs = read_table(self.limiter_dir)
        except LimiterError as exc:
            limiter = proto.LimiterConfig(self.limiter_dir, None, (), error=str(exc))
        else:
            limiter = proto.LimiterConfig(self.limiter_dir, generation, tuple(specs))
        return {"mps": mps, "limiter": to_json(limiter)}

    def _node_lock(self, holder: str) -> Tuple[Any, Any]:
        from gpuops.node.state import LockBusy, NodeState

        state = NodeState(self.state_dir)
        try:
            return state, state.lock(holder or "an apply")
        except LockBusy as exc:
            raise proto.ProtocolError(proto.BUSY, str(exc)) from None
        except OSError as exc:
            raise proto.ProtocolError(proto.INTERNAL, "cannot take the node lock: %s" % exc) from None

    async def _op_mps_apply(self, request: proto.Request) -> None:
        asked = decode_args(proto.MpsApplyRequest, request.op, request.args)
        backend = self._require_backend()
        result = await self._call(lambda: self._mps_apply(backend, asked.changes, asked.force, asked.holder))
        await self._send(proto.reply(request.id, mps_apply_reply_json(result)))

    def _mps_apply(
        self, backend: Backend, changes: Tuple[proto.MpsChange, ...], force: bool, holder: str
    ) -> proto.MpsApplyReply:
        """Under the node lock, each device a change of its own (one refused does not stop
        the others)."""
        from gpuops.node.mps_apply import MpsApplyError, MpsRecord, apply_mps, refused
        from gpuops.node.state import NodeState

        control, why = self._mps_control()
        _state, lock = self._node_lock(holder)
        try:
            record = MpsRecord(self.state_dir)
            results: List[proto.MpsResult] = []
            for change in changes:
                try:
                    if control is None:
                        raise MpsApplyError("not_supported", why or "no MPS control on this node")
                    results.append(apply_mps(backend, control, record, change, force))
                except MpsApplyError as exc:
                    results.append(refused(change, exc))
                except BackendError as exc:
                    results.append(refused(change, MpsApplyError("backend_error", str(exc))))
                except OSError as exc:  # the state directory
                    error = MpsApplyError("state_error", "%s: %s" % (exc.filename, exc))
                    results.append(refused(change, error))
            return proto.MpsApplyReply(results=tuple(results))
        finally:
            NodeState.unlock(lock)

    async def _op_limiter_apply(self, request: proto.Request) -> None:
        # Every line valid (TenantSpec.check), no tenant twice for the same GPUs: DecodeError.
        asked = decode_args(proto.LimiterApplyRequest, request.op, request.args)
        specs = list(asked.tenants)
        result = await self._call(lambda: self._limiter_apply(specs, asked.expect_generation, asked.holder))
        await self._send(proto.reply(request.id, limiter_apply_reply_json(result)))

    def _limiter_apply(
        self, specs: List["TenantSpec"], expect: Optional[int], holder: str
    ) -> proto.LimiterApplyReply:
        """Under the node lock: refuse when the table is not the one the plan saw, leave an
        identical table alone, else replace it atomically with the next generation."""
        from gpuops.node.limiter import LimiterError, read_table, write_table
        from gpuops.node.state import NodeState

        _state, lock = self._node_lock(holder)
        try:
            try:
                generation: Optional[int]
                generation, current = read_table(self.limiter_dir)
            except LimiterError as exc:
                if expect is not None:
                    raise proto.ProtocolError(
                        proto.STALE,
                        "the tenant table cannot be read (%s); the plan saw generation %d" % (exc, expect),
                    ) from None
                generation, current = None, None
            if expect is not None and generation != expect:
                raise proto.ProtocolError(
                    proto.STALE,
                    "the tenant table in %s is at generation %s, the plan saw %d"
                    % (self.limiter_dir, generation, expect),
                )
            if (
                current is not None
                and generation is not None
                and [s.line() for s in current] == [s.line() for s in specs]
            ):
                return proto.LimiterApplyReply(
                    generation=generation, changed=False, directory=self.limiter_dir
                )
            try:
                _make_dir(self.limiter_dir)
                # An unreadable table: write_table numbers the new one from the clock, so it
                # is newer than whatever the old one said.
                written = write_table(self.limiter_dir, specs, None if generation is None else generation + 1)
            except OSError as exc:
                raise proto.ProtocolError(
                    proto.INTERNAL, "cannot write the tenant table in %s: %s" % (self.limiter_dir, exc)
                ) from None
            return proto.LimiterApplyReply(generation=written, changed=True, directory=self.limiter_dir)
        finally:
            NodeState.unlock(lock)

    async def _op_history(self, request: proto.Request) -> None:
        """Minute or hour buckets recorded on this node (node/history.py), bounded in size."""
        import time

        from gpuops.node.history.files import bucket_text
        from gpuops.node.history.reader import read_history

        resolution, since, until = proto.history_args(request.args)
        if until is None:
            until = time.time()
        if since is None:
            since = max(0.0, until - proto.HISTORY_DEFAULT_SPAN[resolution])
        if self.before_history is not None:
            await self.before_history()
        directory = self.history_dir
        budget = proto.MAX_REPLY_BYTES - 64 * 1024
        history = await asyncio.get_event_loop().run_in_executor(
            None, lambda: read_history(directory, resolution, since, until, max_bytes=budget)
        )
        result = _history_json(history, [bucket_text(b) for b in history.buckets])
        if request.args.get("compress") == "zlib":
            # A week of hours deflates about 18 times: what crosses the network, and what both
            # ends' SSH encrypts and frames, for a millisecond of the node's time.
            await self._send(proto.reply(request.id, proto.deflate_history(result)))
            return
        head, _, tail = proto.reply(request.id, _BUCKETS_MARK).rpartition(_BUCKETS_MARK_JSON.encode("ascii"))
        await self._send(head + result.encode("utf-8") + tail)

    async def _op_cancel(self, request: proto.Request) -> None:
        unknown = sorted(set(request.args) - {"id"})
        if unknown:
            raise ValueError("unknown argument %r" % unknown[0][:64])
        target = request.args.get("id")
        task = self._watches.get(target) if isinstance(target, (int, str)) else None
        if task is None:
            raise ValueError("no running watch with id %r" % (target,))
        task.cancel()
        await self._send(proto.reply(request.id, {"cancelled": target}))


def _history_json(history: Any, texts: List[Optional[str]]) -> str:
    """The `history` result's JSON. The buckets as their files have them (each line parsed when
    read) are spliced in instead of encoded again: a third of a node's work for a week of hours."""
    import dataclasses

    from gpuops.core.history import history_to_json

    if not texts or any(t is None for t in texts):
        return _compact(history_to_json(history))
    doc = history_to_json(dataclasses.replace(history, buckets=()))
    doc["buckets"] = [_BUCKETS_MARK]
    head, mark, tail = _compact(doc).partition(_BUCKETS_MARK_JSON)
    if not mark:  # cannot happen (the mark is one string); never send a broken reply
        return _compact(history_to_json(history))
    return head + ",".join(t for t in texts if t is not None) + tail


def _compact(data: Any) -> str:
    return json.dumps(data, separators=(",", ":"), allow_nan=False)


def _make_dir(path: str) -> None:
    """The limiter's directory, readable by every CUDA program (root's 0755 when run as root)."""
    if not os.path.isdir(path):
        os.makedirs(path, mode=0o755, exist_ok=True)
        os.chmod(path, 0o755)


def _no_args(args: Dict[str, Any]) -> None:
    if args:
        raise ValueError("this op takes no arguments (got %r)" % sorted(args)[0][:64])
