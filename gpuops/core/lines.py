"""Cutting the protocol's byte stream into JSON lines: the one framing both sides share, the node
agent reading requests and the operator's client reading replies, each with its own line limit.

Pure (bytes in, lines out) and valid Python 3.8; the byte streams are described as Protocols so
that asyncio's streams, an SSH channel or a test's pipe all fit without core/ importing asyncio.
"""

from __future__ import annotations

from typing import Any, Awaitable, List, Protocol, Union

# Bytes asked of a reader at once: a whole sample of a large node is one read.
READ_CHUNK = 64 * 1024


class ByteReader(Protocol):
    def read(self, n: int = -1) -> Awaitable[bytes]: ...


class ByteWriter(Protocol):
    def write(self, data: bytes) -> Any: ...

    def drain(self) -> Awaitable[None]: ...


class TooLarge:
    """Marks a line that was dropped because it exceeded the limit; `size`: its bytes."""

    def __init__(self, size: int) -> None:
        self.size = size


class LineSplitter:
    """Splits pushed bytes into lines without ever holding more than `limit` bytes of one line.

    asyncio's readline either raises or silently keeps the tail of an oversized line, which would
    then be parsed as a message of its own; here the whole line is skipped and reported once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._buf = bytearray()
        self._dropped = -1  # >= 0 while skipping the rest of an oversized line: bytes seen so far

    def feed(self, chunk: bytes) -> List[Union[bytes, TooLarge]]:
        out: List[Union[bytes, TooLarge]] = []
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            end = len(chunk) if newline < 0 else newline
            if self._dropped >= 0:
                self._dropped += end - start
            else:
                self._buf += chunk[start:end]
                if len(self._buf) > self.limit:
                    self._dropped = len(self._buf)
                    self._buf.clear()
            if newline < 0:
                return out
            if self._dropped >= 0:
                out.append(TooLarge(self._dropped))
                self._dropped = -1
            elif self._buf.strip():
                out.append(bytes(self._buf))
            self._buf.clear()
            start = newline + 1

    def close(self) -> List[Union[bytes, TooLarge]]:
        """What is left at the end of the stream (a last line without a newline)."""
        if self._dropped >= 0:
            return [TooLarge(self._dropped)]
        return [bytes(self._buf)] if self._buf.strip() else []
