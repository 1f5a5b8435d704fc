"""From fleet.yaml (gpuops/spec) to what the collector connects to."""

from __future__ import annotations

from gpuops.fleet.collector import NodeTarget
from gpuops.fleet.remote_agent import AgentLaunch
from gpuops.fleet.ssh import SshTarget
from gpuops.spec import Fleet


def node_targets(fleet: Fleet) -> list[NodeTarget]:
    targets = []
    for node in fleet.nodes:
        ssh = fleet.ssh_settings(node)
        jump = None
        if ssh.jump is not None:
            jump = SshTarget(
                host=ssh.jump.host,
                port=ssh.jump.port,
                user=ssh.jump.user,
                # A jump host without a key of its own is offered the node's key, as OpenSSH does.
                identity_files=tuple(k for k in (ssh.jump.identity_file or ssh.identity_file,) if k),
                known_hosts=ssh.known_hosts,
                host_key_policy=ssh.host_key_policy,
                connect_timeout=ssh.connect_timeout,
                login_timeout=ssh.login_timeout,
                keepalive_interval=ssh.keepalive_interval,
                use_ssh_config=ssh.use_ssh_config,
            )
        agent = fleet.agent_settings(node)
        targets.append(
            NodeTarget(
                name=node.name,
                ssh=SshTarget(
                    host=ssh.host,
                    port=ssh.port,
                    user=ssh.user,
                    identity_files=(ssh.identity_file,) if ssh.identity_file else (),
                    known_hosts=ssh.known_hosts,
                    host_key_policy=ssh.host_key_policy,
                    connect_timeout=ssh.connect_timeout,
                    login_timeout=ssh.login_timeout,
                    keepalive_interval=ssh.keepalive_interval,
                    use_ssh_config=ssh.use_ssh_config,
                    jump=jump,
                ),
                launch=AgentLaunch(agent.mode, agent.python, agent.backend, agent.sim_spec),
                owner=fleet.node_owner(node),
                labels=tuple(sorted((node.labels or {}).items())),
            )
        )
    return targets
