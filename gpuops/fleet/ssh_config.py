"""~/.ssh/config as OpenSSH applies it to one host: its real name and port (HostName, Port), its
user, and its ProxyJump. Parsed by asyncssh's own reader (the one its connections use), after
the file is checked like every file of the operator's (local_files.py)."""

from __future__ import annotations

import getpass
import os
from dataclasses import dataclass
from pathlib import Path

from asyncssh.config import SSHClientConfig

from gpuops.fleet.errors import SshError
from gpuops.fleet.local_files import CONFIG_LIMIT, check_readable

MAX_HOPS = 8  # a ProxyJump chain longer than this is a loop in the config


@dataclass(frozen=True)
class HostConfig:
    host: str  # what to connect to: HostName, else the name as written
    port: int
    user: str | None
    proxy_jump: tuple[str, ...]  # hops as written, first to last; () for none
    config: Path | None  # the file it came from


@dataclass(frozen=True)
class JumpHop:
    """One hop of a ProxyJump, `[user@]host[:port]` (or ssh://...)."""

    text: str
    host: str
    port: int | None
    user: str | None


def config_file(use_ssh_config: bool) -> Path | None:
    """~/.ssh/config when it is to be read and exists; checked before anything reads it."""
    if not use_ssh_config:
        return None
    path = Path(os.path.expanduser("~/.ssh/config"))
    if not os.path.lexists(path):
        return None
    check_readable("ssh config", str(path), CONFIG_LIMIT)
    return path


def resolve(host: str, port: int | None, user: str | None, config: Path | None) -> HostConfig:
    """The host as `config` says to reach it (fleet.yaml's port and user win, as -p and -l do)."""
    if config is None:
        return HostConfig(host, port if port is not None else 22, user, (), None)
    try:
        local_user = getpass.getuser()
    except (KeyError, OSError):
        local_user = ""
    try:
        parsed = SSHClientConfig.load(
            None,
            [config],
            False,
            False,
            False,
            local_user,
            user if user is not None else (),
            host,
            port if port is not None else (),
        )
    except (OSError, ValueError) as exc:
        raise SshError("local_file", f"ssh config {config}: {exc}") from None
    jump = parsed.get("ProxyJump")
    hops = tuple(h.strip() for h in str(jump).split(",") if h.strip()) if jump else ()
    found_user = parsed.get("User")
    return HostConfig(
        host=str(parsed.get("Hostname", host)),
        port=int(str(parsed.get("Port", 22))),
        user=str(found_user) if found_user else user,
        proxy_jump=hops,
        config=config,
    )


def parse_hop(text: str, config: Path) -> JumpHop:
    """`[user@]host[:port]`, `[user@][v6addr]:port` or `ssh://...`, as ProxyJump takes them."""
    rest = text[len("ssh://") :] if text.startswith("ssh://") else text
    user, _, hostport = rest.rpartition("@")
    port_text = ""
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        port_text = tail[1:] if tail.startswith(":") else tail
    elif hostport.count(":") == 1:
        host, port_text = hostport.split(":")
    else:
        host = hostport
    port: int | None = None
    if port_text:
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise SshError("local_file", f"ssh config {config}: ProxyJump {text!r}: not a valid port")
        port = int(port_text)
    if not host:
        raise SshError("local_file", f"ssh config {config}: ProxyJump {text!r}: no host")
    return JumpHop(text, host, port, user or None)
