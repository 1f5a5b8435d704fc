"""The JSON Schema of fleet.yaml, for editors (yaml-language-server) and other tools."""

from __future__ import annotations

from typing import Any

from gpuops.spec.base import describe_fields
from gpuops.spec.model import Fleet

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def fleet_json_schema() -> dict[str, Any]:
    """The schema of what `load_fleet` accepts field by field; the rules that span fields (unique
    names, owners that must be teams, ...) are only checked by `gpuops validate`."""
    describe_fields()  # the attribute docstrings, read only here (spec/base.py)
    schema = Fleet.model_json_schema(mode="validation")
    body = {k: v for k, v in schema.items() if k != "title"}
    _allow_empty_mappings(body)
    body["patternProperties"] = {"^x-": {"description": "ignored: a place for YAML anchors"}}
    return {"$schema": SCHEMA_DIALECT, "title": "gpuops fleet.yaml", **body}


def _allow_empty_mappings(node: Any) -> None:
    """A key left empty (`teams:` / `nlp:` with nothing under it) means its default: let a null
    stand wherever a mapping of settings is expected."""
    if isinstance(node, list):
        for item in node:
            _allow_empty_mappings(item)
        return
    if not isinstance(node, dict):
        return
    for key in ("properties", "patternProperties"):
        members = node.get(key)
        if isinstance(members, dict):
            for name, sub in members.items():
                if isinstance(sub, dict) and set(sub) == {"$ref"}:
                    members[name] = {"anyOf": [sub, {"type": "null"}]}
    extra = node.get("additionalProperties")
    if isinstance(extra, dict) and set(extra) == {"$ref"}:
        node["additionalProperties"] = {"anyOf": [extra, {"type": "null"}]}
    for value in node.values():
        _allow_empty_mappings(value)
