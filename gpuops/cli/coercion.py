"""Typer's coercion of option and argument values, without a pydantic TypeAdapter for the plain
types gpuops' commands take (str, bool, int, float, Path, list[str]).

Typer 0.2x turns every value given on the command line (and every default) into its Python type
through a pydantic TypeAdapter built per parameter: importing its adapters loads pydantic (~80 ms of
CPU for a command that has no other use for it) and the first adapters cost ~15 ms more. The
values gpuops takes are plain, so a value that is plainly valid is converted here exactly as that
adapter would (str and bool as they are, Path(str), int or float of decimal digits, a range
checked); any other
value, valid or not, goes to typer's own adapter, which converts it or says what is wrong with it,
word for word as before. tests/unit/test_cli_startup.py holds the two side by side.

Typer offers no hook for this (its `parser=` still builds an adapter); the parameter's
`_runtime_param`, which typer fills lazily, is set here. Without these internals (another typer),
nothing is changed and typer coerces as it always did.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

try:
    from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
    from typer._param_types import coerce_cli_path
    from typer.core import _TyperParameter
except ImportError:  # pragma: no cover - another typer: its own coercion stays
    RuntimeParam = None  # type: ignore[assignment,misc]

_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?[0-9]{1,15}(?:\.[0-9]{1,15})?")
_UNSURE = object()  # not plainly valid: typer's adapter decides


def _plain_int(value: Any) -> Any:
    if type(value) is int:
        return value
    if type(value) is str and _INT.fullmatch(value):
        return int(value)
    return _UNSURE


def _plain_float(value: Any) -> Any:
    if type(value) is float:
        return value
    if type(value) is str and _FLOAT.fullmatch(value):
        return float(value)
    return _UNSURE


def _plain_str(value: Any) -> Any:
    return value if type(value) is str else _UNSURE


def _convert(descriptor: Any, value: Any, param: Any, ctx: Any) -> Any:
    annotation, info = descriptor.annotation, descriptor.parameter_info
    if annotation is str:
        return _plain_str(value)
    if annotation is bool:
        return value if type(value) is bool else _UNSURE
    if annotation is int or annotation is float:
        number = _plain_int(value) if annotation is int else _plain_float(value)
        if number is _UNSURE:
            return _UNSURE
        if (info.min is not None and number < info.min) or (info.max is not None and number > info.max):
            return _UNSURE  # out of range: typer's adapter says so
        return number
    if annotation is Path:
        if type(value) is not str:
            return _UNSURE
        try:  # the adapter's Path is Path(str); checks (exists, file_okay, ...) are typer's own
            return coerce_cli_path(Path(value), info, path_type=Path, param=param, ctx=ctx)
        except Exception:
            return _UNSURE  # typer's adapter raises it again, with its own words
    if descriptor.is_list and annotation == list[str]:
        if isinstance(value, (list, tuple)) and all(type(item) is str for item in value):
            return list(value)
        return _UNSURE
    return _UNSURE


def _handled(descriptor: Any) -> bool:
    info = descriptor.parameter_info
    if info.parser is not None or descriptor.file_annotation is not None or descriptor.is_choice:
        return False
    if getattr(info, "clamp", False):
        return False
    annotation = descriptor.annotation
    if annotation is Path:
        return info.path_type is None
    return annotation in (str, bool, int, float) or annotation == list[str]


if RuntimeParam is not None:

    @dataclass(frozen=True)
    class PlainRuntimeParam(RuntimeParam):
        """A plain value converted here; any other handed to typer's adapter, built then."""

        descriptor: TypeDescriptor

        def _coerce_value(self, value: Any, param: _TyperParameter, ctx: Any) -> Any:
            done = _convert(self.descriptor, value, param, ctx)
            if done is not _UNSURE:
                return done
            return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)


def plain_coercion(param: Any) -> None:
    """A parameter whose type is plain converts its values here first (see the module's docstring)."""
    if RuntimeParam is None:  # pragma: no cover
        return
    descriptor = getattr(param, "type_descriptor", None)
    if (
        isinstance(param, _TyperParameter)
        and descriptor is not None
        and getattr(param, "_runtime_param", _UNSURE) is None
        and _handled(descriptor)
    ):
        param._runtime_param = PlainRuntimeParam(
            parameter_info=descriptor.parameter_info, annotation=descriptor.annotation, descriptor=descriptor
        )
