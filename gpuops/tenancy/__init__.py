"""Tenants: which team each GPU process counts for (attribution chain and its plugins).

    chain = AttributionChain.from_config(fleet.attribution.order, fleet.attribution.settings)
    chain.attribute(process, AttributionContext(node="gpu-a-01", owner="vision", fleet=fleet))
    # Attribution(team='vision', source='user', detail='user alice')

See docs/tenancy.md.
"""

from __future__ import annotations

from gpuops.attributors import DEFAULT_ORDER, ENTRY_POINT_GROUP, available_attributors, refresh
from gpuops.tenancy.attribution import (
    NO_SOURCE,
    UNATTRIBUTED,
    UNATTRIBUTED_RESULT,
    Attribution,
    AttributionChain,
    AttributionContext,
    Attributor,
    AttributorError,
    default_chain,
    load_attributor,
)

__all__ = [
    "DEFAULT_ORDER",
    "ENTRY_POINT_GROUP",
    "NO_SOURCE",
    "UNATTRIBUTED",
    "UNATTRIBUTED_RESULT",
    "Attribution",
    "AttributionChain",
    "AttributionContext",
    "Attributor",
    "AttributorError",
    "available_attributors",
    "default_chain",
    "load_attributor",
    "refresh",
]
