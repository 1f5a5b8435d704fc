"""The actions that change the fleet, by name: --readonly refuses them and they ask for confirmation.

Kept apart from the screens that run them so that the app can list them without importing those
screens (the Pool screen needs the spec and the planner, loaded only when it is opened).
"""

from __future__ import annotations

# The Pool screen's: move GPUs into the pool or back to their owners' silos, apply the change.
MOVE_IN, MOVE_BACK, APPLY = "move_into_pool", "move_back_to_silo", "apply_pool_change"
POOL_CHANGES = frozenset({MOVE_IN, MOVE_BACK, APPLY})
