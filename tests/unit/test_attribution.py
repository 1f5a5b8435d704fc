"""Attribution of GPU processes to tenants (gpuops.tenancy): each source, the order fleet.yaml
sets, the unattributed case, plugins found through real entry points (a dist-info on sys.path),
broken plugins reported once and skipped, and a property test that attribution never raises."""

from __future__ import annotations

import logging
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuops import attributors
from gpuops.core.model import Gpu, GpuInfo, GpuProcess, GpuSample, NodeSample
from gpuops.fleet.source import LIVE, FleetSnapshot, NodeView
from gpuops.spec import Fleet, SpecError, parse_fleet
from gpuops.tenancy import (
    DEFAULT_ORDER,
    UNATTRIBUTED_RESULT,
    Attribution,
    AttributionChain,
    AttributionContext,
    AttributorError,
    available_attributors,
    load_attributor,
)
from gpuops.tenancy import attribution as attribution_module
from gpuops.tenancy.ownership import UNOWNED, Ownership
from gpuops.views.detail import process_rows
from gpuops.views.tenants import tenant_rows
from tests.hypothesis_budget import examples

FLEET = """\
version: 1
teams:
  vision: {users: [alice], groups: [cv-lab]}
  nlp: {users: [bob], groups: [nlp-lab, linguists]}
  platform: {users: [svc-embed]}
nodes:
  - {host: gpu-a, owner: vision, gpus: {"2": nlp}}
  - {host: gpu-shared}
"""


def fleet(extra: str = "") -> Fleet:
    return parse_fleet(FLEET + extra, "fleet.yaml")


def context(f: Fleet, owner: str | None = None) -> AttributionContext:
    return AttributionContext("gpu-a", None, owner, f, tuple(f.teams))


def attribute(process: GpuProcess, owner: str | None = None, extra: str = "") -> Attribution:
    f = fleet(extra)
    chain = AttributionChain.from_config(f.attribution.order, f.attribution.settings)
    return chain.attribute(process, context(f, owner))


@pytest.fixture(autouse=True)
def fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sees "reported once" from the start."""
    monkeypatch.setattr(attribution_module, "_reported", set())


# ---- each source -----------------------------------------------------------------------------------


def test_limiter_label_first() -> None:
    limited = GpuProcess(1, 0, user="alice", tenant="nlp", tenant_source="limiter")
    assert attribute(limited, owner="vision") == Attribution("nlp", "limiter")
    # a label without a source is the limiter's; a node's other source is kept as it says
    assert attribute(GpuProcess(1, 0, tenant="nlp"), "vision") == Attribution("nlp", "limiter")
    assert attribute(GpuProcess(1, 0, tenant="nlp", tenant_source="mps"), "vision").source == "mps"


def test_user_of_a_team() -> None:
    got = attribute(GpuProcess(1, 0, user="bob", groups=("cv-lab",)), owner="vision")
    assert got == Attribution("nlp", "user", "user bob")


def test_group_of_a_team_primary_first() -> None:
    carol = GpuProcess(1, 0, user="carol", groups=("carol", "linguists", "cv-lab"))
    assert attribute(carol, owner="vision") == Attribution("nlp", "group", "group linguists")
    dave = GpuProcess(1, 0, user="dave", groups=("cv-lab", "linguists"))
    assert attribute(dave, owner="nlp") == Attribution("vision", "group", "group cv-lab")


def test_owner_of_the_gpu() -> None:
    eve = GpuProcess(1, 0, user="eve", groups=("eve", "users"))
    assert attribute(eve, owner="vision") == Attribution("vision", "owner", "GPU owner")


def test_nobody_on_an_unowned_gpu_is_unattributed() -> None:
    eve = GpuProcess(1, 0, user="eve", groups=("eve",))
    assert attribute(eve, owner=None) == UNATTRIBUTED_RESULT == Attribution("-", "none")
    assert attribute(GpuProcess(1, 0), owner=None) == UNATTRIBUTED_RESULT  # nothing known at all


def test_order_and_enabled_set_come_from_fleet_yaml() -> None:
    bob_in_cv = GpuProcess(1, 0, user="bob", groups=("cv-lab",), tenant="platform")
    assert attribute(bob_in_cv, "vision", "attribution: {order: [group, user]}\n").source == "group"
    assert attribute(bob_in_cv, "vision", "attribution: {order: [owner, limiter]}\n").team == "vision"
    # group left out: a member of cv-lab alone falls through to the owner
    dave = GpuProcess(1, 0, user="dave", groups=("cv-lab",))
    assert attribute(dave, "nlp", "attribution: {order: [limiter, user, owner]}\n") == Attribution(
        "nlp", "owner", "GPU owner"
    )
    assert attribute(dave, None, "attribution: {order: [limiter, user]}\n") == UNATTRIBUTED_RESULT


def test_default_order_and_builtins_are_registered_as_entry_points() -> None:
    assert fleet().attribution.order == list(DEFAULT_ORDER) == ["limiter", "user", "group", "owner"]
    assert set(DEFAULT_ORDER) <= set(available_attributors())
    from importlib import metadata

    registered = {ep.name: ep.value for ep in metadata.entry_points(group="gpuops.attributors")}
    if "limiter" not in registered:
        pytest.skip("the gpuops install predates its attributor entry points (make venv)")
    assert registered["user"] == "gpuops.tenancy.builtin:UserAttributor"


# ---- fleet.yaml: located errors ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "attribution: {order: [limiter, kubernets, user]}\n",
            "fleet.yaml:9:32: attribution.order[1]: unknown attributor 'kubernets' (available: ",
        ),
        (
            "attribution: {order: [user, owner, user]}\n",
            "fleet.yaml:9:22: attribution.order: 'user' is listed twice",
        ),
        ("attribution: {order: []}\n", "attribution.order: no attributor listed"),
        (
            "attribution: {settings: {owner: {x: 1}}}\n",
            "attribution.settings: the built-in attributor 'owner' has no",
        ),
        ("attribution: {settings: {usr: {}}}\n", "attribution.settings.usr: unknown attributor 'usr'"),
        ("attribution: {oder: [user]}\n", "attribution.oder: unknown key 'oder'"),
        ("attribution: {order: user}\n", "attribution.order: expected a list"),
    ],
)
def test_attribution_mistakes_are_located(text: str, message: str) -> None:
    with pytest.raises(SpecError) as caught:
        fleet(text)
    assert message in str(caught.value), str(caught.value)


def test_a_near_miss_gets_a_hint() -> None:
    with pytest.raises(SpecError, match="did you mean 'group'"):
        fleet("attribution: {order: [groups]}\n")


# ---- through the views: Ownership ---------------------------------------------------------------------


def _gpu(index: int, processes: tuple[GpuProcess, ...]) -> Gpu:
    info = GpuInfo(index, f"GPU-{index}", "NVIDIA A100-SXM4-40GB", f"0:{index}", 0x20B010DE, 40 << 30, False)
    sample = GpuSample(1.0, 50.0, 10.0, 1 << 30, 40 << 30, 100.0, 40.0, 1400, 1200)
    return Gpu(info, sample=sample, processes=processes)


def _snapshot() -> FleetSnapshot:
    owned = _gpu(0, (GpuProcess(10, 1 << 30, user="alice"), GpuProcess(11, 1 << 30, user="eve")))
    shared = _gpu(0, (GpuProcess(20, 2 << 30, user="eve"), GpuProcess(21, 1 << 30, user="bob")))
    views = (
        NodeView(
            "gpu-a", "gpu-a", LIVE, last_seen=1.0, sample=NodeSample("gpu-a", 1.0, (owned,)), owner="vision"
        ),
        NodeView(
            "gpu-shared", "gpu-shared", LIVE, last_seen=1.0, sample=NodeSample("gpu-shared", 1.0, (shared,))
        ),
    )
    return FleetSnapshot(1.0, 1.0, views)


def test_ownership_runs_the_chain_and_keeps_its_signature() -> None:
    own = Ownership.from_fleet(fleet())
    assert own.tenant(GpuProcess(1, 0, user="bob"), "vision") == ("nlp", "user")
    assert own.tenant(GpuProcess(1, 0, user="x", groups=("cv-lab",)), "nlp") == ("vision", "group")
    assert own.tenant(GpuProcess(1, 0, user="eve"), "vision") == ("vision", "owner")
    assert own.tenant(GpuProcess(1, 0, user="eve"), None) == ("-", "none")
    assert own.tenant(GpuProcess(1, 0, user="eve"), UNOWNED) == ("-", "none")  # the views' "no owner"
    # an Ownership built without a fleet (the in-process sim source, older callers)
    bare = Ownership(("a", "b"), lambda n, i: "a", {"bob": "b"}.get)
    assert bare.tenant(GpuProcess(1, 0, user="bob"), "a") == ("b", "user")
    assert bare.tenant(GpuProcess(1, 0, user="eve"), None) == ("-", "none")
    with_groups = Ownership(("a",), None, None, {"ops": "a"}.get)
    assert with_groups.tenant(GpuProcess(1, 0, groups=("x", "ops")), None) == ("a", "group")


def test_unattributed_processes_are_shown_and_counted_never_dropped() -> None:
    own = Ownership.from_fleet(fleet())
    snapshot = _snapshot()
    rows = process_rows(snapshot.nodes[1], own)
    assert [(r.pid, r.tenant, r.tenant_source) for r in rows] == [(20, "-", "none"), (21, "nlp", "user")]
    rows = process_rows(snapshot.nodes[0], own)
    assert [(r.pid, r.tenant, r.tenant_source) for r in rows] == [
        (10, "vision", "user"),
        (11, "vision", "owner"),
    ]
    by_team = {r.team: r for r in tenant_rows(snapshot, own)}
    assert by_team["-"].processes == 1 and by_team["-"].memory_used == 2 << 30
    assert by_team["nlp"].processes == 1 and by_team["vision"].processes == 2
    assert sum(r.processes for r in by_team.values()) == 4


# ---- plugins through real entry points -------------------------------------------------------------

PLUGINS = """
from gpuops.tenancy import Attribution


class Good:
    name = "good"

    def __init__(self, settings):
        self.team = settings.get("team", "platform")

    def attribute(self, process, context):
        if process.user.startswith("svc-"):
            return Attribution(self.team, detail="service account")  # source: the plugin's name
        return None


class Raising:
    name = "raising"

    def __init__(self, settings):
        pass

    def attribute(self, process, context):
        raise RuntimeError(f"cannot reach the scheduler about pid {process.pid}")


class Garbage:
    name = "garbage"

    def __init__(self, settings):
        pass

    def attribute(self, process, context):
        return ("vision", "garbage")


class NeedsSettings:
    name = "needs-settings"

    def __init__(self, settings):
        if "url" not in settings:
            raise ValueError("give url")

    def attribute(self, process, context):
        return None


NOT_AN_ATTRIBUTOR = 42
"""

ENTRY_POINTS = """\
[gpuops.attributors]
good = demo_attributors:Good
raising = demo_attributors:Raising
garbage = demo_attributors:Garbage
needs-settings = demo_attributors:NeedsSettings
not-an-attributor = demo_attributors:NOT_AN_ATTRIBUTOR
missing-class = demo_attributors:Gone
broken-import = demo_attributors_broken:Thing
user = demo_attributors:Good
"""


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A distribution 'demo-attributors' on sys.path: its modules and its dist-info, as pip
    would leave them, found by importlib.metadata like any installed plugin."""
    (tmp_path / "demo_attributors.py").write_text(textwrap.dedent(PLUGINS))
    (tmp_path / "demo_attributors_broken.py").write_text("import gpuops_no_such_module  # noqa\n")
    info = tmp_path / "demo_attributors-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: demo-attributors\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    attributors.refresh()
    yield tmp_path
    monkeypatch.delitem(__import__("sys").modules, "demo_attributors", raising=False)
    attributors.refresh()


@pytest.mark.usefixtures("plugins")
def test_a_plugin_is_found_ordered_and_configured() -> None:
    assert {"good", "raising", "broken-import"} <= set(available_attributors())
    f = fleet("attribution: {order: [limiter, good, user, owner], settings: {good: {team: nlp}}}\n")
    own = Ownership.from_fleet(f)
    assert own.chain is not None and own.chain.names == ("limiter", "good", "user", "owner")
    assert own.tenant(GpuProcess(1, 0, user="svc-embed"), "vision") == ("nlp", "good")
    assert own.tenant(GpuProcess(1, 0, user="bob"), "vision") == ("nlp", "user")


@pytest.mark.usefixtures("plugins")
def test_a_plugin_cannot_replace_a_builtin(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpuops.tenancy"):
        chain = AttributionChain.from_config(["user"])
    assert chain.attribute(GpuProcess(1, 0, user="svc-x"), context(fleet())) == UNATTRIBUTED_RESULT
    assert any("demo-attributors registers an attributor named 'user'" in p for p in chain.problems)
    assert "it is ignored" in caplog.text


@pytest.mark.usefixtures("plugins")
def test_broken_plugins_are_reported_once_and_skipped(caplog: pytest.LogCaptureFixture) -> None:
    order = [
        "broken-import",
        "missing-class",
        "not-an-attributor",
        "needs-settings",
        "raising",
        "garbage",
        "user",
        "owner",
    ]
    f = fleet()
    with caplog.at_level(logging.WARNING, logger="gpuops.tenancy"):
        chain = AttributionChain.from_config(order)
        assert chain.names == ("raising", "garbage", "user", "owner")
        for _ in range(3):
            assert chain.attribute(GpuProcess(1, 0, user="bob"), context(f)) == Attribution(
                "nlp", "user", "user bob"
            )
            assert chain.attribute(GpuProcess(2, 0, user="eve"), context(f, "vision")).source == "owner"
    problems = "\n".join(chain.problems)
    assert (
        "attributor 'broken-import' (demo_attributors_broken:Thing) cannot be loaded: ModuleNotFoundError"
        in problems
    )
    assert "'missing-class' (demo_attributors:Gone) cannot be loaded: AttributeError" in problems
    assert "'not-an-attributor' (demo_attributors:NOT_AN_ATTRIBUTOR) cannot be set up: TypeError" in problems
    assert (
        "'needs-settings' (demo_attributors:NeedsSettings) cannot be set up: ValueError: give url" in problems
    )
    # the first exception only, though each process made a different one
    assert "attributor 'raising' failed (RuntimeError: cannot reach the scheduler about pid 1)" in problems
    assert "pid 2" not in problems
    assert "attributor 'garbage' answered ('vision', 'garbage') instead of an Attribution" in problems
    # each problem once, in the log as in the chain, however many processes met it
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == len(set(warnings)) == len(chain.problems) == 7
    # and a second chain (a fleet.yaml reloaded) does not log them again
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gpuops.tenancy"):
        again = AttributionChain.from_config(order)
        again.attribute(GpuProcess(1, 0, user="bob"), context(f))
    assert caplog.records == [] and again.problems == chain.problems


@pytest.mark.usefixtures("plugins")
def test_load_attributor_says_why() -> None:
    with pytest.raises(AttributorError, match=r"unknown attributor 'nope' \(available: .*good"):
        load_attributor("nope")
    with pytest.raises(AttributorError, match="has no settings"):
        load_attributor("owner", {"x": 1})
    assert load_attributor("good", {"team": "nlp"}).attribute(
        GpuProcess(1, 0, user="svc-a"), context(fleet())
    )


def test_an_unknown_name_given_in_code_is_reported_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gpuops.tenancy"):
        chain = AttributionChain.from_config(["kubernetes-not-installed", "owner"])
    assert chain.names == ("owner",)
    assert "unknown attributor 'kubernetes-not-installed'" in caplog.text


# ---- attribution never raises ---------------------------------------------------------------------

anything = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=20)
    | st.binary(max_size=8)
    | st.sampled_from(["alice", "bob", "cv-lab", "nlp-lab", "vision", "", "-", UNOWNED]),
    lambda inner: (
        st.lists(inner, max_size=4) | st.tuples(inner, inner) | st.dictionaries(st.text(max_size=5), inner)
    ),
    max_leaves=8,
)
processes = st.builds(
    GpuProcess,
    pid=anything,
    used_memory_bytes=anything,
    user=anything,
    command=anything,
    gpu_instance_id=anything,
    compute_instance_id=anything,
    tenant=anything,
    tenant_source=anything,
    groups=anything | st.lists(st.sampled_from(["cv-lab", "nlp-lab", "x", ""])).map(tuple),
    cgroup=anything,
)


@pytest.fixture(scope="module")
def fleet_for_fuzz() -> Fleet:
    return fleet()


@settings(
    max_examples=examples(300), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(process=processes, owner=anything, node=anything)
def test_attribution_never_raises(fleet_for_fuzz: Fleet, process: GpuProcess, owner: Any, node: Any) -> None:
    own = Ownership.from_fleet(fleet_for_fuzz)
    team, source = own.tenant(process, owner, node)
    assert type(team) is str and team and type(source) is str and source
    for order in (list(DEFAULT_ORDER), ["owner", "group", "user", "limiter"]):
        chain = AttributionChain.from_config(order)
        found = chain.attribute(process, AttributionContext(node, None, owner, fleet_for_fuzz))
        assert isinstance(found, Attribution) and type(found.team) is str and found.team
        assert chain.problems == ()  # the built-in attributors do not fail on odd fields
