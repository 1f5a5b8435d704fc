"""From fleet.yaml (gpuops/spec) to what the collector connects to."""

from __future__ import annotations

import dataclasses

from gpuops.fleet.remote_agent import AgentLaunch
from gpuops.fleet.session import NodeTarget
from gpuops.fleet.ssh import SshTarget
from gpuops.spec import Fleet, SshSettings
from gpuops.spec.model import NO_JUMP, NodeEntry


def _ssh_target(
    host: str, port: int | None, user: str | None, key: str | None, ssh: SshSettings
) -> SshTarget:
    """One hop with the node's policies: known_hosts, host-key policy, timeouts, ssh config."""
    return SshTarget(
        host=host,
        port=port,
        user=user,
        identity_files=(key,) if key else (),
        known_hosts=ssh.known_hosts,
        host_key_policy=ssh.host_key_policy,
        connect_timeout=ssh.connect_timeout,
        login_timeout=ssh.login_timeout,
        keepalive_interval=ssh.keepalive_interval,
        use_ssh_config=ssh.use_ssh_config,
    )


def _says_no_jump(fleet: Fleet, node: NodeEntry) -> bool:
    """`jump_host: none` on the node (else in the fleet's ssh:): direct, as `ssh -J none` is,
    whatever ProxyJump ~/.ssh/config has for the host."""
    for layer in (node.ssh, fleet.ssh):
        ref = getattr(layer, "jump_host", None) if layer is not None else None
        if ref is not None:
            return bool(ref == NO_JUMP)
    return False


def node_targets(fleet: Fleet) -> list[NodeTarget]:
    targets = []
    for node in fleet.nodes:
        ssh = fleet.ssh_settings(node)
        target = _ssh_target(ssh.host, ssh.port, ssh.user, ssh.identity_file, ssh)
        if ssh.jump is not None:
            # A jump host without a key of its own is offered the node's, as OpenSSH does.
            key = ssh.jump.identity_file or ssh.identity_file
            jump = _ssh_target(ssh.jump.host, ssh.jump.port, ssh.jump.user, key, ssh)
            target = dataclasses.replace(target, jump=jump)
        elif _says_no_jump(fleet, node):
            target = dataclasses.replace(target, direct=True)
        agent = fleet.agent_settings(node)
        targets.append(
            NodeTarget(
                name=node.name,
                ssh=target,
                launch=AgentLaunch(agent.mode, agent.python, agent.backend, agent.sim_spec, agent.prefix),
                owner=fleet.node_owner(node),
                labels=tuple(sorted((node.labels or {}).items())),
            )
        )
    return targets
