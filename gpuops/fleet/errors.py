"""The error of the SSH layer (connections, the operator's SSH files)."""

from __future__ import annotations

from gpuops.core.text import printable


class SshError(Exception):
    """A connection could not be made or was lost; `kind` for code, str() for people.

    Messages often quote a node (its sshd's disconnect reason, its agent's stderr): they are
    made printable here, once for every screen that shows them."""

    def __init__(self, kind: str, message: str) -> None:
        message = printable(message)
        super().__init__(message)
        self.kind = kind
        self.message = message
