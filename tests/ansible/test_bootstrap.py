"""ansible/bootstrap.yml for real: ansible-playbook over OpenSSH against the test sshds on
loopback (one reached through the other as a jump host), with the inventory `gpuops inventory`
writes from fleet.yaml, each host installing under a temporary prefix, the simulated backend
standing in for NVML. The first run changes things, the second changes nothing, `--check --diff`
then reports nothing; the units verify, the commands they run start, and `gpuops discover` uses
the installed agent and its history. Then bad input: a missing limiter build, an old Python, a
read-only prefix, a library that fails its smoke test — each stops its host with one clear
message and nothing installed, and a rerun converges."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.ansible.bootstrap_helpers import (
    FAKE_MPS,
    GPU0,
    MIG1A,
    MIG1B,
    agent_lines,
    gpuops,
    make_inventory,
    play_vars,
    playbook,
    prepare,
    recap,
    unit_command,
    wait_metrics,
    write_executable,
)
from tests.sshtest.fixtures import (  # noqa: F401  (pytest finds the fixtures by name)
    SshdFactory,
    sshd_loopback_factory_fixture,
    sshtest_leak_check_fixture,
)
from tests.sshtest.sshd import Sshd

# Each test runs several playbooks (a venv and pip install per host in each): 3-4 minutes beside
# the suite's other workers on 2 cores, over pytest's default 300 s when the machine is busier.
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("sshtest_leak_check"), pytest.mark.timeout(900)]

LIMITER = Path(__file__).resolve().parents[2] / "native" / "build" / "libgpuops-limiter.so"

# What each node's sshd sets in its sessions. An sshd-started bash at SHLVL 0 sources the user's
# ~/.bashrc before every command: root's here runs `pyenv init` (~0.1 s of CPU), and Ansible opens
# one session per module run, some 80 per host and playbook. At SHLVL 1 the sessions see a bare
# node's environment (sshd's PATH: python3 is /usr/bin/python3), whatever the test user's rc says.
NODE_SESSION_ENV = {"SHLVL": "1"}


@pytest.fixture(autouse=True)
def _root_only() -> None:
    # The roles set owners (root) as a real node wants them; the tests run them on this machine.
    if os.geteuid() != 0:
        pytest.skip("the bootstrap roles set root ownership: run as root (CI does)")


def fleet_yaml(path: Path, nodes: list[str]) -> Path:
    path.write_text("version: 1\n" + "\n".join(nodes) + "\n")
    return path


def ssh_section(server: Sshd) -> str:
    return (
        f"ssh:\n  user: {server.user}\n  identity_file: {server.client_key}\n"
        f"  known_hosts: {server.known_hosts}\n"
        "agent:\n  backend: sim\n"
        "teams:\n  vision: {users: [alice]}\n  nlp: {users: [bob]}\n"
    )


def test_bootstrap_twice_check_then_discover(sshd_loopback_factory: SshdFactory, tmp_path: Path) -> None:
    a = sshd_loopback_factory("node-a", set_env=NODE_SESSION_ENV)
    b = sshd_loopback_factory(
        "node-b", client_keys=a.client_keys, known_hosts=a.known_hosts, set_env=NODE_SESSION_ENV
    )
    prefix = {"node-a": tmp_path / "nodes" / "a" / "gpuops", "node-b": tmp_path / "nodes" / "b" / "gpuops"}
    fleet = fleet_yaml(
        tmp_path / "fleet.yaml",
        [
            ssh_section(a),
            "nodes:",
            f"  - {{name: node-a, host: 127.0.0.1, port: {a.port}, owner: vision,"
            f" agent: {{prefix: {prefix['node-a']}}}}}",
            f"  - {{name: node-b, host: 127.0.0.1, port: {b.port}, owner: nlp,"
            f" ssh: {{jump_host: '{a.user}@127.0.0.1:{a.port}'}}, agent: {{prefix: {prefix['node-b']}}}}}",
        ],
    )
    # The exporter's own port on an address of 127.0.0.0/8 no one else uses: a free port picked
    # now could be taken by another test before the exporter binds it minutes later.
    net = f"127.{random.randrange(32, 250)}.{random.randrange(1, 250)}"
    listen = {"node-a": f"{net}.1:9835", "node-b": f"{net}.2:9835"}
    inventory = make_inventory(
        fleet, tmp_path / "inventory", {name: {"gpuops_node_metrics_listen": a} for name, a in listen.items()}
    )
    src, wheels = prepare(tmp_path)
    variables = play_vars(tmp_path, src, wheels, a.user) | {"gpuops_limiter_build": True}

    first = playbook(tmp_path, inventory, variables)
    assert first.returncode == 0, first.stdout[-6000:] + first.stderr[-2000:]
    seen = recap(first.stdout)
    assert seen["node-a"]["changed"] > 10 and seen["node-b"]["changed"] > 10, seen

    second = playbook(tmp_path, inventory, variables)
    assert second.returncode == 0, second.stdout[-6000:] + second.stderr[-2000:]
    assert {host: r["changed"] for host, r in recap(second.stdout).items()} == {
        "localhost": 0,
        "node-a": 0,
        "node-b": 0,
    }, second.stdout[-6000:]

    check = playbook(tmp_path, inventory, variables, "--check", "--diff")
    assert check.returncode == 0, check.stdout[-6000:] + check.stderr[-2000:]
    assert all(r["changed"] == 0 for r in recap(check.stdout).values()), check.stdout[-6000:]
    assert "--- before" not in check.stdout and "+++ after" not in check.stdout, check.stdout[-6000:]

    for name, base in prefix.items():
        release = (base / "current").resolve()
        assert release.parent == base / "releases" and (release / ".gpuops-release").is_file()
        assert [p.name for p in (base / "releases").iterdir()] == [release.name]
        preload = (base / "etc" / "ld.so.preload").read_text()
        assert preload == f"{base}/lib/gpuops/libgpuops-limiter.so\n", name
        assert (base / "lib" / "gpuops" / "libgpuops-limiter.so").read_bytes() == LIMITER.read_bytes()
        assert oct((base / "run" / "gpuops" / "limiter").stat().st_mode & 0o777) == "0o755"
        tmpfiles = (base / "etc" / "tmpfiles.d" / "gpuops-mps.conf").read_text()
        # MPS per device: the MIG-off GPU, and each MIG device of the MIG-on one.
        for device in (GPU0, MIG1A, MIG1B):
            assert f"/mps/pipe/{device} " in tmpfiles and (base / "mps" / "pipe" / device).is_dir()
        assert "GPU-5f0b3b6e-0001" not in tmpfiles

    units = prefix["node-a"] / "etc" / "systemd" / "system"
    verify_units(units, tmp_path)
    run_units(prefix, listen, units, a)

    r = gpuops("discover", "-f", str(fleet), "--json", "--timeout", "30")
    assert r.returncode == 0, r.stderr
    nodes = {n["name"]: n for n in json.loads(r.stdout)["nodes"]}
    for name, base in prefix.items():
        assert nodes[name]["state"] == "live", nodes[name]
        assert nodes[name]["agent"] == "bootstrapped"
        assert nodes[name]["agent_command"] == f"{base}/bin/gpuops-agent"
    assert nodes["node-b"]["route"].startswith("via "), nodes["node-b"]["route"]
    table = gpuops("discover", "-f", str(fleet), "--timeout", "30")
    assert table.returncode == 0 and "Agent" in table.stdout and "bootstrapped" in table.stdout, table.stdout


def verify_units(units: Path, tmp_path: Path) -> None:
    """systemd's own check of the unit files (as far as it goes without a running systemd)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        print("systemd-analyze is not installed: unit files not verified (docs/ansible.md)")
        return
    instance = tmp_path / "verify" / f"gpuops-mps@{GPU0}.service"
    instance.parent.mkdir()
    shutil.copy(units / "gpuops-mps@.service", instance)
    for unit in (units / "gpuops-node.service", instance):
        r = subprocess.run(
            [analyze, "verify", "--man=no", str(unit)], capture_output=True, text=True, timeout=60
        )
        problems = [
            line
            for line in (r.stdout + r.stderr).splitlines()
            # Without systemd as PID 1 it cannot look units up by name; not about our files.
            if line.strip() and "System has not been booted with systemd" not in line
        ]
        assert r.returncode == 0 and not problems, f"{unit.name}: {problems}"


def run_units(prefix: dict[str, Path], listen: dict[str, str], units: Path, server: Sshd) -> None:
    """Start what the units would start, bounded, then stop them as systemd would (SIGTERM,
    ExecStop): the node service serves /metrics and keeps history the installed agent serves;
    an MPS unit starts its daemon with its pid file where gpuops apply looks."""
    started: list[subprocess.Popen[bytes]] = []
    try:
        for name, base in prefix.items():
            argv, env = unit_command(base / "etc" / "systemd" / "system" / "gpuops-node.service")
            assert argv == [f"{base}/bin/gpuops-agent", "--record", "--metrics", listen[name]]
            log = (base / f"{name}.log").open("wb")
            started.append(
                subprocess.Popen(argv, env={**os.environ, **env}, stderr=log, start_new_session=True)
            )
        for name, address in listen.items():
            assert "gpuops_gpu_info{" in wait_metrics(address), name
        # The first sample after a start counts no time: a few more make history to serve.
        time.sleep(3)
    finally:
        for proc in started:
            proc.send_signal(signal.SIGTERM)
        for proc, (name, base) in zip(started, prefix.items(), strict=True):
            assert proc.wait(timeout=20) == 0, (base / f"{name}.log").read_text()
    # The recorder wrote on SIGTERM; an SSH session of the installed agent serves it.
    wrapper = f"{prefix['node-a']}/bin/gpuops-agent"
    replies = agent_lines(
        server.ssh_argv(wrapper, "--stdio", "--backend", "sim"),
        [{"op": "hello", "args": {}}, {"op": "history", "args": {"resolution": "minute"}}],
    )
    history = replies[1]
    assert history["ok"], history
    assert history["result"]["buckets"], history

    argv, env = unit_command(units / "gpuops-mps@.service", GPU0)
    assert argv == [str(FAKE_MPS), "-d"]
    r = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    pid_file = Path(env["CUDA_MPS_PIPE_DIRECTORY"]) / "nvidia-cuda-mps-control.pid"
    assert pid_file.is_file()
    stop = subprocess.run(
        [str(FAKE_MPS)], input="quit\n", env={**os.environ, **env}, capture_output=True, text=True, timeout=30
    )
    assert stop.returncode == 0, stop.stderr


def test_bad_input_stops_the_host_and_a_rerun_converges(
    sshd_loopback_factory: SshdFactory, tmp_path: Path
) -> None:
    names = ("good", "oldpy", "ro", "badlib")
    # fleet.yaml lists each machine once: an sshd of its own per host, one key, one known_hosts.
    server = sshd_loopback_factory(names[0], set_env=NODE_SESSION_ENV)
    ports = {names[0]: server.port}
    for name in names[1:]:
        extra = sshd_loopback_factory(
            name, client_keys=server.client_keys, known_hosts=server.known_hosts, set_env=NODE_SESSION_ENV
        )
        ports[name] = extra.port
    prefix = {name: tmp_path / "nodes" / name / "gpuops" for name in names}
    old_python = write_executable(
        tmp_path / "python3.6",
        "#!/bin/sh\n# A node whose python3 is 3.6: what it answers to the version probe.\n"
        'case "$*" in *version_info*) echo 3.6; exit 0;; esac\nexit 1\n',
    )
    broken = tmp_path / "broken" / "libbroken.so"
    broken.parent.mkdir()
    (broken.parent / "broken.c").write_text(
        "#include <unistd.h>\n__attribute__((constructor)) static void refuse(void) { _exit(3); }\n"
    )
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(broken), str(broken.parent / "broken.c")],
        check=True,
        timeout=60,
    )
    # The node's preload file already names another library, which must stay and load with ours.
    other = broken.parent / "libother.so"
    (broken.parent / "other.c").write_text("int gpuops_test_other(void) { return 0; }\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(other), str(broken.parent / "other.c")], check=True)
    badlib_preload = tmp_path / "badlib-ld.so.preload"
    badlib_preload.write_text(f"{other}\n")

    def entries(python: bool) -> list[str]:
        out = [ssh_section(server), "nodes:"]
        for name in names:
            agent = f"prefix: {prefix[name]}"
            if name == "oldpy" and python:
                agent += f", python: {old_python}"
            out.append(f"  - {{name: {name}, host: 127.0.0.1, port: {ports[name]}, agent: {{{agent}}}}}")
        return out

    fleet = fleet_yaml(tmp_path / "fleet.yaml", entries(python=True))
    # Extra variables win over host variables: the per-host ones stay out of them.
    # MPS is the main test's; here it would only add tasks to every run.
    variables = play_vars(tmp_path, *prepare(tmp_path), server.user) | {"gpuops_mps_enabled": False}
    del variables["gpuops_limiter_preload_file"]
    host_vars = {name: {"gpuops_limiter_preload_file": f"{prefix[name]}/etc/ld.so.preload"} for name in names}
    host_vars["badlib"] = {
        "gpuops_limiter_library": str(broken),
        "gpuops_limiter_preload_file": str(badlib_preload),
    }
    inventory = make_inventory(fleet, tmp_path / "inventory", host_vars)

    # A limiter that was never built: every host stops before anything changes.
    missing = tmp_path / "native" / "build" / "libgpuops-limiter.so"
    r = playbook(tmp_path, inventory, variables | {"gpuops_limiter_source": str(tmp_path)})
    assert r.returncode != 0
    assert all(recap(r.stdout)[name]["failed"] == 1 for name in names), r.stdout[-4000:]
    assert f"gpuops_limiter_library {missing} does not exist on the control machine" in r.stdout
    assert "make -C" in r.stdout
    assert not (tmp_path / "nodes").exists()

    # Old Python, read-only prefix, a library that does not load: those hosts stop, one line
    # each saying why, with nothing installed; the good one is bootstrapped.
    prefix["ro"].mkdir(parents=True)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=1m", "gpuops-test-ro", str(prefix["ro"])],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here: {mounted.stderr.strip()}")
    try:
        r = playbook(tmp_path, inventory, variables)
        assert r.returncode != 0
        seen = recap(r.stdout)
        assert seen["good"]["failed"] == 0 and seen["good"]["changed"] > 10, seen
        assert all(seen[name]["failed"] == 1 for name in ("oldpy", "ro", "badlib")), seen
        out = r.stdout
        assert f"'{old_python}' is Python 3.6: gpuops needs Python 3.8 or newer" in out, out[-4000:]
        assert f"gpuops_prefix {prefix['ro']}" in out and "cannot be written" in out, out[-4000:]
        assert f"{broken} fails its smoke test on this node" in out, out[-4000:]
        assert "exited 3" in out
        assert "Traceback" not in out
        for name in ("oldpy", "badlib"):
            assert not prefix[name].exists(), name
        assert list(prefix["ro"].iterdir()) == []
        assert badlib_preload.read_text() == f"{other}\n"
    finally:
        subprocess.run(["umount", str(prefix["ro"])], check=True, timeout=30)

    # Fixed: a Python 3.8+, a writable prefix, a library that loads. Everything converges, and
    # the preload file keeps the line it had.
    del host_vars["badlib"]["gpuops_limiter_library"]
    make_inventory(fleet_yaml(fleet, entries(python=False)), tmp_path / "inventory", host_vars)
    r = playbook(tmp_path, inventory, variables)
    assert r.returncode == 0, r.stdout[-6000:]
    seen = recap(r.stdout)
    assert all(seen[name]["failed"] == 0 for name in names), seen
    assert seen["good"]["changed"] == 0, seen
    for name in names:
        assert (prefix[name] / "current" / ".gpuops-release").is_file(), name
    lib = prefix["badlib"] / "lib" / "gpuops" / "libgpuops-limiter.so"
    assert badlib_preload.read_text() == f"{other}\n{lib}\n"
