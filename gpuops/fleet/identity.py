"""fleet.yaml's identity files as `ssh -i` uses them.

A key file is read bounded and checked as OpenSSH checks it (local_files.py). An unencrypted key
is used as it is. An encrypted one is not decrypted (gpuops never asks for a passphrase): like
`ssh -i`, it signs with the copy ssh-agent holds, found by the key's public half, which comes
from the key file itself (OpenSSH's format keeps it in the clear) or from `KEY.pub` next to it.
Without an agent, or with one that lacks the key, the error says to `ssh-add` it.
"""

from __future__ import annotations

import base64
import binascii
import os
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncssh
from asyncssh.public_key import decode_ssh_public_key

from gpuops.fleet.errors import SshError
from gpuops.fleet.local_files import KEY_LIMIT, load_parsed, read_bounded

_OPENSSH_MAGIC = b"openssh-key-v1\0"
_OPENSSH_ARMOR = (b"-----BEGIN OPENSSH PRIVATE KEY-----", b"-----END OPENSSH PRIVATE KEY-----")


@dataclass
class ClientKeys:
    """Keys for one handshake; `close()` once it is over (an agent's copy needs its agent)."""

    keys: list[Any] = field(default_factory=list)
    agent: asyncssh.SSHAgentClient | None = None

    def close(self) -> None:
        if self.agent is not None:
            self.agent.close()
            self.agent = None


@dataclass(frozen=True)
class _Encrypted:
    """A key file that needs a passphrase, and its public half when one could be found."""

    public: asyncssh.SSHKey | None


def _openssh_body(data: bytes) -> bytes | None:
    start, end = data.find(_OPENSSH_ARMOR[0]), data.find(_OPENSSH_ARMOR[1])
    if start < 0 or end < start:
        return None
    try:
        return base64.b64decode(b"".join(data[start + len(_OPENSSH_ARMOR[0]) : end].split()), validate=True)
    except (binascii.Error, ValueError):
        return None


def _openssh_header(body: bytes) -> tuple[bytes, bytes] | None:
    """(cipher name, first public key blob) of an OpenSSH-format private key, or None."""
    if not body.startswith(_OPENSSH_MAGIC):
        return None
    fields: list[bytes] = []
    offset = len(_OPENSSH_MAGIC)
    try:
        for _ in range(3):  # cipher name, kdf name, kdf options
            (length,) = struct.unpack_from(">I", body, offset)
            fields.append(body[offset + 4 : offset + 4 + length])
            offset += 4 + length
        (count,) = struct.unpack_from(">I", body, offset)
        (length,) = struct.unpack_from(">I", body, offset + 4)
    except struct.error:
        return None
    blob = body[offset + 8 : offset + 8 + length]
    if count < 1 or len(blob) != length:
        return None
    return fields[0], blob


def _is_encrypted(data: bytes) -> tuple[bool, bytes | None]:
    """Whether the key file needs a passphrase, and the public blob it carries in the clear."""
    body = _openssh_body(data)
    header = _openssh_header(body) if body is not None else None
    if header is not None:
        return header[0] != b"none", header[1]
    # PEM: "Proc-Type: 4,ENCRYPTED" (PKCS#1) or "BEGIN ENCRYPTED PRIVATE KEY" (PKCS#8)
    return b"ENCRYPTED" in data[:4096], None


def _parse_key(data: bytes) -> asyncssh.SSHKey | _Encrypted:
    try:
        return asyncssh.import_private_key(data)
    except (asyncssh.KeyImportError, asyncssh.KeyEncryptionError) as exc:
        encrypted, blob = _is_encrypted(data)
        if not encrypted:
            raise ValueError(str(exc)) from None
    public = None
    if blob is not None:
        try:
            public = decode_ssh_public_key(blob)
        except asyncssh.KeyImportError:
            public = None
    return _Encrypted(public)


def _public_file(path: str) -> asyncssh.SSHKey | None:
    """The key in `path.pub`, as OpenSSH looks for it; None when there is none."""
    pub = path + ".pub"
    if not os.path.lexists(pub):
        return None
    try:
        return asyncssh.import_public_key(read_bounded("identity_file's public key", pub, KEY_LIMIT))
    except (asyncssh.KeyImportError, ValueError):
        raise SshError("local_file", f"identity_file's public key {pub}: not a public key") from None


def _with_certificate(path: str, key: asyncssh.SSHKey) -> Any:
    """The key, paired with `path-cert.pub` when there is one (as OpenSSH and asyncssh pair them)."""
    cert = path + "-cert.pub"
    if not os.path.lexists(cert):
        return key
    return (key, read_bounded("identity_file's certificate", cert, KEY_LIMIT))


async def _agent_copy(path: str, public: asyncssh.SSHKey, keys: ClientKeys) -> Any:
    """The agent's key pair for `public`; raises SshError("auth") saying what to do."""
    socket = os.environ.get("SSH_AUTH_SOCK", "")
    add = f"add it with: ssh-add {path}"
    if not socket:
        raise SshError(
            "auth",
            f"identity_file {path} is encrypted and no ssh-agent is running (SSH_AUTH_SOCK is unset); "
            f"start one (eval $(ssh-agent)) and {add}",
        )
    if keys.agent is None:
        try:
            keys.agent = await asyncssh.connect_agent(socket)
        except (OSError, asyncssh.Error) as exc:
            problem = f"no ssh-agent answers on {socket} ({exc})"
            raise SshError("auth", f"identity_file {path} is encrypted and {problem}; {add}") from None
    try:
        held = await keys.agent.get_keys()
    except (OSError, asyncssh.Error, ValueError) as exc:
        problem = f"ssh-agent at {socket} failed ({exc})"
        raise SshError("auth", f"identity_file {path} is encrypted and {problem}") from None
    for pair in held:
        if pair.public_data == public.public_data:
            return pair
    raise SshError("auth", f"identity_file {path} is encrypted and ssh-agent does not hold it; {add}")


async def load_client_keys(paths: Sequence[str]) -> ClientKeys:
    """The keys of `paths`, an encrypted one replaced by its agent's copy; raises SshError."""
    keys = ClientKeys()
    try:
        for path in paths:
            try:
                key = load_parsed("identity_file", path, KEY_LIMIT, _parse_key, private=True)
            except ValueError as exc:
                raise SshError("local_file", f"identity_file {path}: not a private key ({exc})") from None
            if isinstance(key, _Encrypted):
                public = key.public or _public_file(path)
                if public is None:
                    raise SshError(
                        "auth",
                        f"identity_file {path} is encrypted and its public half is missing "
                        f"(no {path}.pub); gpuops asks for no passphrase: use an agent (ssh-add {path})",
                    )
                keys.keys.append(await _agent_copy(path, public, keys))
            else:
                keys.keys.append(_with_certificate(path, key))
    except BaseException:
        keys.close()
        raise
    return keys
