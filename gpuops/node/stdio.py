"""Async byte streams over this process's stdin and stdout.

asyncio's pipe transports refuse regular files and behave differently per platform, and the
agent must work whatever sshd or a test hands it as stdin. Plain threads do the blocking I/O;
a bounded queue keeps a fast client from growing the agent's memory.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from typing import Optional, Tuple

_QUEUE_CHUNKS = 16


class StdinReader:
    def __init__(self, fd: int, loop: asyncio.AbstractEventLoop) -> None:
        self._fd = fd
        self._loop = loop
        self._queue: "asyncio.Queue[bytes]" = asyncio.Queue(_QUEUE_CHUNKS)
        self._eof = False
        self._pending = b""
        thread = threading.Thread(target=self._pump, name="gpuops-stdin", daemon=True)
        thread.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self._fd, 65536)
            except OSError:
                chunk = b""
            future = asyncio.run_coroutine_threadsafe(self._queue.put(chunk), self._loop)
            try:
                future.result()
            except (RuntimeError, concurrent.futures.CancelledError):
                return  # the loop is gone
            if not chunk:
                return

    async def read(self, n: int = -1) -> bytes:
        if self._pending:
            data, self._pending = self._pending, b""
        elif self._eof:
            return b""
        else:
            data = await self._queue.get()
            if not data:
                self._eof = True
                return b""
        if 0 < n < len(data):
            data, self._pending = data[:n], data[n:]
        return data


class StdoutWriter:
    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._buffer = bytearray()
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="gpuops-stdout"
        )

    def write(self, data: bytes) -> None:
        self._buffer += data

    def _flush(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]

    async def drain(self) -> None:
        if not self._buffer:
            return
        data, self._buffer = bytes(self._buffer), bytearray()
        loop = asyncio.get_event_loop()
        await loop.run_in_executor(self._executor, self._flush, data)

    def close(self) -> None:
        self._executor.shutdown(wait=False)


def stdio_streams(
    loop: Optional[asyncio.AbstractEventLoop] = None, stdin_fd: int = 0, stdout_fd: int = 1
) -> Tuple[StdinReader, StdoutWriter]:
    loop = loop or asyncio.get_event_loop()
    return StdinReader(stdin_fd, loop), StdoutWriter(stdout_fd)
