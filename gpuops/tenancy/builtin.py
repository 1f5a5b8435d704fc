"""The built-in attributors (registered as entry points like any plugin; docs/tenancy.md).

Each is tolerant of whatever the process carries: a field of an unexpected type is "nothing to
say", never an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuops.core.model import GpuProcess
from gpuops.tenancy.attribution import Attribution, AttributionContext

LIMITER_SOURCE = "limiter"


class _Builtin:
    name = ""

    def __init__(self, settings: Mapping[str, Any] | None = None) -> None:
        if settings:
            raise ValueError(f"the {self.name} attributor has no settings (got {sorted(settings)})")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class LimiterAttributor(_Builtin):
    """The tenant label the node reports for the process: the limiter region's tenant (gpuops'
    interception limiter tags each process it limits). Source: what the node says, else
    ``limiter``."""

    name = "limiter"

    def attribute(self, process: GpuProcess, context: AttributionContext) -> Attribution | None:
        tenant = process.tenant
        if not tenant or type(tenant) is not str:
            return None
        source = process.tenant_source
        return Attribution(tenant, source if source and type(source) is str else LIMITER_SOURCE)


class UserAttributor(_Builtin):
    """The team whose fleet.yaml ``users`` list the process's unix user."""

    name = "user"

    def attribute(self, process: GpuProcess, context: AttributionContext) -> Attribution | None:
        user = process.user
        if not user or type(user) is not str:
            return None
        team = context.team_of_user(user)
        return Attribution(team, "user", f"user {user}") if team else None


class GroupAttributor(_Builtin):
    """The team whose fleet.yaml ``groups`` list one of the process's unix groups; the first
    group that a team lists wins (the node reports the primary group first)."""

    name = "group"

    def attribute(self, process: GpuProcess, context: AttributionContext) -> Attribution | None:
        groups = process.groups
        if not groups or not isinstance(groups, (tuple, list)):
            return None
        for group in groups:
            if group and type(group) is str:
                team = context.team_of_group(group)
                if team:
                    return Attribution(team, "group", f"group {group}")
        return None


class OwnerAttributor(_Builtin):
    """The owner of the GPU the process runs on (its silo): a process nobody else claims counts
    for the team whose card it is."""

    name = "owner"

    def attribute(self, process: GpuProcess, context: AttributionContext) -> Attribution | None:
        owner = context.owner
        return Attribution(owner, "owner", "GPU owner") if owner and type(owner) is str else None
