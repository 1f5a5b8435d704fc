"""The limiter's tenant table as text: one line per tenant, the format both sides share.

``TenantSpec`` is the limiter line from fleet.yaml to the node: the operator side resolves
fleet.yaml's tenants to it (spec/desired.py), plans, saves and sends it (plan/, the
`limiter_apply` request of core/protocol.py, carried by core/codec.py, whose JSON calls `klass`
"class"); the node side (node/limiter.py) writes the lines as ``<dir>/tenants`` and reads them
back for the `config` reply, and the C library (native/src/config.c) reads them with the same
rules (`validate`, which the codec runs on every line it decodes). Pure: no I/O. Valid Python
3.8 (runs on GPU nodes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpuops.core.units import UnitError, parse_bytes, parse_percent

TABLE_HEADER = "gpuops-limiter-table 1"

POLICIES = ("best-effort", "fixed-share", "burst-share")  # index = value in the region
CLASSES = ("online", "offline")

_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,63}\Z")


class LimiterError(ValueError):
    """A tenant table or region could not be read or written; the message says why, and `field`
    which field of a line it is about (its JSON key), when it is one."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


@dataclass(frozen=True, order=True)
class TenantSpec:
    """One line of the tenant table.  name '*' applies to tenants without a line of their own.

    A GPU's lines in a plan have no `gpus` (they are that GPU's); the node's table lists the
    GPUs of a line by UUID (plan/apply.py compose_table), or none for every GPU."""

    name: str
    memory: Optional[int] = None  # bytes; None = no cap, 0 = every allocation refused
    compute: Optional[float] = None  # percent; None = no share
    policy: Optional[str] = None  # fixed-share | burst-share | best-effort (default from compute)
    klass: str = field(default="online", metadata={"json": "class"})
    gpus: Tuple[str, ...] = ()  # indices or UUIDs; () = every GPU

    _json_unknown = "unknown key"  # core/codec.py: how its errors call a key it does not know

    def __post_init__(self) -> None:
        if self.policy is None:  # the library's default, made explicit
            object.__setattr__(self, "policy", self.effective_policy())

    def check(self) -> None:
        """What core/codec.py runs on every line it decodes (a request, a config reply, a saved
        plan): the table's own rules, each problem located at its field."""
        try:
            self.validate()
        except LimiterError as exc:
            raise ValueError(str(exc), *([exc.field] if exc.field else [])) from None

    def applies_to(self, index: int, uuid: str) -> bool:
        """Whether the line applies to the GPU with this index and UUID."""
        return not self.gpus or str(index) in self.gpus or uuid in self.gpus

    def sort_key(self) -> Tuple[Any, ...]:
        """The order of a GPU's lines (by tenant, then values; None before any value)."""
        return (
            self.name,
            self.memory is not None,
            self.memory or 0,
            self.compute is not None,
            self.compute or 0.0,
            self.effective_policy(),
            self.klass,
            self.gpus,
        )

    def effective_policy(self) -> str:
        if self.policy:
            return self.policy
        return "fixed-share" if self.compute else "best-effort"

    def validate(self) -> None:
        if self.name != "*" and not _NAME_RE.match(self.name):
            raise LimiterError(
                "tenant name %r: use 1-63 letters, digits, '.', '_' or '-'" % (self.name,), "name"
            )
        if self.memory is not None and self.memory < 0:
            raise LimiterError("tenant %s: memory must not be negative" % self.name, "memory")
        if self.compute is not None and not 0 < self.compute <= 100:
            raise LimiterError("tenant %s: compute must lie in (0, 100]%%" % self.name, "compute")
        if self.policy is not None and self.policy not in POLICIES:
            raise LimiterError(
                "tenant %s: policy %r is not one of %s" % (self.name, self.policy, ", ".join(POLICIES)),
                "policy",
            )
        if self.klass not in CLASSES:
            raise LimiterError("tenant %s: class must be online or offline" % self.name, "class")
        if self.effective_policy() != "best-effort" and not self.compute:
            raise LimiterError("tenant %s: %s needs a compute share" % (self.name, self.effective_policy()))
        for gpu in self.gpus:
            if not gpu or "," in gpu or " " in gpu:
                raise LimiterError("tenant %s: bad GPU reference %r" % (self.name, gpu), "gpus")

    def line(self) -> str:
        parts = ["tenant", self.name]
        if self.memory is not None:
            parts.append("memory=%d" % self.memory)
        if self.compute is not None:
            parts.append("compute=%s" % ("%.3f" % self.compute).rstrip("0").rstrip("."))
        parts.append("policy=%s" % self.effective_policy())
        parts.append("class=%s" % self.klass)
        if self.gpus:
            parts.append("gpus=%s" % ",".join(self.gpus))
        return " ".join(parts)


def format_table(specs: Sequence[TenantSpec], generation: int) -> str:
    seen = set()
    lines = [
        "# written by gpuops; edits are replaced by the agent",
        TABLE_HEADER,
        "generation %d" % generation,
    ]
    for spec in specs:
        spec.validate()
        key = (spec.name, spec.gpus)
        if key in seen:
            raise LimiterError("tenant %s appears twice for the same GPUs" % spec.name)
        seen.add(key)
        lines.append(spec.line())
    return "\n".join(lines) + "\n"


def parse_table(text: str) -> Tuple[int, List[TenantSpec]]:
    """The table's generation and lines; LimiterError('line N: ...') on anything malformed,
    following the same rules as the library (which then keeps its last good table)."""
    if text and not text.endswith("\n"):
        # what a reader sees of a file caught half-written
        raise LimiterError("line %d: last line incomplete (no newline): truncated" % (text.count("\n") + 1))
    generation = 0
    specs: List[TenantSpec] = []
    header = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if not header:
            if " ".join(words) != TABLE_HEADER:
                raise LimiterError("line %d: expected %r" % (lineno, TABLE_HEADER))
            header = True
            continue
        if words[0] == "generation" and len(words) == 2 and words[1].isdigit():
            generation = int(words[1])
            continue
        if words[0] != "tenant" or len(words) < 2:
            raise LimiterError("line %d: expected 'tenant NAME key=value...'" % lineno)
        values: Dict[str, str] = {}
        for kv in words[2:]:
            key, sep, value = kv.partition("=")
            if not sep or not value or key not in ("memory", "compute", "policy", "class", "gpus"):
                raise LimiterError("line %d: bad setting %r" % (lineno, kv))
            values[key] = value
        try:
            memory = parse_bytes(values["memory"]) if "memory" in values else None
            compute = parse_percent(values["compute"]) if "compute" in values else None
        except UnitError as exc:
            raise LimiterError("line %d: %s" % (lineno, exc)) from None
        spec = TenantSpec(
            name=words[1],
            memory=memory,
            compute=compute if compute else None,
            policy=values.get("policy"),
            klass=values.get("class", "online"),
            gpus=tuple(values["gpus"].split(",")) if "gpus" in values else (),
        )
        try:
            spec.validate()
        except LimiterError as exc:
            raise LimiterError("line %d: %s" % (lineno, exc)) from None
        specs.append(spec)
    if not header:
        raise LimiterError("empty tenant table (no %r line)" % TABLE_HEADER)
    return generation, specs
