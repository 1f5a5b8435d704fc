"""The fleet.yaml model (pydantic) and what the layers above ask of it: resolved SSH and agent
settings per node, owners of nodes and GPUs, the team of a user, nodes matching a selector.

Models are frozen. Field-level rules live in `types.py`; rules that span fields (unique names,
owners that must be teams, ...) live in `checks.py` so that all of them can be reported at once.
To extend the file (issues 4 and 7: desired state, pools), add a field to `Fleet` (a list or a
mapping of models is checked item by item) and, for cross-references, a check to `checks.CHECKS`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Annotated, Any, Iterable, Literal, Mapping, Union

from pydantic import (
    AfterValidator,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    WithJsonSchema,
    model_validator,
)

from gpuops.attributors import BUILTIN as BUILTIN_ATTRIBUTORS
from gpuops.attributors import DEFAULT_ORDER as DEFAULT_ATTRIBUTION_ORDER
from gpuops.attributors import available_attributors
from gpuops.core.driver_memory import DriverMemory
from gpuops.core.mig.catalog import MigModel
from gpuops.spec.base import SpecModel
from gpuops.spec.carve_entry import CarveEntry
from gpuops.spec.desired_gpu import DesiredGpu, desired_for, entry_location
from gpuops.spec.errors import FieldProblem, show
from gpuops.spec.pools import Pool, pool_selects
from gpuops.spec.selectors import Selector, parse_gpu_indices, parse_selector
from gpuops.spec.source import Document
from gpuops.spec.types import (
    NAME_RE,
    SPEC_VERSION,
    AgentModeField,
    BackendName,
    Command,
    Flag,
    GpuKey,
    GroupName,
    HandshakeCount,
    Host,
    HostKeyPolicy,
    HostKeyPolicyField,
    Interval,
    JumpName,
    JumpRef,
    KeepaliveInterval,
    LabelKey,
    LabelMatchers,
    LabelValue,
    LocalPath,
    NodeName,
    PoolName,
    Port,
    PrometheusUrl,
    RemotePath,
    TeamName,
    Text,
    Timeout,
    UserName,
    Version,
    closest,
    parse_jump_literal,
)

DEFAULT_PORT = 22
DEFAULT_HOST_KEY_POLICY: HostKeyPolicy = "strict"
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_LOGIN_TIMEOUT = 20.0
DEFAULT_KEEPALIVE_INTERVAL = 15.0
DEFAULT_MAX_HANDSHAKES = 64
DEFAULT_USE_SSH_CONFIG = True
DEFAULT_INTERVAL = 1.0
DEFAULT_AGENT_MODE: Literal["auto"] = "auto"
DEFAULT_PYTHON = "python3"
DEFAULT_BACKEND = "nvml"
DEFAULT_PREFIX = "/opt/gpuops"  # where ansible/bootstrap.yml installs the node side
NO_JUMP = "none"


class SshOptions(SpecModel):
    """SSH settings; at the top level they are the defaults, under a node its overrides."""

    user: UserName | None = None
    """Login user. Default: the User of ~/.ssh/config (with use_ssh_config), else your local user."""
    port: Port | None = None
    """SSH port. Default: the Port of ~/.ssh/config (with use_ssh_config), else 22."""
    identity_file: LocalPath | None = None
    """Private key file (relative paths are relative to fleet.yaml). Agent keys and ~/.ssh/config
    IdentityFile are used too."""
    known_hosts: LocalPath | None = None
    """known_hosts file to verify host keys against. Default: ~/.ssh/known_hosts."""
    host_key_policy: HostKeyPolicyField | None = None
    """strict (default): unknown hosts are refused; accept-new: trust a host on first contact and
    remember its key, as OpenSSH's StrictHostKeyChecking=accept-new. Checking cannot be turned off."""
    connect_timeout: Timeout | None = None
    """Time to open the TCP connection. Default 10s."""
    login_timeout: Timeout | None = None
    """Time from connected to logged in (key exchange and authentication). Default 20s."""
    keepalive_interval: KeepaliveInterval | None = None
    """Interval of SSH keepalives (0 = off). Default 15s."""
    jump_host: JumpRef | None = None
    """Jump host: a name from jump_hosts, user@host:port, or none (connect directly)."""
    use_ssh_config: Flag | None = None
    """Read ~/.ssh/config for the node's host (Host aliases, User, Port, IdentityFile, ProxyJump).
    Default true."""


class SshDefaults(SshOptions):
    """The top-level ssh: defaults for every node, plus the fleet-wide limits."""

    max_handshakes: HandshakeCount | None = None
    """Most SSH handshakes in flight at once across the fleet. Default 64."""


class AgentOptions(SpecModel):
    """How the node side is started; at the top level the defaults, under a node its overrides."""

    mode: AgentModeField | None = None
    """auto (default): the installed `gpuops` if the node has one, else push the zipapp;
    installed: only the installed one; push: always the pushed zipapp."""
    python: Command | None = None
    """Python 3.8+ on the node that runs the pushed zipapp. Default python3."""
    backend: BackendName | None = None
    """Where GPU facts come from: nvml (default) or sim (a simulated node)."""
    sim_spec: RemotePath | None = None
    """For backend sim: a spec path on the node or a built-in scenario name."""
    prefix: RemotePath | None = None
    """Where ansible/bootstrap.yml installed the node side (its gpuops_prefix). Default /opt/gpuops."""


class JumpHost(SpecModel):
    """A bastion that nodes are reached through."""

    host: Host
    port: Port | None = None
    user: UserName | None = None
    identity_file: LocalPath | None = None


class Team(SpecModel):
    """A tenant: the unix users and groups whose GPU work counts as the team's."""

    description: Text = ""
    users: list[UserName] = Field(default_factory=list)
    groups: list[GroupName] = Field(default_factory=list)


def check_attributor_name(value: Any) -> str:
    """An attributor that this gpuops has: a built-in one or an installed plugin's."""
    if not isinstance(value, str) or not value:
        raise FieldProblem(f"expected an attributor name (got {show(value)})")
    known = available_attributors()
    if value not in known:
        hint = closest(value, known) or "a plugin package provides it (see docs/tenancy.md): is it installed?"
        raise FieldProblem(f"unknown attributor {show(value)} (available: {', '.join(known)})", hint)
    return value


def _check_order(names: list[str]) -> list[str]:
    if not names:
        raise FieldProblem(
            "no attributor listed: every process would be unattributed",
            f"list some, e.g. [{', '.join(DEFAULT_ATTRIBUTION_ORDER)}] (the default)",
        )
    for i, name in enumerate(names):
        if name in names[:i]:
            raise FieldProblem(
                f"{show(name)} is listed twice", "list each attributor once, in the order to ask them"
            )
    return names


def _check_settings(settings: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    for name, values in settings.items():
        if name in BUILTIN_ATTRIBUTORS and values:
            raise FieldProblem(f"the built-in attributor {show(name)} has no settings", "remove them")
    return settings


AttributorName = Annotated[
    str,
    BeforeValidator(check_attributor_name),
    WithJsonSchema({"type": "string", "examples": [*DEFAULT_ATTRIBUTION_ORDER, "kubernetes"]}),
]


class SourceOptions(SpecModel):
    """Where the live views read the fleet from: its nodes over SSH (no `source:`, or no
    `prometheus`), or a Prometheus that scrapes them; docs/prometheus-source.md."""

    prometheus: PrometheusUrl | None = None
    """Base URL of Prometheus' HTTP API (or Thanos Query's, Mimir's, VictoriaMetrics'): tui,
    status, discover, tenants and rebalance read PromQL there. Plan and apply still use SSH."""
    timeout: Timeout | None = None
    """How long one round of queries may take before the source counts as unreachable. Default:
    the interval."""
    selector: LabelMatchers = ""
    """Label matchers added to every query (`job="gpuops"`), when the server holds other fleets."""


class AttributionOptions(SpecModel):
    """How each GPU process is attributed to a team; docs/tenancy.md."""

    order: Annotated[list[AttributorName], AfterValidator(_check_order)] = Field(
        default_factory=lambda: list(DEFAULT_ATTRIBUTION_ORDER)
    )
    """Attributors asked in this order; the first answer wins; only those listed are used.
    Default: limiter, user, group, owner. Plugins (e.g. kubernetes) are named here to be used."""
    settings: Annotated[dict[AttributorName, dict[str, Any]], AfterValidator(_check_settings)] = Field(
        default_factory=dict
    )
    """Settings of attributors that take some (plugins), by name: {kubernetes: {pods: ...}}."""


def _name_is_optional(schema: dict[str, Any]) -> None:
    required = schema.get("required")
    if isinstance(required, list) and "name" in required:
        required.remove("name")


class NodeEntry(SpecModel):
    """One GPU server: an entry of `nodes:` (its live inventory is `gpuops.core.model.Node`)."""

    model_config = ConfigDict(json_schema_extra=_name_is_optional)

    name: NodeName
    """Unique name; defaults to host when host is a plain name or IPv4 address."""
    host: Host
    """DNS name, IP address, or an ~/.ssh/config Host alias (with use_ssh_config)."""
    port: Port | None = None
    user: UserName | None = None
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict)
    """Free labels (Kubernetes rules) for selectors: rack, zone, model, ..."""
    owner: TeamName | None = None
    """The team whose silo this node is; unset: nobody's."""
    gpus: dict[GpuKey, TeamName] = Field(default_factory=dict)
    """Per-GPU owners overriding owner: {"0-3": vision, "4,5": nlp}."""
    ssh: SshOptions | None = None
    agent: AgentOptions | None = None

    @model_validator(mode="before")
    @classmethod
    def _name_defaults_to_host(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("name") is None:
            host = data.get("host")
            if isinstance(host, str) and NAME_RE.match(host):
                return {**data, "name": host}
        return data


class Fleet(SpecModel):
    """fleet.yaml: the inventory of GPU nodes, the teams that own them and how to reach them."""

    model_config = ConfigDict(serialize_by_alias=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_node_list(cls, data: Any) -> Any:
        # `nodes:` with every entry commented out is an empty fleet, not a type error.
        if isinstance(data, dict) and "nodes" in data and data["nodes"] is None:
            return {**data, "nodes": []}
        return data

    version: Version
    """Format version; 1."""
    interval: Interval = DEFAULT_INTERVAL
    """Sampling interval of live views. Default 1s."""
    ssh: SshDefaults = Field(default_factory=SshDefaults)
    agent: AgentOptions = Field(default_factory=AgentOptions)
    jump_hosts: dict[JumpName, JumpHost] = Field(default_factory=dict)
    teams: dict[TeamName, Team] = Field(default_factory=dict)
    nodes: list[NodeEntry]
    carve: list[CarveEntry] = Field(default_factory=list)
    """Desired state: MIG layout, MPS and limiter settings per GPU selection, in order (a later
    entry overrides an earlier one, per kind, on the GPUs both select)."""
    attribution: AttributionOptions = Field(default_factory=AttributionOptions)
    """Which team each GPU process counts for: the attributors to ask, in order (docs/tenancy.md)."""
    pools: dict[PoolName, Pool] = Field(default_factory=dict)
    """GPUs shared by teams, with per-team guarantees (docs/pools.md)."""
    # Written `source:`; the attribute `source` is where the fleet's values are written (below).
    live_source: SourceOptions = Field(default_factory=SourceOptions, alias="source")
    """Where live views read the fleet from: SSH (default) or a Prometheus (docs/prometheus-source.md)."""

    _index: _Index | None = PrivateAttr(default=None)
    _doc: Document | None = PrivateAttr(default=None)  # where things are written, when loaded
    _carve_selectors: Any = PrivateAttr(default=None)  # resolve.selectors_for's cache

    def __eq__(self, other: object) -> bool:
        # The lookup index is a cache, not part of the value.
        if not isinstance(other, Fleet):
            return NotImplemented
        return type(self) is type(other) and self.__dict__ == other.__dict__

    __hash__ = None  # type: ignore[assignment]

    # ---- lookups -------------------------------------------------------------------------

    def _lookup(self) -> _Index:
        key = (id(self.nodes), id(self.teams), len(self.nodes), len(self.teams))
        index = self._index
        if index is None or index.key != key:
            index = _Index(self, key)
            self._index = index
        return index

    def node(self, name: str) -> NodeEntry:
        """The node called `name` (KeyError if none)."""
        try:
            return self._lookup().nodes[name]
        except KeyError:
            raise KeyError(f"no node named {name!r} in the fleet") from None

    def _node(self, node: NodeRef) -> NodeEntry:
        return self.node(node) if isinstance(node, str) else node

    def nodes_matching(self, selector: str | Selector) -> list[NodeEntry]:
        """Nodes selected by `selector` (see gpuops.spec.selectors), in file order.
        Raises SelectorError for a malformed selector."""
        sel = parse_selector(selector) if isinstance(selector, str) else selector
        return [n for n in self.nodes if sel.matches(n.name, n.labels)]

    def node_owner(self, node: NodeRef) -> str | None:
        """The team whose silo the node is, or None."""
        return self._node(node).owner

    def gpu_owner(self, node: NodeRef, index: int) -> str | None:
        """The owner of GPU `index` of the node: its per-GPU owner, else the node's owner."""
        n = self._node(node)
        return self._lookup().gpu_owners(n).get(index, n.owner)

    def gpu_owners(self, node: NodeRef) -> dict[int, str]:
        """The node's per-GPU owner overrides, by GPU index (GPUs not listed have the node's owner)."""
        return dict(self._lookup().gpu_owners(self._node(node)))

    def team_of_user(self, user: str, groups: Iterable[str] = ()) -> str | None:
        """The team of a unix user: the team listing the user; else the team of the first of
        `groups` (the user's groups, primary first) that a team lists; else None."""
        index = self._lookup()
        team = index.users.get(user)
        if team is not None:
            return team
        for group in groups:
            team = index.groups.get(group)
            if team is not None:
                return team
        return None

    def team_of_group(self, group: str) -> str | None:
        return self._lookup().groups.get(group)

    # ---- pools ---------------------------------------------------------------------------------

    def pool_of(
        self, node: NodeRef, index: int, uuid: str | None = None, model: str | None = None
    ) -> str | None:
        """The pool a GPU is a member of (the first pool, in file order, that selects it), or None.
        `uuid` and `model` (NVML name or catalog key) let selections by UUID or model match."""
        n = self._node(node)
        for name, pool in self.pools.items():
            if any(pool_selects(sel, n, index, uuid, model) for sel in pool.gpus):
                return name
        return None

    def pool_guarantees(self, sizes: Mapping[str, int]) -> dict[str, float]:
        """GPU-equivalents each team is guaranteed in pools: its share x the pool's GPUs
        (`sizes`: GPUs per pool, as counted by the caller from what it sees)."""
        out: dict[str, float] = {}
        for name, pool in self.pools.items():
            for team, g in pool.guarantees.items():
                out[team] = out.get(team, 0.0) + g.share / 100.0 * sizes.get(name, 0)
        return out

    # ---- desired state (carve:) --------------------------------------------------------------

    def desired_for(
        self,
        node: NodeRef,
        gpu_index: int,
        gpu_uuid: str | None = None,
        gpu_model: str | MigModel | None = None,
        *,
        mig_mode: bool | None = None,
        memory_total: int | None = None,
        driver_memory: DriverMemory | None = None,
    ) -> DesiredGpu:
        """What carve: wants on one live GPU: `DesiredGpu(mig=, mps=, limiter=)`, None where no
        entry says (leave as is); later entries win per kind. `gpu_model` is the NVML name (or a
        catalog key); the MIG layout is solved for it (`solved_layout`). `mig_mode` (live MIG mode),
        `memory_total` (bytes) and `driver_memory` (what the node observed of the driver's memory:
        `GpuInfo.driver_memory`) let more rules be checked. What is wrong for this GPU is in
        `.problems` (located SpecIssues), never raised; warnings in `.notes`."""
        return desired_for(
            self,
            self.source,
            self._node(node),
            gpu_index,
            gpu_uuid,
            gpu_model,
            mig_mode=mig_mode,
            memory_total=memory_total,
            driver_memory=driver_memory,
        )

    @property
    def source(self) -> Document:
        """Where the fleet's values are written (positions), for located messages; an empty
        Document named '<fleet>' for a fleet built in code."""
        if self._doc is None:
            self._doc = Document("<fleet>")
        return self._doc

    def carve_location(self, entry: int) -> str:
        """'fleet.yaml:30:5': where carve entry `entry` is written."""
        return entry_location(self.source, entry)

    # ---- resolved settings -----------------------------------------------------------------

    @property
    def max_handshakes(self) -> int:
        return self.ssh.max_handshakes if self.ssh.max_handshakes is not None else DEFAULT_MAX_HANDSHAKES

    def ssh_settings(self, node: NodeRef) -> SshSettings:
        """The node's SSH settings: the node's own values, else the fleet's ssh: defaults, else the
        built-in defaults; the jump host resolved; ~ expanded in local paths."""
        n = self._node(node)
        layers = [n.ssh, self.ssh] if n.ssh is not None else [self.ssh]

        def pick(name: str) -> Any:
            for layer in layers:
                value = getattr(layer, name)
                if value is not None:
                    return value
            return None

        port = n.port if n.port is not None else pick("port")
        user = n.user if n.user is not None else pick("user")
        policy = pick("host_key_policy")
        connect = pick("connect_timeout")
        login = pick("login_timeout")
        keepalive = pick("keepalive_interval")
        use_config = pick("use_ssh_config")
        return SshSettings(
            host=n.host,
            port=port,
            user=user,
            identity_file=_expand(pick("identity_file")),
            known_hosts=_expand(pick("known_hosts")),
            host_key_policy=policy if policy is not None else DEFAULT_HOST_KEY_POLICY,
            connect_timeout=connect if connect is not None else DEFAULT_CONNECT_TIMEOUT,
            login_timeout=login if login is not None else DEFAULT_LOGIN_TIMEOUT,
            keepalive_interval=keepalive if keepalive is not None else DEFAULT_KEEPALIVE_INTERVAL,
            use_ssh_config=use_config if use_config is not None else DEFAULT_USE_SSH_CONFIG,
            jump=self.jump_settings(pick("jump_host")),
        )

    def jump_settings(self, ref: str | None) -> JumpSettings | None:
        """A jump_host value resolved: a jump_hosts entry or a user@host:port literal; None for
        none/unset. Raises KeyError for a name that jump_hosts does not define."""
        if ref is None or ref == NO_JUMP:
            return None
        entry = self.jump_hosts.get(ref)
        if entry is not None:
            return JumpSettings(ref, entry.host, entry.port, entry.user, _expand(entry.identity_file))
        if "@" in ref or ":" in ref:
            user, host, port = parse_jump_literal(ref)
            return JumpSettings(ref, host, port, user, None)
        raise KeyError(f"jump host {ref!r} is not defined under jump_hosts")

    def agent_settings(self, node: NodeRef) -> AgentSettings:
        """How to start the node side: the node's agent: values, else the fleet's, else defaults."""
        n = self._node(node)
        layers = [n.agent, self.agent] if n.agent is not None else [self.agent]

        def pick(name: str, default: Any) -> Any:
            for layer in layers:
                value = getattr(layer, name)
                if value is not None:
                    return value
            return default

        return AgentSettings(
            mode=pick("mode", DEFAULT_AGENT_MODE),
            python=pick("python", DEFAULT_PYTHON),
            backend=pick("backend", DEFAULT_BACKEND),
            sim_spec=pick("sim_spec", None),
            prefix=pick("prefix", DEFAULT_PREFIX),
        )


NodeRef = Union[NodeEntry, str]


def _expand(path: str | None) -> str | None:
    return os.path.expanduser(path) if path is not None else None


@dataclass(frozen=True)
class JumpSettings:
    """A resolved jump host. `name` is the jump_hosts key or the literal as written."""

    name: str
    host: str
    port: int | None
    user: str | None
    identity_file: str | None

    @property
    def effective_port(self) -> int:
        return self.port if self.port is not None else DEFAULT_PORT


@dataclass(frozen=True)
class SshSettings:
    """Everything needed to open one node's SSH connection.

    `port` and `user` are None when neither the node nor the fleet sets them: then ~/.ssh/config
    decides (with use_ssh_config), else port 22 and the local user. Local paths have ~ expanded and
    are absolute when fleet.yaml was loaded from a file."""

    host: str
    port: int | None
    user: str | None
    identity_file: str | None
    known_hosts: str | None
    host_key_policy: HostKeyPolicy
    connect_timeout: float
    login_timeout: float
    keepalive_interval: float
    use_ssh_config: bool
    jump: JumpSettings | None

    @property
    def effective_port(self) -> int:
        return self.port if self.port is not None else DEFAULT_PORT

    @property
    def target(self) -> str:
        """'user@host:port' for messages (user and port only when set)."""
        host = f"[{self.host}]" if ":" in self.host and self.port is not None else self.host
        text = f"{self.user}@{host}" if self.user else host
        return f"{text}:{self.port}" if self.port is not None else text


@dataclass(frozen=True)
class AgentSettings:
    mode: Literal["auto", "installed", "push"]
    python: str
    backend: str
    sim_spec: str | None
    prefix: str = DEFAULT_PREFIX


class _Index:
    """Lookup tables of one Fleet, rebuilt when its node or team lists are replaced."""

    def __init__(self, fleet: Fleet, key: tuple[int, int, int, int]) -> None:
        self.key = key
        self.nodes: dict[str, NodeEntry] = {}
        for n in fleet.nodes:
            self.nodes.setdefault(n.name, n)
        self.users: dict[str, str] = {}
        self.groups: dict[str, str] = {}
        for team_name, team in fleet.teams.items():
            for user in team.users:
                self.users.setdefault(user, team_name)
            for group in team.groups:
                self.groups.setdefault(group, team_name)
        self._gpu_owners: dict[int, dict[int, str]] = {}

    def gpu_owners(self, node: NodeEntry) -> dict[int, str]:
        mine = self.nodes.get(node.name) is node
        cached = self._gpu_owners.get(id(node)) if mine else None
        if cached is None:
            cached = {}
            for key, team in node.gpus.items():
                for index in parse_gpu_indices(key):
                    cached.setdefault(index, team)
            if mine:
                self._gpu_owners[id(node)] = cached
        return cached


__all__ = [
    "SPEC_VERSION",
    "AgentOptions",
    "AgentSettings",
    "AttributionOptions",
    "Fleet",
    "JumpHost",
    "JumpSettings",
    "NodeEntry",
    "SshDefaults",
    "SshOptions",
    "SshSettings",
    "Team",
]
