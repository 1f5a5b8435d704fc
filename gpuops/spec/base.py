"""The base of every fleet.yaml mapping model."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class SpecModel(BaseModel):
    """Base of every fleet.yaml mapping: unknown keys are errors, values are immutable, and a key
    left empty (``teams:`` with nothing under it) means its default."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    @model_validator(mode="before")
    @classmethod
    def _empty_means_default(cls, data: Any) -> Any:
        if data is None:
            return {}
        if isinstance(data, dict):
            fields = cls.model_fields
            empty = [k for k, v in data.items() if v is None and k in fields and not fields[k].is_required()]
            if empty:
                return {k: v for k, v in data.items() if k not in empty}
        return data
