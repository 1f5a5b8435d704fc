"""The JSON Schema of fleet.yaml, for editors (yaml-language-server) and other tools."""

from __future__ import annotations

from typing import Any

from gpuops.spec.model import Fleet

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def fleet_json_schema() -> dict[str, Any]:
    """The schema of what `load_fleet` accepts field by field; the rules that span fields (unique
    names, owners that must be teams, ...) are only checked by `gpuops validate`."""
    schema = Fleet.model_json_schema(mode="validation")
    return {
        "$schema": SCHEMA_DIALECT,
        "title": "gpuops fleet.yaml",
        **{k: v for k, v in schema.items() if k != "title"},
    }
