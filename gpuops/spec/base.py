"""The base of every fleet.yaml mapping model."""

from __future__ import annotations

import ast
import inspect
import sys
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class SpecModel(BaseModel):
    """Base of every fleet.yaml mapping: unknown keys are errors, values are immutable, and a key
    left empty (``teams:`` with nothing under it) means its default.

    A field's description is the docstring under it, as pydantic's `use_attribute_docstrings` reads
    it; only the JSON Schema shows descriptions, so `describe_fields()` reads them there, not every
    command at import (pydantic walked frames and tokenized each class's source: ~80 ms a start).
    Validators are built on first use (`defer_build`): a command builds those of the models it
    validates, once, instead of every model's at import."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

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


_described = False


def describe_fields() -> None:
    """Give every SpecModel field without a description its attribute docstring, as
    `use_attribute_docstrings=True` would have at class creation, and rebuild the models whose
    schemas were built without them (models a model holds first: a parent's schema reuses theirs)."""
    global _described
    if _described:
        return
    models = _spec_models()
    sources: dict[str, dict[str, dict[str, str]]] = {}  # module -> class -> field -> docstring
    for model in models:  # in order of definition within a module, bases before subclasses
        module = sys.modules[model.__module__]
        if model.__module__ not in sources:
            sources[model.__module__] = _attribute_docstrings(inspect.getsource(module))
        own_docs = sources[model.__module__].get(model.__qualname__, {})
        own = inspect.get_annotations(model)
        for name, field in model.__pydantic_fields__.items():
            if field.description is not None:
                continue
            if name in own:
                field.description = own_docs.get(name)
            else:  # inherited: pydantic copied the base's field, described by then
                field.description = _inherited_description(model, name)
    done: set[type[SpecModel]] = set()

    def rebuild(model: type[SpecModel]) -> None:
        if model in done:
            return
        done.add(model)
        for held in _held_models(model):
            rebuild(held)
        if model.__pydantic_complete__:
            model.model_rebuild(force=True)

    for model in models:
        rebuild(model)
    _described = True


def _inherited_description(model: type[SpecModel], name: str) -> str | None:
    for base in model.__mro__[1:]:
        if issubclass(base, SpecModel) and name in base.__pydantic_fields__:
            return base.__pydantic_fields__[name].description
    return None


def _spec_models() -> list[type[SpecModel]]:
    """Every subclass of SpecModel, each after its bases."""
    found: list[type[SpecModel]] = []
    pending: list[type[SpecModel]] = [SpecModel]
    while pending:
        model = pending.pop(0)
        if model not in found:
            found.append(model)
            pending.extend(model.__subclasses__())
    return found


def _held_models(model: type[SpecModel]) -> list[type[SpecModel]]:
    """The SpecModels a model's fields hold, at any depth of their types (list, dict, Union, ...)."""
    held: list[type[SpecModel]] = []
    pending: list[Any] = [field.annotation for field in model.__pydantic_fields__.values()]
    while pending:
        kind = pending.pop()
        if isinstance(kind, type) and issubclass(kind, SpecModel):
            if kind is not model and kind not in held:
                held.append(kind)
            continue
        pending.extend(typing.get_args(kind))
    return held


def _attribute_docstrings(source: str) -> dict[str, dict[str, str]]:
    """Per class (qualified name) of a module, the docstring under each annotated attribute, read
    as pydantic's DocstringVisitor reads it: a string statement right after `name: type [= ...]`."""
    found: dict[str, dict[str, str]] = {}

    def visit(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef):
                qualname = prefix + node.name
                docs: dict[str, str] = {}
                for previous, stmt in zip(node.body, node.body[1:], strict=False):
                    if (
                        isinstance(previous, ast.AnnAssign)
                        and isinstance(previous.target, ast.Name)
                        and isinstance(stmt, ast.Expr)
                        and isinstance(stmt.value, ast.Constant)
                        and isinstance(stmt.value.value, str)
                    ):
                        docs[previous.target.id] = inspect.cleandoc(stmt.value.value)
                found[qualname] = docs
                visit(node.body, qualname + ".")

    visit(ast.parse(source).body, "")
    return found
