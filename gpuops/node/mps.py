"""MPS control: talking to one `nvidia-cuda-mps-control` daemon per pipe directory.

Two implementations of one small interface (`MpsControl`):

- `BinaryMpsControl` runs the real `nvidia-cuda-mps-control` (never through a shell): `-d` with
  `CUDA_MPS_PIPE_DIRECTORY`, `CUDA_MPS_LOG_DIRECTORY` and `CUDA_VISIBLE_DEVICES=<GPU-or-MIG-UUID>`
  starts a daemon for one device; every other command is one line written to the stdin of one
  invocation with `CUDA_MPS_PIPE_DIRECTORY` set. The daemon writes `nvidia-cuda-mps-control.pid`
  in its pipe directory; that file says whether it runs.
- `InMemoryMpsControl` keeps the same state in memory for the simulated backend and interprets
  the same command language, with the man page's semantics: `set_default_*` apply to servers
  started later only; a server runs for one user at a time (a client of another user waits
  until the running server's clients are done); `quit` ends the daemon once its clients are done.

The typed helpers (`server_list`, `set_default_active_thread_percentage`, ...) are written once,
on top of `command()`, so both implementations go through the same parsing of the daemon's
answers. Standard library only; valid Python 3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import abc
import os
import re
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Set, Tuple

DEFAULT_BINARY = "nvidia-cuda-mps-control"
DEFAULT_PIPE_DIRECTORY = "/tmp/nvidia-mps"
DEFAULT_LOG_DIRECTORY = "/var/log/nvidia-mps"
PID_FILE = "nvidia-cuda-mps-control.pid"
DEFAULT_PERCENTAGE = 100.0
# One daemon per GPU or MIG device, started with CUDA_VISIBLE_DEVICES=<uuid>: it sees one
# device, ordinal 0, which is what pinned-memory commands name.
DEVICE = "0"

MiB = 1 << 20
GiB = 1 << 30

# Error codes of MpsError.
NOT_FOUND = "mps_unavailable"  # the control binary is missing or cannot run
FAILED = "mps_failed"  # a command was refused, timed out, or answered something unreadable
NOT_RUNNING = "not_running"  # no daemon for this pipe directory

_MEM_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([MmGgTt])?(?:i?[Bb])?\s*\Z")
_MPS_ENV = (
    "CUDA_MPS_PIPE_DIRECTORY",
    "CUDA_MPS_LOG_DIRECTORY",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_VISIBLE_DEVICES",
)


class MpsError(Exception):
    """An MPS command failed; `code` is one of NOT_FOUND, FAILED, NOT_RUNNING."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def format_mem_limit(value: int) -> str:
    """Bytes as MPS takes them: whole GiB as 'NG', else whole MiB as 'NM' (rounded down)."""
    if value < MiB:
        raise ValueError("a pinned memory limit must be at least 1 MiB, got %d bytes" % value)
    if value % GiB == 0:
        return "%dG" % (value // GiB)
    return "%dM" % (value // MiB)


def round_mem_limit(value: Optional[int]) -> Optional[int]:
    """What MPS keeps of a limit in bytes: whole MiB."""
    return None if value is None else value - value % MiB


def parse_mem_limit(text: str) -> Optional[int]:
    """'2G', '2048M', '512MB', '1.5G' -> bytes; '', '0' or 'none' -> None (no limit)."""
    text = text.strip()
    if text.lower() in ("", "0", "none", "unlimited", "no limit"):
        return None
    match = _MEM_RE.match(text)
    if not match:
        raise MpsError(FAILED, "unreadable pinned memory limit %r" % text[:80])
    unit = (match.group(2) or "M").upper()
    factor = {"M": MiB, "G": GiB, "T": GiB * 1024}[unit]
    value = int(float(match.group(1)) * factor)
    return round_mem_limit(value) or None


def parse_percentage(text: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise MpsError(FAILED, "unreadable thread percentage %r" % text.strip()[:80]) from None
    if not 0.0 <= value <= 100.0:
        raise MpsError(FAILED, "thread percentage %r out of range" % text.strip()[:80])
    return value


def _pids(text: str, what: str) -> List[int]:
    out = []
    for word in text.split():
        if not word.isdigit():
            raise MpsError(FAILED, "unreadable %s: %r" % (what, text.strip()[:200]))
        out.append(int(word))
    return out


@dataclass(frozen=True)
class MpsServer:
    pid: int
    uid: Optional[int]  # None where it cannot be told
    active_thread_percentage: float
    pinned_memory_limit: Optional[int]  # bytes on the device; None = no limit
    clients: Tuple[int, ...]


@dataclass(frozen=True)
class MpsDaemon:
    """One control daemon as it is now."""

    pipe_directory: str
    pid: int
    default_active_thread_percentage: float
    default_pinned_memory_limit: Optional[int]
    servers: Tuple[MpsServer, ...]

    def clients(self) -> List[Tuple[int, Optional[int]]]:
        """(client pid, uid) of every client of every server."""
        return [(c, s.uid) for s in self.servers for c in s.clients]


class MpsControl(abc.ABC):
    """One or more MPS control daemons, each named by its pipe directory."""

    @abc.abstractmethod
    def daemon_pid(self, pipe_directory: str) -> Optional[int]:
        """The pid of the daemon of this pipe directory, None when none runs."""

    @abc.abstractmethod
    def start_daemon(self, pipe_directory: str, log_directory: str, device: str) -> int:
        """Start a daemon (`-d`) for one GPU or MIG device; returns its pid once it runs."""

    @abc.abstractmethod
    def command(self, pipe_directory: str, line: str) -> str:
        """Send one command line to the daemon; returns what it answered. Raises MpsError."""

    @abc.abstractmethod
    def server_uid(self, pipe_directory: str, pid: int) -> Optional[int]:
        """The user a server runs for."""

    def wait_stopped(self, pipe_directory: str, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self.daemon_pid(pipe_directory) is not None:
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    # ---- typed commands ------------------------------------------------------------------

    def quit(self, pipe_directory: str, timeout: float = 30.0) -> None:
        """`quit`, then wait for the daemon to end (it waits for its clients first)."""
        self.command(pipe_directory, "quit")
        if not self.wait_stopped(pipe_directory, timeout):
            raise MpsError(
                FAILED, "the MPS daemon of %s did not end within %gs of quit" % (pipe_directory, timeout)
            )

    def server_list(self, pipe_directory: str) -> List[int]:
        return _pids(self.command(pipe_directory, "get_server_list"), "server list")

    def client_list(self, pipe_directory: str, server: int) -> List[int]:
        return _pids(self.command(pipe_directory, "get_client_list %d" % server), "client list")

    def default_active_thread_percentage(self, pipe_directory: str) -> float:
        return parse_percentage(self.command(pipe_directory, "get_default_active_thread_percentage"))

    def set_default_active_thread_percentage(self, pipe_directory: str, value: float) -> None:
        self.command(pipe_directory, "set_default_active_thread_percentage %s" % _pct(value))

    def active_thread_percentage(self, pipe_directory: str, server: int) -> float:
        return parse_percentage(self.command(pipe_directory, "get_active_thread_percentage %d" % server))

    def set_active_thread_percentage(self, pipe_directory: str, server: int, value: float) -> None:
        self.command(pipe_directory, "set_active_thread_percentage %d %s" % (server, _pct(value)))

    def default_pinned_mem_limit(self, pipe_directory: str, device: str = DEVICE) -> Optional[int]:
        return parse_mem_limit(
            self.command(pipe_directory, "get_default_device_pinned_mem_limit %s" % device)
        )

    def set_default_pinned_mem_limit(self, pipe_directory: str, value: int, device: str = DEVICE) -> None:
        self.command(
            pipe_directory,
            "set_default_device_pinned_mem_limit %s %s" % (device, format_mem_limit(value)),
        )

    def pinned_mem_limit(self, pipe_directory: str, server: int, device: str = DEVICE) -> Optional[int]:
        return parse_mem_limit(
            self.command(pipe_directory, "get_device_pinned_mem_limit %d %s" % (server, device))
        )

    def set_pinned_mem_limit(
        self, pipe_directory: str, server: int, value: int, device: str = DEVICE
    ) -> None:
        self.command(
            pipe_directory,
            "set_device_pinned_mem_limit %d %s %s" % (server, device, format_mem_limit(value)),
        )

    def start_server(self, pipe_directory: str, uid: int, timeout: float = 10.0) -> Optional[int]:
        """`start_server -uid N`; returns the new server's pid, or None when it is queued behind
        another user's server that still has clients."""
        self.command(pipe_directory, "start_server -uid %d" % uid)
        deadline = time.monotonic() + timeout
        while True:
            for pid in self.server_list(pipe_directory):
                if self.server_uid(pipe_directory, pid) == uid:
                    return pid
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def read(self, pipe_directory: str) -> Optional[MpsDaemon]:
        """The daemon of a pipe directory with its defaults and servers; None when none runs."""
        pid = self.daemon_pid(pipe_directory)
        if pid is None:
            return None
        servers = []
        for server in self.server_list(pipe_directory):
            try:
                servers.append(
                    MpsServer(
                        pid=server,
                        uid=self.server_uid(pipe_directory, server),
                        active_thread_percentage=self.active_thread_percentage(pipe_directory, server),
                        pinned_memory_limit=self.pinned_mem_limit(pipe_directory, server),
                        clients=tuple(self.client_list(pipe_directory, server)),
                    )
                )
            except MpsError:
                # The server ended between the list and the question: it is not there.
                if server in self.server_list(pipe_directory):
                    raise
        return MpsDaemon(
            pipe_directory=pipe_directory,
            pid=pid,
            default_active_thread_percentage=self.default_active_thread_percentage(pipe_directory),
            default_pinned_memory_limit=self.default_pinned_mem_limit(pipe_directory),
            servers=tuple(servers),
        )


def _pct(value: float) -> str:
    return ("%.1f" % value) if value != int(value) else "%d" % int(value)


# --------------------------------------------------------------------------- processes


def pid_alive(pid: int) -> bool:
    """True while a process exists and has not ended (a zombie has ended)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        return True
    fields = stat[stat.rfind(b")") + 2 :].split()
    return not (fields and fields[0] in (b"Z", b"X"))


def process_uid(pid: int) -> Optional[int]:
    """The real uid of a process, from /proc; None where it cannot be read."""
    try:
        with open("/proc/%d/status" % pid, "rb") as f:
            for line in f:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


# --------------------------------------------------------------------------- the real binary


class BinaryMpsControl(MpsControl):
    """`nvidia-cuda-mps-control`, run without a shell, one command per invocation."""

    def __init__(self, binary: str = DEFAULT_BINARY, timeout: float = 30.0) -> None:
        self.binary = binary
        self.timeout = timeout

    def _env(self, pipe_directory: str, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        # Our own environment must not leak MPS settings into the daemon or the commands.
        env = {k: v for k, v in os.environ.items() if k not in _MPS_ENV}
        env["CUDA_MPS_PIPE_DIRECTORY"] = pipe_directory
        env.update(extra or {})
        return env

    def _run(self, args: Sequence[str], env: Dict[str, str], stdin: bytes) -> Tuple[int, str, str]:
        # Output goes to files, not pipes: `-d` leaves a daemon that may hold inherited pipes
        # open, and a read until EOF would then never end.
        with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
            try:
                proc = subprocess.Popen(
                    [self.binary, *args],
                    stdin=subprocess.PIPE,
                    stdout=out,
                    stderr=err,
                    env=env,
                    close_fds=True,
                    start_new_session=True,  # the daemon must outlive the agent's process group
                )
            except OSError as exc:
                raise MpsError(NOT_FOUND, "cannot run %s: %s" % (self.binary, exc.strerror or exc)) from None
            try:
                proc.communicate(stdin, timeout=self.timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                raise MpsError(
                    FAILED, "%s %s did not answer within %gs" % (self.binary, " ".join(args), self.timeout)
                ) from None
            out.seek(0)
            err.seek(0)
            return (
                proc.returncode,
                out.read(1 << 20).decode("utf-8", "replace"),
                err.read(1 << 20).decode("utf-8", "replace"),
            )

    def daemon_pid(self, pipe_directory: str) -> Optional[int]:
        try:
            with open(os.path.join(pipe_directory, PID_FILE), "rb") as f:
                text = f.read(64).strip()
        except OSError:
            return None
        if not text.isdigit():
            return None
        pid = int(text)
        return pid if pid_alive(pid) else None

    def start_daemon(self, pipe_directory: str, log_directory: str, device: str) -> int:
        for directory in (pipe_directory, log_directory):
            try:
                os.makedirs(directory, mode=0o755, exist_ok=True)
            except OSError as exc:
                raise MpsError(FAILED, "cannot create %s: %s" % (directory, exc.strerror or exc)) from None
        env = self._env(
            pipe_directory, {"CUDA_MPS_LOG_DIRECTORY": log_directory, "CUDA_VISIBLE_DEVICES": device}
        )
        code, out, err = self._run(["-d"], env, b"")
        if code != 0:
            raise MpsError(FAILED, "%s -d: %s" % (self.binary, _said(out, err, code)))
        deadline = time.monotonic() + self.timeout
        while True:
            pid = self.daemon_pid(pipe_directory)
            if pid is not None:
                return pid
            if time.monotonic() >= deadline:
                raise MpsError(
                    FAILED,
                    "the MPS daemon for %s did not write its pid file in %s" % (device, pipe_directory),
                )
            time.sleep(0.05)

    def command(self, pipe_directory: str, line: str) -> str:
        code, out, err = self._run([], self._env(pipe_directory), line.encode("utf-8") + b"\n")
        if code != 0:
            kind = NOT_RUNNING if self.daemon_pid(pipe_directory) is None else FAILED
            raise MpsError(kind, "%s: %s" % (line, _said(out, err, code)))
        return out

    def server_uid(self, pipe_directory: str, pid: int) -> Optional[int]:
        return process_uid(pid)


def _said(out: str, err: str, code: int) -> str:
    text = (err.strip() or out.strip() or "exit status %d" % code).splitlines()
    return " / ".join(line.strip() for line in text[:3])[:300]


# --------------------------------------------------------------------------- in memory

ClientSource = Callable[[str], Sequence[Tuple[int, int]]]


class _Server:
    def __init__(self, pid: int, uid: int, percentage: float, pinned: Dict[str, int]) -> None:
        self.pid = pid
        self.uid = uid
        self.percentage = percentage
        self.pinned = dict(pinned)
        self.clients: List[int] = []
        self.shutdown = False  # asked to end once its clients are done


class _Daemon:
    def __init__(self, pid: int, device: str, log_directory: str, baseline: Set[int]) -> None:
        self.pid = pid
        self.device = device
        self.log_directory = log_directory
        self.default_percentage = DEFAULT_PERCENTAGE
        self.default_pinned: Dict[str, int] = {}
        self.servers: Dict[int, _Server] = {}
        self.pending: Dict[int, List[int]] = {}  # uid -> clients waiting for a server
        self.requested: Set[int] = set()  # uids asked for by start_server, waiting
        self.quitting = False
        self.baseline = set(baseline)  # processes that were on the device before it started


class InMemoryMpsControl(MpsControl):
    """MPS daemons kept in memory (the simulated backend), with the real one's semantics.

    `clients`, when given, says which processes (pid, uid) run on a device (GPU or MIG UUID):
    those that appear while its daemon runs are its clients, as if they were started with its
    pipe directory; those already there when it started are not. Tests can also `connect` and
    `disconnect` clients by hand."""

    def __init__(self, clients: Optional[ClientSource] = None, first_pid: int = 3_900_000) -> None:
        self._source = clients
        self._daemons: Dict[str, _Daemon] = {}
        self._next_pid = first_pid
        self._lock = threading.RLock()
        self._manual: Dict[str, Dict[int, int]] = {}  # pipe directory -> {client pid: uid}

    def _pid(self) -> int:
        self._next_pid += 1
        return self._next_pid

    # ---- clients -------------------------------------------------------------------------

    def connect(self, pipe_directory: str, pid: int, uid: int) -> None:
        """A CUDA program of user `uid` connects (what the driver does at cuInit under MPS)."""
        with self._lock:
            if pipe_directory not in self._daemons:
                raise MpsError(NOT_RUNNING, "Cannot find MPS control daemon process")
            self._manual.setdefault(pipe_directory, {})[pid] = uid
            self._sync(pipe_directory)

    def disconnect(self, pipe_directory: str, pid: int) -> None:
        with self._lock:
            self._manual.get(pipe_directory, {}).pop(pid, None)
            self._sync(pipe_directory)

    def _present(self, pipe_directory: str, daemon: _Daemon) -> Dict[int, int]:
        present: Dict[int, int] = {}
        if self._source is not None:
            present.update(dict(self._source(daemon.device)))
        present.update(self._manual.get(pipe_directory, {}))
        return present

    def _sync(self, pipe_directory: str) -> None:
        """Bring a daemon up to date with the processes now on its device."""
        daemon = self._daemons.get(pipe_directory)
        if daemon is None:
            return
        present = self._present(pipe_directory, daemon)
        daemon.baseline &= set(present)
        wanted = {pid: uid for pid, uid in present.items() if pid not in daemon.baseline}
        known: Set[int] = set()
        for server in daemon.servers.values():
            server.clients = [c for c in server.clients if c in wanted]
            known.update(server.clients)
        for uid in list(daemon.pending):
            daemon.pending[uid] = [c for c in daemon.pending[uid] if c in wanted]
            known.update(daemon.pending[uid])
            if not daemon.pending[uid] and uid not in daemon.requested:
                del daemon.pending[uid]
        if not daemon.quitting:
            for pid, uid in sorted(wanted.items()):
                if pid not in known:
                    self._client(daemon, pid, uid)
        self._settle(pipe_directory, daemon)

    def _client(self, daemon: _Daemon, pid: int, uid: int) -> None:
        server = self._server_of(daemon, uid)
        if server is not None and not server.shutdown:
            server.clients.append(pid)
            return
        daemon.pending.setdefault(uid, []).append(pid)
        for other in daemon.servers.values():
            if other.uid != uid:
                other.shutdown = True

    @staticmethod
    def _server_of(daemon: _Daemon, uid: int) -> Optional[_Server]:
        for server in daemon.servers.values():
            if server.uid == uid:
                return server
        return None

    def _settle(self, pipe_directory: str, daemon: _Daemon) -> None:
        """Servers asked to end whose clients are done end; queued users get their server;
        a quitting daemon without clients ends."""
        for pid in [p for p, s in daemon.servers.items() if s.shutdown and not s.clients]:
            del daemon.servers[pid]
        if daemon.quitting:
            if not any(s.clients for s in daemon.servers.values()):
                del self._daemons[pipe_directory]
                self._manual.pop(pipe_directory, None)
            return
        if not daemon.servers and daemon.pending:
            uid = next(iter(daemon.pending))  # first come, first served
            server = _Server(self._pid(), uid, daemon.default_percentage, daemon.default_pinned)
            server.clients = daemon.pending.pop(uid)
            daemon.requested.discard(uid)
            daemon.servers[server.pid] = server
            for other in daemon.pending:
                if other != uid:
                    server.shutdown = True

    # ---- MpsControl ----------------------------------------------------------------------

    def daemon_pid(self, pipe_directory: str) -> Optional[int]:
        with self._lock:
            self._sync(pipe_directory)
            daemon = self._daemons.get(pipe_directory)
            return None if daemon is None else daemon.pid

    def wait_stopped(self, pipe_directory: str, timeout: float) -> bool:
        return self.daemon_pid(pipe_directory) is None  # nothing here moves on its own

    def start_daemon(self, pipe_directory: str, log_directory: str, device: str) -> int:
        with self._lock:
            if self.daemon_pid(pipe_directory) is not None:
                raise MpsError(FAILED, "-d: An instance of this daemon is already running")
            present = self._source(device) if self._source is not None else ()
            daemon = _Daemon(self._pid(), device, log_directory, {pid for pid, _uid in present})
            self._daemons[pipe_directory] = daemon
            return daemon.pid

    def server_uid(self, pipe_directory: str, pid: int) -> Optional[int]:
        with self._lock:
            daemon = self._daemons.get(pipe_directory)
            server = daemon.servers.get(pid) if daemon is not None else None
            return None if server is None else server.uid

    def devices(self) -> Dict[str, str]:
        """Pipe directory -> device of every running daemon."""
        with self._lock:
            return {p: d.device for p, d in self._daemons.items()}

    def command(self, pipe_directory: str, line: str) -> str:
        with self._lock:
            self._sync(pipe_directory)
            daemon = self._daemons.get(pipe_directory)
            if daemon is None:
                raise MpsError(NOT_RUNNING, "%s: Cannot find MPS control daemon process" % line)
            words = line.split()
            if not words:
                return ""
            handler = _COMMANDS.get(words[0])
            if handler is None or not handler[0] <= len(words) - 1 <= handler[1]:
                raise MpsError(FAILED, "%s: Invalid command" % line[:200])
            try:
                out = handler[2](self, pipe_directory, daemon, words[1:])
            except _Refused as exc:
                raise MpsError(FAILED, "%s: %s" % (line[:200], exc)) from None
            self._settle(pipe_directory, daemon)
            return out

    # ---- the command language ------------------------------------------------------------

    def _c_quit(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        if args and (args[0] != "-t" or len(args) != 2 or not args[1].isdigit()):
            raise _Refused("usage: quit [-t TIMEOUT]")
        daemon.quitting = True
        if args:  # no time passes here: the timeout has run out at once; servers are ended
            daemon.servers.clear()
            daemon.pending.clear()
        return ""

    def _c_get_server_list(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        return "".join("%d\n" % pid for pid in sorted(daemon.servers))

    def _c_start_server(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        if args[0] != "-uid" or not args[1].isdigit():
            raise _Refused("usage: start_server -uid UID")
        uid = int(args[1])
        if self._server_of(daemon, uid) is not None:
            return ""
        # Like a client of another user: the running server ends once its clients are done,
        # then this user's server starts (_settle).
        daemon.pending.setdefault(uid, [])
        daemon.requested.add(uid)
        for other in daemon.servers.values():
            other.shutdown = True
        return ""

    def _server(self, daemon: _Daemon, word: str) -> _Server:
        server = daemon.servers.get(int(word)) if word.isdigit() else None
        if server is None:
            raise _Refused("no MPS server with pid %s" % word[:20])
        return server

    def _c_get_client_list(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        return "".join("%d\n" % pid for pid in self._server(daemon, args[0]).clients)

    def _c_get_server_status(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        self._server(daemon, args[0])
        return "ACTIVE\n"

    def _c_ps(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        lines = ["PID ID SERVER DEVICE NAMESPACE COMMAND"]
        for server in daemon.servers.values():
            for n, client in enumerate(server.clients):
                lines.append("%d %d %d %s 0 -" % (client, n, server.pid, daemon.device))
        return "\n".join(lines) + "\n"

    def _c_terminate_client(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        server = self._server(daemon, args[0])
        if not args[1].isdigit() or int(args[1]) not in server.clients:
            raise _Refused("no client %s of server %d" % (args[1][:20], server.pid))
        return ""

    @staticmethod
    def _percentage(word: str) -> float:
        try:
            value = float(word)
        except ValueError:
            raise _Refused("invalid thread percentage %r" % word[:20]) from None
        if not 0.0 < value <= 100.0:
            raise _Refused("thread percentage must lie in (0, 100]")
        return value

    def _device(self, daemon: _Daemon, word: str) -> str:
        if word not in (DEVICE, daemon.device):
            raise _Refused("invalid device %r" % word[:64])
        return DEVICE

    @staticmethod
    def _limit(word: str) -> int:
        match = re.match(r"^(\d+)([MG])\Z", word)
        if not match or int(match.group(1)) == 0:
            raise _Refused("invalid memory limit %r (use a number followed by M or G)" % word[:20])
        return int(match.group(1)) * (GiB if match.group(2) == "G" else MiB)

    def _c_set_default_active_thread_percentage(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        daemon.default_percentage = self._percentage(args[0])
        return "%.1f\n" % daemon.default_percentage

    def _c_get_default_active_thread_percentage(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        return "%.1f\n" % daemon.default_percentage

    def _c_set_active_thread_percentage(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        server = self._server(daemon, args[0])
        server.percentage = self._percentage(args[1])
        return "%.1f\n" % server.percentage

    def _c_get_active_thread_percentage(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        return "%.1f\n" % self._server(daemon, args[0]).percentage

    def _c_set_default_device_pinned_mem_limit(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        daemon.default_pinned[self._device(daemon, args[0])] = self._limit(args[1])
        return ""

    def _c_get_default_device_pinned_mem_limit(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        value = daemon.default_pinned.get(self._device(daemon, args[0]))
        return "" if value is None else format_mem_limit(value) + "\n"

    def _c_set_device_pinned_mem_limit(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        server = self._server(daemon, args[0])
        server.pinned[self._device(daemon, args[1])] = self._limit(args[2])
        return ""

    def _c_get_device_pinned_mem_limit(self, pipe: str, daemon: _Daemon, args: List[str]) -> str:
        server = self._server(daemon, args[0])
        value = server.pinned.get(self._device(daemon, args[1]))
        return "" if value is None else format_mem_limit(value) + "\n"


class _Refused(Exception):
    pass


_Handler = Callable[[InMemoryMpsControl, str, _Daemon, List[str]], str]
# command -> (fewest arguments, most arguments, handler)
_COMMANDS: Dict[str, Tuple[int, int, _Handler]] = {
    "quit": (0, 2, InMemoryMpsControl._c_quit),
    "get_server_list": (0, 0, InMemoryMpsControl._c_get_server_list),
    "start_server": (2, 2, InMemoryMpsControl._c_start_server),
    "get_client_list": (1, 1, InMemoryMpsControl._c_get_client_list),
    "get_server_status": (1, 1, InMemoryMpsControl._c_get_server_status),
    "ps": (0, 2, InMemoryMpsControl._c_ps),
    "terminate_client": (2, 2, InMemoryMpsControl._c_terminate_client),
    "set_default_active_thread_percentage": (
        1,
        1,
        InMemoryMpsControl._c_set_default_active_thread_percentage,
    ),
    "get_default_active_thread_percentage": (
        0,
        0,
        InMemoryMpsControl._c_get_default_active_thread_percentage,
    ),
    "set_active_thread_percentage": (2, 2, InMemoryMpsControl._c_set_active_thread_percentage),
    "get_active_thread_percentage": (1, 1, InMemoryMpsControl._c_get_active_thread_percentage),
    "set_default_device_pinned_mem_limit": (
        2,
        2,
        InMemoryMpsControl._c_set_default_device_pinned_mem_limit,
    ),
    "get_default_device_pinned_mem_limit": (
        1,
        1,
        InMemoryMpsControl._c_get_default_device_pinned_mem_limit,
    ),
    "set_device_pinned_mem_limit": (3, 3, InMemoryMpsControl._c_set_device_pinned_mem_limit),
    "get_device_pinned_mem_limit": (2, 2, InMemoryMpsControl._c_get_device_pinned_mem_limit),
}
