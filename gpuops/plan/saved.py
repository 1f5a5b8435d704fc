"""Saved plan files: `gpuops plan -o plan.json` writes one, `gpuops apply --plan` reads it.

The document carries `"digest": "sha256:<hex>"`, the SHA-256 of its canonical JSON without that
key (keys sorted, no spaces, ASCII escapes; the fleet.yaml path and digest, the live state it was
made from, the payloads and their description are all covered). Apply refuses a file whose digest
does not match (EditedPlanError): a plan edited after it was reviewed is not applied. The digest
catches edits and damage; it is no signature, so what apply shows is still rendered from the
payloads that run (plan/apply.py), never from the file's own description of them.

Reading never raises anything but PlanError, with one line that says where: `plan.json:3:14:` for
text that is not UTF-8 or JSON, NaN or infinite numbers (JSON has none) and nesting deeper than any
plan has; the field's path for the rest (plan/document.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpuops.core.atomic_file import atomic_write
from gpuops.plan.document import plan_from_json
from gpuops.plan.model import PayloadError, Plan, PlanError

DIGEST_KEY = "digest"
DIGEST_PREFIX = "sha256:"
MAX_DEPTH = 32  # a plan nests about 10 deep (nodes, GPUs, live MPS daemons, their tenants)


class EditedPlanError(PlanError):
    """The file's contents are not what `gpuops plan -o` wrote (digest missing or different)."""


def document_digest(document: dict[str, Any]) -> str:
    body = {k: v for k, v in document.items() if k != DIGEST_KEY}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return DIGEST_PREFIX + hashlib.sha256(text.encode("ascii")).hexdigest()


def plan_document(plan: Plan) -> dict[str, Any]:
    """The plan as saved and as `gpuops plan --json` prints it: its JSON with its digest."""
    document = plan.to_json()
    try:
        document[DIGEST_KEY] = document_digest(document)
    except ValueError as exc:  # a NaN that came from a node: a plan no one could read back
        raise PlanError(f"the plan holds a number JSON cannot write ({exc})") from None
    return document


def save_plan(path: Path, plan: Plan) -> None:
    """Write the plan to `path`, 0600 and atomically; raises PlanError or OSError."""
    text = json.dumps(plan_document(plan), indent=2, allow_nan=False) + "\n"
    atomic_write(path, text)  # 0600: it names hosts, users, processes and every GPU's layout


# ---- reading -------------------------------------------------------------------------------------

# JSON's tokens that matter for locating a problem: strings (skipped whole, so nothing inside one
# is taken for a number or a bracket), numbers and the non-JSON constants, and brackets.
_TOKENS = re.compile(
    r'"(?:[^"\\]|\\.)*"|(-?Infinity|NaN|-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?)|([\[{])|([\]}])', re.DOTALL
)


class _NotFinite(ValueError):
    pass


def _reject_constant(token: str) -> Any:
    raise _NotFinite(token)


def _finite(token: str) -> float:
    value = float(token)
    if not math.isfinite(value):
        raise _NotFinite(token)
    return value


def _position(text: str, offset: int) -> str:
    line = text.count("\n", 0, offset) + 1
    column = offset - (text.rfind("\n", 0, offset) + 1) + 1
    return f"{line}:{column}"


def _number_problem(token: str) -> str:
    if token in ("NaN", "Infinity", "-Infinity"):
        return f"{token} is not a JSON number"
    if any(c in token for c in ".eE") and not math.isfinite(float(token)):
        return f"{token} is out of range"
    return ""


def _locate(text: str, source: str) -> PlanError:
    """The first non-finite number or over-deep bracket of `text`, as a located error."""
    depth = 0
    for match in _TOKENS.finditer(text):
        number, opening, closing = match.groups()
        if number is not None:
            problem = _number_problem(number)
            if problem:
                return PlanError(f"{source}:{_position(text, match.start())}: {problem}")
        elif opening is not None:
            depth += 1
            if depth > MAX_DEPTH:
                return PlanError(
                    f"{source}:{_position(text, match.start())}: nested deeper than {MAX_DEPTH} levels"
                )
        elif closing is not None:
            depth -= 1
    return PlanError(f"{source}: not a JSON document a plan can be")


def _walk(value: Any, path: str, depth: int = 0) -> Iterator[tuple[Any, str, int]]:
    """Every value of a parsed document with its path and depth, without recursion."""
    stack = [(value, path, depth)]
    while stack:
        item, at, level = stack.pop()
        yield item, at, level
        if isinstance(item, dict):
            stack += [(v, f"{at}.{k}" if at else str(k), level + 1) for k, v in item.items()]
            stack += [(k, f"{at} (a key)", level + 1) for k in item]
        elif isinstance(item, list):
            stack += [(v, f"{at}[{i}]", level + 1) for i, v in enumerate(item)]


def _check_values(document: Any, text: str, source: str) -> None:
    for value, at, depth in _walk(document, ""):
        if depth > MAX_DEPTH:
            raise _locate(text, source)
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise PlanError(
                    f"{source}: {at or 'the document'}: a string with a lone surrogate escape"
                ) from None


def parse_plan(data: bytes, source: str) -> Plan:
    """A saved plan's bytes read back and checked, its digest included; raises PlanError."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise PlanError(f"{source}:{line}:{column}: not UTF-8 text") from None
    try:
        document = json.loads(text, parse_constant=_reject_constant, parse_float=_finite)
    except json.JSONDecodeError as exc:
        raise PlanError(f"{source}:{exc.lineno}:{exc.colno}: not JSON ({exc.msg})") from None
    except (_NotFinite, RecursionError):
        raise _locate(text, source) from None
    except ValueError as exc:  # an integer longer than Python reads (4300 digits)
        raise PlanError(f"{source}: not JSON ({exc})") from None
    _check_values(document, text, source)
    refused: PayloadError | None = None
    try:
        plan = plan_from_json(document, source)
    except PayloadError as exc:  # said once the digest is known to match
        refused = exc
    stored = document.get(DIGEST_KEY)
    if not isinstance(stored, str) or not stored.startswith(DIGEST_PREFIX):
        raise EditedPlanError(f'{source}: has no "digest": not a file gpuops plan -o wrote; nothing applied')
    if stored != document_digest(document):
        raise EditedPlanError(
            f"{source}: changed since it was saved (its digest does not match); nothing applied"
            " (make a new plan: gpuops plan FLEET -o FILE)"
        )
    if refused is not None:
        raise refused
    return plan


def read_plan(path: Path) -> Plan:
    """The saved plan at `path`; a relative fleet.yaml path in it is taken from the plan's own
    directory (gpuops writes it absolute). Raises PlanError."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise PlanError(f"{path}: {exc.strerror or exc}") from None
    plan = parse_plan(data, str(path))
    if plan.fleet_file and not Path(plan.fleet_file).is_absolute():
        return replace(plan, fleet_file=str(path.parent / plan.fleet_file))
    return plan
