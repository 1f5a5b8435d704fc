"""What the ansible/ tests share: the tools from the venv, and an environment that keeps every
file Ansible writes (temporary files, SSH control sockets, facts) under the test's directory."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANSIBLE_DIR = ROOT / "ansible"
PLAYBOOK = ANSIBLE_DIR / "bootstrap.yml"


def ansible_tool(name: str) -> str:
    """`ansible-playbook` and friends from the interpreter's venv (the dev extras), else PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if found is None:
        pytest.skip(f"{name} is not installed: pip install -e '.[dev]' (ansible-core, ansible-lint)")
    return found


def _control_dir() -> str:
    """A short directory for SSH's control sockets: a socket path holds at most 107 bytes, and the
    test's own directory (deeper under pytest-xdist's popen-gwN/) leaves too few for ssh's
    `<hash>.<random>` name. Removed when the test process ends."""
    path = tempfile.mkdtemp(prefix="gpuops-cp-")
    atexit.register(shutil.rmtree, path, True)
    return path


def ansible_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    work = tmp_path / "ansible-home"
    work.mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(
        ANSIBLE_LOCAL_TEMP=str(work / "tmp"),
        ANSIBLE_REMOTE_TEMP=str(work / "remote-tmp"),
        ANSIBLE_SSH_CONTROL_PATH_DIR=_control_dir(),
        # One SSH connection per host for the whole run, and modules piped into it instead of
        # copied: the run is several times faster, and the master ends with the test's sshd.
        ANSIBLE_SSH_ARGS="-o ControlMaster=auto -o ControlPersist=30s",
        ANSIBLE_PIPELINING="true",
        ANSIBLE_NOCOLOR="1",
        ANSIBLE_RETRY_FILES_ENABLED="false",
        ANSIBLE_GALAXY_CACHE_DIR=str(work / "galaxy"),
        ANSIBLE_HOME=str(work),
        ANSIBLE_STDOUT_CALLBACK="default",
        ANSIBLE_CALLBACK_RESULT_FORMAT="yaml",
        ANSIBLE_DISPLAY_SKIPPED_HOSTS="false",
        ANSIBLE_DEPRECATION_WARNINGS="false",
        ANSIBLE_FORKS="8",
    )
    env.update(extra)
    return env
