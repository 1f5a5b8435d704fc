"""Debian's OpenSSH ``sshd``, started by the tests on addresses they own, with keys they generate.

What one :class:`Sshd` is:

* a temporary directory with an ed25519 host key, an ed25519 client key (or one shared by several
  servers), ``authorized_keys`` holding the client's public key, a ``known_hosts`` in OpenSSH
  format for exactly this ``host:port``, an ``sshd_config`` and the server's log;
* ``/usr/sbin/sshd -D -e -f sshd_config`` as a child process of the test (inside a network
  namespace through ``ip netns exec``, see ``netns.py``), listening on one address;
* controls a test needs to break it: :meth:`Sshd.stop`, :meth:`Sshd.kill`, :meth:`Sshd.freeze`
  and :meth:`Sshd.thaw` (SIGSTOP/SIGCONT of the listener *and* every session process under it,
  so a live agent session freezes too), :meth:`Sshd.restart` (same port, same keys).

The sshd runs as the user running the tests (root here and in CI: ``PermitRootLogin
prohibit-password``; as another user sshd can only log that user in, which is all we need).
Only that user may log in (``AllowUsers``), with the generated client key;
password and keyboard-interactive logins and PAM are off; ``StrictModes`` is off because the
files live in a temporary directory. ``MaxStartups`` is raised for load tests, and the SFTP
subsystem is ``internal-sftp`` (the fleet code pushes its zipapp over SFTP).

Running the gpuops node agent on the far side
---------------------------------------------
The sshd logs into *this* machine as *this* user, so the far side sees this filesystem: the
agent is a real subprocess started by sshd's session, from the checkout the tests run in.
Build the remote command with :func:`agent_remote_command`::

    cmd = agent_remote_command("--backend", "sim")
    # "cd /path/to/repo && exec /path/to/repo/.venv/bin/python -m gpuops.node agent --stdio --backend sim"

and hand it to the SSH client as the command of an exec channel (asyncssh:
``conn.create_process(cmd)``; OpenSSH: ``ssh ... -- cmd``). Paths come from the repository root
this file lives in (``<repo>/.venv/bin/python`` when the venv is there, else the interpreter
running the tests), never from a fixed location. Then write ``{"v":1,"id":1,"op":"hello",
"args":{}}\\n`` to the channel's stdin and read one JSON line with ``"ok": true``. The remote
command line is parsed by the login shell of the far side: build it with :func:`shlex.join`
(``agent_remote_command`` does), never by pasting strings. ``/usr/bin/python3`` is the system
Python (3.11) a pushed zipapp would run with.

Nothing is left behind: every started sshd is registered, a test's fixture stops it in its
teardown, an ``atexit`` hook stops whatever is left if the test process exits, and on Linux the
listener gets ``PR_SET_PDEATHSIG`` (SIGTERM) when started from the main thread, so a test process
killed with SIGKILL takes its sshd listeners with it. :func:`sweep_stale` kills sshds that an
earlier, killed test run left (their configs carry that run's pid).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pwd
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

SSHD = "/usr/sbin/sshd"
PRIVSEP_DIR = Path("/run/sshd")
REPO = Path(__file__).resolve().parents[2]
INSTALL_HINT = "run: bash scripts/install-test-deps.sh"
# Temporary directories of one test run are named after its pid, so a later run can tell which
# sshds belong to runs that no longer exist.
TMP_PREFIX = "gpuops-sshd-"
# sshd options that only newer OpenSSH releases know; dropped when the installed sshd refuses them.
OPTIONAL_CONFIG = ("PerSourcePenalties no",)


class SshdError(RuntimeError):
    """The sshd could not be started, or did not do what was asked; the message has its log."""


# --------------------------------------------------------------------------- availability


@cache
def sshd_unavailable_reason() -> str | None:
    """Why a test sshd cannot run here (a skip reason), or None when it can."""
    if not sys.platform.startswith("linux"):
        return f"real-SSH tests need Linux (this is {sys.platform})"
    if not os.access(SSHD, os.X_OK):
        return f"Debian's openssh-server is not installed ({SSHD} missing); {INSTALL_HINT}"
    for tool in ("ssh", "ssh-keygen"):
        if shutil.which(tool) is None:
            return f"openssh-client is not installed ({tool} missing); {INSTALL_HINT}"
    if os.geteuid() == 0:
        # sshd running as root wants its privilege-separation directory (tmpfs: gone after a boot).
        try:
            PRIVSEP_DIR.mkdir(mode=0o755, exist_ok=True)
        except OSError as exc:
            return f"cannot create sshd's privilege-separation directory {PRIVSEP_DIR}: {exc}"
    user = current_user()
    locked = _password_field(user)
    if locked is not None and locked.startswith("!"):
        return (
            f"account {user!r} is locked ('!' in /etc/shadow): sshd without PAM refuses it even with a key; "
            f"unlock with: usermod -p '*' {user}"
        )
    return None


def current_user() -> str:
    return pwd.getpwuid(os.geteuid()).pw_name


def _password_field(user: str) -> str | None:
    try:
        with open("/etc/shadow", encoding="utf-8") as handle:
            for line in handle:
                fields = line.split(":")
                if fields[0] == user and len(fields) > 1:
                    return fields[1]
    except OSError:
        return None
    return None


# --------------------------------------------------------------------------- keys and known_hosts


@dataclass(frozen=True)
class KeyPair:
    """An OpenSSH key pair on disk (no passphrase)."""

    private: Path
    public: Path

    def public_line(self) -> str:
        """``"ssh-ed25519 AAAA... comment"``: the line that goes into authorized_keys."""
        return self.public.read_text(encoding="utf-8").strip()

    def public_key(self) -> str:
        """``"ssh-ed25519 AAAA..."`` without the comment: what known_hosts holds for a host key."""
        return " ".join(self.public_line().split()[:2])

    def fingerprint(self) -> str:
        """``"SHA256:..."`` as ssh and sshd print it."""
        out = _run(["ssh-keygen", "-l", "-E", "sha256", "-f", str(self.public)]).stdout
        return out.split()[1]


def generate_keypair(path: Path, comment: str = "gpuops-test", key_type: str = "ed25519") -> KeyPair:
    """Write a new key pair at ``path`` and ``path.pub`` with ssh-keygen."""
    path.parent.mkdir(parents=True, exist_ok=True)
    _run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-C", comment, "-f", str(path)])
    path.chmod(0o600)
    return KeyPair(path, path.with_name(path.name + ".pub"))


def known_hosts_pattern(host: str, port: int) -> str:
    """How OpenSSH names ``host:port`` in known_hosts: ``host`` on port 22, ``[host]:port`` otherwise."""
    return host if port == 22 else f"[{host}]:{port}"


def add_known_host(path: Path, host: str, port: int, public_key: str) -> None:
    """Add (or replace) the entry for ``host:port`` in the known_hosts file at ``path``."""
    pattern = known_hosts_pattern(host, port)
    kept: list[str] = []
    if path.exists():
        kept = [
            line for line in path.read_text(encoding="utf-8").splitlines() if line.split(" ", 1)[0] != pattern
        ]
    kept.append(f"{pattern} {public_key}")
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")


def write_known_hosts(path: Path, entries: Iterable[tuple[str, int, str]]) -> Path:
    """Write a known_hosts file with ``(host, port, public_key)`` entries (replacing the file)."""
    path.write_text(
        "".join(f"{known_hosts_pattern(host, port)} {key}\n" for host, port, key in entries), encoding="utf-8"
    )
    return path


# --------------------------------------------------------------------------- remote commands


def remote_python() -> str:
    """The interpreter the far side runs the agent with: the project's venv, else this one."""
    venv = REPO / ".venv" / "bin" / "python"
    return str(venv) if venv.exists() else sys.executable


def agent_remote_argv(*agent_args: str) -> list[str]:
    """argv of the node agent on the far side, e.g. ``agent_remote_argv("--backend", "sim")``."""
    return [remote_python(), "-m", "gpuops.node", "agent", "--stdio", *agent_args]


def agent_remote_command(*agent_args: str) -> str:
    """The remote command line (for the far side's shell) that starts the node agent on stdio.

    It changes into the repository first, so ``-m gpuops.node`` imports this checkout's code
    even where the package is not installed, and ``exec``s so the agent is the session's process.
    """
    return f"cd {shlex.quote(str(REPO))} && exec {shlex.join(agent_remote_argv(*agent_args))}"


# --------------------------------------------------------------------------- processes


def _run(argv: Sequence[str], timeout: float = 15, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise SshdError(f"{shlex.join(argv)} failed ({result.returncode}): {result.stderr.strip()}")
    return result


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the sshd start retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _stat(pid: int) -> tuple[int, str] | None:
    """(parent pid, state letter) of a process, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            data = handle.read()
    except OSError:
        return None
    fields = data[data.rfind(")") + 2 :].split()
    return int(fields[1]), fields[0]


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    info = _stat(pid)
    return info is not None and info[1] not in ("Z", "X")


def descendants(root: int) -> list[int]:
    """Every living process under ``root`` (children first level first), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            info = _stat(int(entry))
            if info is not None:
                children.setdefault(info[0], []).append(int(entry))
    found: list[int] = []
    queue = [root]
    while queue:
        for child in children.get(queue.pop(0), []):
            if child not in found:
                found.append(child)
                queue.append(child)
    return [pid for pid in found if alive(pid)]


def _signal(pids: Iterable[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def _wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until the processes are gone; returns those still alive at the deadline."""
    deadline = time.monotonic() + timeout
    left = [pid for pid in pids if alive(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [pid for pid in left if alive(pid)]
    return left


_PR_SET_PDEATHSIG = 1


def _pdeathsig_preexec() -> Callable[[], None] | None:
    """A preexec_fn that makes the child get SIGTERM when the thread that started it dies.

    Only used from the main thread: a worker thread (an executor's) may end while the test goes on.
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl: do not outlive it
            os._exit(1)

    return preexec


_LIVE: dict[int, Sshd] = {}
_LIVE_LOCK = threading.Lock()
_UNSUPPORTED: set[str] = set()


def live_servers() -> list[Sshd]:
    """The sshds of this process that are still running (should be none after each test)."""
    with _LIVE_LOCK:
        return list(_LIVE.values())


def stop_all(timeout: float = 5) -> list[str]:
    """Kill every sshd this process started and did not stop; returns their names."""
    leftover = live_servers()
    for server in leftover:
        with contextlib.suppress(Exception):
            server.stop(timeout=timeout)
    return [server.name for server in leftover]


atexit.register(stop_all, 2)


def sweep_stale() -> list[int]:
    """Kill sshd listeners left by test runs that no longer exist; returns their pids.

    A test sshd is recognised by its command line: ``-f /tmp/gpuops-sshd-<pid>-.../sshd_config``
    where ``<pid>`` is the test process that started it. Listeners of living runs are left alone.
    """
    # sshd rewrites its command line ("sshd: /usr/sbin/sshd -D -e -f CONFIG [listener] ..."),
    # so match the text, not argv.
    marker = re.compile(r"sshd.* -f \S*/" + re.escape(TMP_PREFIX) + r"(\d+)-[^/\s]*/sshd_config(\s|$)")
    killed: list[int] = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            text = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        match = marker.search(text)
        if match is None or int(match.group(1)) == os.getpid() or alive(int(match.group(1))):
            continue
        pid = int(entry)
        _signal([pid, *descendants(pid)], signal.SIGKILL)
        killed.append(pid)
    return killed


# --------------------------------------------------------------------------- the server


class Sshd:
    """One OpenSSH sshd of the tests; see the module documentation.

    ``host``/``port``/``user``/``client_key``/``known_hosts`` are what a client needs.
    ``prefix`` is put before sshd's argv: ``["ip", "netns", "exec", NAME]`` runs it in a network
    namespace (``host`` is then an address there); every program in it must ``exec`` the next.
    ``client_keys`` shares a client key pair between several servers; ``known_hosts`` may be a
    file shared by several servers (each adds its own entry).
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int | None = None,
        *,
        name: str = "sshd",
        workdir: Path | None = None,
        client_keys: KeyPair | None = None,
        known_hosts: Path | None = None,
        prefix: Sequence[str] = (),
        log_level: str = "VERBOSE",
        set_env: Mapping[str, str] | None = None,
        extra_config: Sequence[str] = (),
    ) -> None:
        self.name = name
        self.host = host
        self._fixed_port = port
        self.port = port or 0
        self.user = current_user()
        self.prefix = list(prefix)
        self.log_level = log_level
        # A bash that sshd starts at SHLVL 0 sources the user's ~/.bashrc before every command:
        # root's on this kind of machine runs `pyenv init` (~0.1 s of CPU a session, some 900
        # sessions in make test). At SHLVL 1 a session sees what a bare node's does (sshd's PATH),
        # whatever the test user's rc files say; a test may still set SHLVL otherwise.
        self.set_env = {"SHLVL": "1", **(set_env or {})}
        self.extra_config = list(extra_config)
        self._own_dir = workdir is None
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.host_keys = generate_keypair(self.workdir / "ssh_host_ed25519_key", f"{name}-host")
        self.client_keys = client_keys or generate_keypair(self.workdir / "id_ed25519", f"{name}-client")
        self.known_hosts = known_hosts or self.workdir / "known_hosts"
        self.authorized_keys = self.workdir / "authorized_keys"
        self.authorized_keys.write_text(self.client_keys.public_line() + "\n", encoding="utf-8")
        self.config_path = self.workdir / "sshd_config"
        self.log_path = self.workdir / "sshd.log"
        self.pid_path = self.workdir / "sshd.pid"
        self._proc: subprocess.Popen[bytes] | None = None
        self._frozen: list[int] = []

    # -- what a client needs

    @property
    def client_key(self) -> Path:
        """Path of the client's private key (its ``.pub`` is in authorized_keys)."""
        return self.client_keys.private

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def frozen(self) -> bool:
        return bool(self._frozen)

    def ssh_argv(
        self,
        *remote: str,
        connect_timeout: float = 5,
        options: Sequence[str] = (),
        identity: Path | None = None,
        user: str | None = None,
    ) -> list[str]:
        """argv of the OpenSSH client for this server: batch mode, strict host keys, one key only.

        ``remote`` is the remote command line (one string, or words the far side's shell joins).
        ``options`` are extra ``-o`` values; they come first, and ssh keeps the first value it
        sees, so ``"UserKnownHostsFile=/other"`` overrides ours. ``identity``/``user`` replace
        the client key and the login name (to try wrong ones). ``~/.ssh/config``, the global
        known_hosts and any ssh-agent are ignored.
        """
        argv = ["ssh", "-F", "/dev/null"]
        for option in options:
            argv += ["-o", option]
        for option in (
            "BatchMode=yes",
            "StrictHostKeyChecking=yes",
            f"UserKnownHostsFile={self.known_hosts}",
            "GlobalKnownHostsFile=/dev/null",
            "IdentitiesOnly=yes",
            "IdentityAgent=none",
            f"ConnectTimeout={max(1, round(connect_timeout))}",
            "LogLevel=ERROR",
        ):
            argv += ["-o", option]
        argv += ["-i", str(identity or self.client_key), "-p", str(self.port), "-l", user or self.user]
        argv.append(self.host)
        return [*argv, "--", *remote] if remote else argv

    def logs(self) -> str:
        """Everything sshd logged (to stderr, ``-e``) since this object was made, restarts included."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 30) -> str:
        return "\n".join(self.logs().splitlines()[-lines:])

    # -- life cycle

    def _config_text(self, skip: set[str]) -> str:
        lines = [
            f"# sshd of the gpuops tests: {self.name}",
            f"ListenAddress {self.host}:{self.port}",
            "AddressFamily inet",
            f"HostKey {self.host_keys.private}",
            f"PidFile {self.pid_path}",
            f"AuthorizedKeysFile {self.authorized_keys}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "HostbasedAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            f"AllowUsers {self.user}",
            f"LogLevel {self.log_level}",
            "UseDNS no",
            "PrintMotd no",
            "PrintLastLog no",
            "MaxStartups 2000",
            "MaxSessions 100",
            "MaxAuthTries 6",
            "LoginGraceTime 30",
            "AllowTcpForwarding yes",
            "X11Forwarding no",
            "AcceptEnv LANG LC_* GPUOPS_*",
            "Subsystem sftp internal-sftp",
        ]
        if self.set_env:
            lines.append("SetEnv " + " ".join(shlex.quote(f"{k}={v}") for k, v in self.set_env.items()))
        lines += [option for option in OPTIONAL_CONFIG if option.split()[0] not in skip]
        lines += self.extra_config
        return "\n".join(lines) + "\n"

    def _write_config(self) -> None:
        """Write sshd_config, dropping optional options the installed sshd does not know."""
        while True:
            self.config_path.write_text(self._config_text(_UNSUPPORTED), encoding="utf-8")
            check = _run([SSHD, "-t", "-f", str(self.config_path)], check=False)
            if check.returncode == 0:
                return
            bad = re.search(r"Bad configuration option: (\S+)", check.stderr)
            optional = {option.split()[0].lower(): option.split()[0] for option in OPTIONAL_CONFIG}
            if (
                bad is None
                or bad.group(1).lower() not in optional
                or optional[bad.group(1).lower()] in _UNSUPPORTED
            ):
                raise SshdError(f"{self.name}: sshd -t refused {self.config_path}: {check.stderr.strip()}")
            _UNSUPPORTED.add(optional[bad.group(1).lower()])

    def start(self, timeout: float = 10) -> Sshd:
        """Start sshd and wait until it answers with its banner; returns self."""
        if self.running:
            raise SshdError(f"{self.name} is already running (pid {self.pid})")
        reason = sshd_unavailable_reason()
        if reason is not None:
            raise SshdError(reason)
        attempts = 1 if self._fixed_port else 5
        for attempt in range(attempts):
            if not self._fixed_port:
                self.port = free_port(self.host)
            self._write_config()
            try:
                self._spawn_and_wait(timeout)
            except SshdError:
                in_use = "Address already in use" in self.log_tail(5)
                if attempt + 1 < attempts and in_use:
                    continue
                raise
            break
        add_known_host(self.known_hosts, self.host, self.port, self.host_keys.public_key())
        return self

    def _spawn_and_wait(self, timeout: float) -> None:
        argv = [*self.prefix, SSHD, "-D", "-e", "-f", str(self.config_path)]
        with open(self.log_path, "ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
                preexec_fn=_pdeathsig_preexec(),
            )
        with _LIVE_LOCK:
            _LIVE[id(self)] = self
        try:
            self.wait_ready(timeout)
        except SshdError:
            self._terminate(timeout=2)
            raise

    def wait_ready(self, timeout: float = 10) -> None:
        """Wait until a TCP connection to host:port gets an SSH banner (from this sshd)."""
        deadline = time.monotonic() + timeout
        last = "no attempt"
        while time.monotonic() < deadline:
            if not self.running:
                raise SshdError(
                    f"{self.name} exited ({self._proc and self._proc.returncode}):\n{self.log_tail()}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as sock:
                    sock.settimeout(max(0.1, min(2, deadline - time.monotonic())))
                    banner = sock.recv(256)
                if banner.startswith(b"SSH-2.0-"):
                    return
                last = f"unexpected banner {banner[:40]!r}"
            except OSError as exc:
                last = str(exc)
            time.sleep(0.02)
        where = f"{self.host}:{self.port}"
        raise SshdError(f"{self.name} did not answer on {where} in {timeout}s ({last}):\n{self.log_tail()}")

    def processes(self) -> list[int]:
        """The listener and every process under it (session sshds, the commands they run)."""
        if self._proc is None or not alive(self._proc.pid):
            return []
        return [self._proc.pid, *descendants(self._proc.pid)]

    def _terminate(self, timeout: float, tree: list[int] | None = None) -> list[int]:
        """SIGTERM (and SIGCONT, in case they are frozen) the whole tree; SIGKILL what stays."""
        proc = self._proc
        if proc is None:
            return []
        tree = self.processes() + (tree or [])
        _signal(tree, signal.SIGTERM)
        _signal(tree, signal.SIGCONT)
        self._frozen = []
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
        left = _wait_gone(tree, timeout)
        _signal(left, signal.SIGKILL)
        left = _wait_gone(left, timeout)
        with _LIVE_LOCK:
            _LIVE.pop(id(self), None)
        return left

    def stop(self, timeout: float = 5) -> None:
        """Stop sshd and every session under it (SIGTERM, SIGKILL after ``timeout`` s)."""
        left = self._terminate(timeout)
        if left:
            raise SshdError(f"{self.name}: processes {left} survived SIGKILL")

    def kill(self) -> None:
        """SIGKILL sshd and every session under it at once, like a crashed daemon."""
        tree = self.processes()
        _signal(tree, signal.SIGKILL)
        self._frozen = []
        left = self._terminate(timeout=5, tree=tree)
        if left:
            raise SshdError(f"{self.name}: processes {left} survived SIGKILL")

    def restart(self, timeout: float = 10) -> Sshd:
        """Stop (if running) and start again on the same address and port, with the same keys."""
        if self._proc is not None:
            self.stop()
        self._fixed_port = self.port or self._fixed_port
        return self.start(timeout)

    def freeze(self, sessions: bool = True) -> list[int]:
        """SIGSTOP the listener, and (``sessions``) every session process and agent under it.

        A frozen host accepts TCP connections (the kernel does) but never answers them, and its
        live sessions stop answering too. Returns the pids stopped.
        """
        if not self.running:
            raise SshdError(f"{self.name} is not running")
        assert self._proc is not None
        stopped = [self._proc.pid]
        _signal(stopped, signal.SIGSTOP)  # the listener first: it forks no new sessions now
        if sessions:
            # A session may fork while we walk the tree: walk until nothing new turns up.
            for _ in range(10):
                fresh = [pid for pid in descendants(self._proc.pid) if pid not in stopped]
                if not fresh:
                    break
                _signal(fresh, signal.SIGSTOP)
                stopped += fresh
        self._frozen = stopped
        return stopped

    def thaw(self) -> None:
        """SIGCONT everything :meth:`freeze` stopped (the listener last)."""
        _signal([*reversed(self._frozen), *self.processes()], signal.SIGCONT)
        self._frozen = []

    def cleanup(self) -> None:
        """Stop the server and remove its directory (if this object made it)."""
        try:
            self.stop()
        finally:
            if self._own_dir:
                shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Sshd:
        return self.start() if not self.running else self

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        state = "frozen" if self.frozen else "running" if self.running else "stopped"
        return f"<Sshd {self.name} {self.user}@{self.host}:{self.port} {state} pid={self.pid}>"
