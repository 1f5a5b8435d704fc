"""Values with a final newline are refused: a regex's "$" would accept them, "\\Z" does not."""

from __future__ import annotations

import pytest

from gpuops.spec import SpecError, fleet_from_data


@pytest.mark.parametrize(
    "node",
    [
        {"name": "a", "host": "gpu-a-01\n"},
        {"name": "a\n", "host": "gpu-a-01"},
        {"name": "a", "host": "gpu-a-01", "user": "ops\n"},
        {"name": "a", "host": "gpu-a-01", "agent": {"python": "python3\n"}},
    ],
)
def test_a_final_newline_is_not_a_valid_value(node: dict[str, object]) -> None:
    with pytest.raises(SpecError):
        fleet_from_data({"version": 1, "nodes": [node]}, "fleet.yaml")
