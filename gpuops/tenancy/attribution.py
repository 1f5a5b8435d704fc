"""Attribution: which tenant (team) each GPU process counts for, and where that came from.

A chain of *attributors* is asked in a configured order; the first that answers wins. The
built-in ones, in the default order:

- ``limiter``: the tenant label the node reports for the process (the limiter region it runs in);
- ``user``: the team whose fleet.yaml ``users`` list the process's unix user;
- ``group``: the team whose ``groups`` list one of the process's unix groups (primary first);
- ``owner``: the owner of the GPU the process runs on (its silo).

A process nobody claims is *unattributed*: team ``-``, source ``none``. It is shown and counted
like any other, never dropped.

Attributors are plugins: the entry point group ``gpuops.attributors`` names a class (or any
factory) that is called with its settings (a dict, ``{}`` when fleet.yaml gives none) and returns
an object with ``name`` and ``attribute(process, context) -> Attribution | None``. The built-in
ones are registered there too (with a fallback table for an install without metadata). fleet.yaml
chooses the order and the enabled set (``attribution: {order: [...], settings: {...}}``). A
plugin that cannot be loaded, or that raises or answers nonsense while attributing, is reported
once (a logged warning, and in `AttributionChain.problems`) and skipped: attribution never
raises. See docs/tenancy.md.
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from gpuops.attributors import DEFAULT_ORDER, available_attributors, discover
from gpuops.core.model import Gpu, GpuProcess

if TYPE_CHECKING:
    from gpuops.spec import Fleet

UNATTRIBUTED = "-"  # the team of a process nobody claims
NO_SOURCE = "none"  # ... and its source

log = logging.getLogger("gpuops.tenancy")


@dataclass(frozen=True)
class Attribution:
    """The tenant of a process: `team`, `source` (the attributor's word: limiter, user, group,
    owner, kubernetes, ...; the attributor's name when left empty) and an optional `detail` of
    what matched ("user alice", "group cv-lab", "namespace ml-prod")."""

    team: str
    source: str = ""
    detail: str = ""


UNATTRIBUTED_RESULT = Attribution(UNATTRIBUTED, NO_SOURCE)


def _nobody(_: str) -> str | None:
    return None


class AttributionContext:
    """What an attributor may know besides the process: the node's name, the GPU (None where the
    caller does not have it), the GPU's owner (None: unowned), the Fleet (None without a
    fleet.yaml), the known team names, and the user and group lookups (fleet.yaml's teams)."""

    __slots__ = ("fleet", "gpu", "node", "owner", "team_of_group", "team_of_user", "teams")

    def __init__(
        self,
        node: str = "",
        gpu: Gpu | None = None,
        owner: str | None = None,
        fleet: Fleet | None = None,
        teams: Sequence[str] = (),
        team_of_user: Callable[[str], str | None] | None = None,
        team_of_group: Callable[[str], str | None] | None = None,
    ) -> None:
        self.node = node
        self.gpu = gpu
        self.owner = owner
        self.fleet = fleet
        self.teams = tuple(teams) if not isinstance(teams, tuple) else teams
        if team_of_user is None:
            team_of_user = fleet.team_of_user if fleet is not None else _nobody
        if team_of_group is None:
            team_of_group = fleet.team_of_group if fleet is not None else _nobody
        self.team_of_user: Callable[[str], str | None] = team_of_user
        self.team_of_group: Callable[[str], str | None] = team_of_group

    def __repr__(self) -> str:
        return f"AttributionContext(node={self.node!r}, owner={self.owner!r}, teams={self.teams!r})"


@runtime_checkable
class Attributor(Protocol):
    """One source of attribution. `attribute` returns None when it has nothing to say, so the
    next attributor is asked."""

    name: str

    def attribute(self, process: GpuProcess, context: AttributionContext) -> Attribution | None: ...


class AttributorError(Exception):
    """An attributor could not be found or loaded; the message says which and why."""


# ---- reporting: once per problem ---------------------------------------------------------------

_reported: set[str] = set()  # keys of the problems logged in this process


def _warn_once(key: str, message: str) -> None:
    if key not in _reported:
        _reported.add(key)
        log.warning("%s", message)


def load_attributor(name: str, settings: Mapping[str, Any] | None = None) -> Attributor:
    """Attributor `name` built with `settings`; raises AttributorError with a one-line reason."""
    target = discover().targets.get(name)
    if target is None:
        known = ", ".join(available_attributors())
        raise AttributorError(f"unknown attributor {name!r} (available: {known})")
    module_name, _, attr = target.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split(".") if attr else ():
            obj = getattr(obj, part)
    except Exception as exc:
        raise AttributorError(
            f"attributor {name!r} ({target}) cannot be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    try:
        if isinstance(obj, type) or not callable(getattr(obj, "attribute", None)):
            obj = obj(dict(settings or {}))
        elif settings:
            raise TypeError("it is an object, not a factory, so it takes no settings")
    except Exception as exc:
        raise AttributorError(
            f"attributor {name!r} ({target}) cannot be set up: {type(exc).__name__}: {exc}"
        ) from exc
    if not callable(getattr(obj, "attribute", None)):
        raise AttributorError(
            f"attributor {name!r} ({target}) has no attribute(process, context) method "
            f"(got {type(obj).__name__})"
        )
    return obj  # type: ignore[no-any-return]


# ---- the chain -----------------------------------------------------------------------------------


class AttributionChain:
    """Attributors asked in order; the first answer wins, else the process is unattributed.

    `attribute` never raises: an attributor that raises, or answers something that is not an
    `Attribution` with a team, is reported once and passed over for that process."""

    def __init__(self, attributors: Sequence[tuple[str, Attributor]], problems: Iterable[str] = ()) -> None:
        self._calls: tuple[tuple[str, Callable[[GpuProcess, AttributionContext], Any]], ...] = tuple(
            (name, a.attribute) for name, a in attributors
        )
        self.attributors: tuple[tuple[str, Attributor], ...] = tuple(attributors)
        self._problems: list[str] = []
        self._seen: set[str] = set()
        for problem in problems:
            self._problem(problem, problem)

    @classmethod
    def from_config(
        cls,
        order: Sequence[str] | None = None,
        settings: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> AttributionChain:
        """The chain of fleet.yaml's `attribution:` (`order` None: the default order). Names that
        cannot be loaded are reported once and left out."""
        found = discover()
        loaded: list[tuple[str, Attributor]] = []
        problems: list[str] = list(found.problems)
        settings = settings or {}
        for name in DEFAULT_ORDER if order is None else order:
            if any(name == n for n, _ in loaded):
                continue
            try:
                loaded.append((name, load_attributor(name, settings.get(name))))
            except AttributorError as exc:
                problems.append(f"{exc}; attribution goes on without it")
        return cls(loaded, problems)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.attributors)

    @property
    def problems(self) -> tuple[str, ...]:
        """Every problem met so far (each once), for a screen to show."""
        return tuple(self._problems)

    def _problem(self, key: str, message: str) -> None:
        """Report a problem once per `key` (an attributor that raises is reported for its first
        exception only, whatever the later ones say)."""
        if key not in self._seen:
            self._seen.add(key)
            self._problems.append(message)
            _warn_once(key, message)

    def attribute(self, process: GpuProcess, context: AttributionContext | None = None) -> Attribution:
        """The tenant of `process`: the first attributor's answer, else `UNATTRIBUTED_RESULT`."""
        if context is None:
            context = AttributionContext()
        for name, call in self._calls:
            try:
                result = call(process, context)
            except Exception as exc:
                self._problem(
                    f"{name}\0raised",
                    f"attributor {name!r} failed ({type(exc).__name__}: {_short(exc)}); "
                    "it is skipped where it fails",
                )
                continue
            if result is None:
                continue
            if isinstance(result, Attribution) and type(result.team) is str and result.team:
                if type(result.source) is str and result.source:
                    return result
                if not result.source:
                    return Attribution(result.team, name, result.detail)
            self._problem(
                f"{name}\0answered",
                f"attributor {name!r} answered {_short(result)!s} instead of an Attribution with a team; "
                "the answer is ignored",
            )
        return UNATTRIBUTED_RESULT


def _short(value: object, limit: int = 300) -> str:
    try:
        text = repr(value) if not isinstance(value, BaseException) else str(value)
    except Exception:
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@lru_cache(maxsize=1)
def default_chain() -> AttributionChain:
    """The built-in attributors in the default order (no fleet.yaml: `discover --local`)."""
    return AttributionChain.from_config(DEFAULT_ORDER)
