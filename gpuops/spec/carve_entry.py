"""The desired state in fleet.yaml: `carve:`, a list of GPU selections with the MIG layout, MPS
daemon settings and limiter tenant table each should have.

    carve:
      - select: {nodes: "gpu-a-*,zone=a", gpus: "0-3"}
        mig: {enabled: true, profiles: {"1g.10gb": 2, "3g.40gb": 1}}
      - select: {nodes: gpu-b-01, gpus: 0}
        mps: {enabled: true, active_thread_percentage: 50, pinned_memory_limit: 20GiB}
      - select: {nodes: "gpu-d-*", gpus: {model: MI300X}}
        partition: {compute: CPX, memory: NPS4}
      - select: {nodes: "gpu-c-*"}
        limiter:
          policy: fixed-share
          tenants: {vision: {memory: 20GiB, compute: 30%}, nlp: {compute: 70%, class: offline}}

This module holds the YAML shapes: the field types and the pydantic models (`CarveEntry`,
`MigSpec`, `MpsSpec`, `LimiterSpec`, `PartitionSpec`; each value on its own). What they resolve
to per GPU is in `desired.py` (`DesiredMig`, ...); the rules that need several values, the
teams, the nodes or the MIG catalog are in `carve_checks.py` (load time, run by `checks.py`),
`rules.py` (one GPU's combination of kinds) and `desired_gpu.py` (plan time, `Fleet.desired_for`). See
docs/fleet-yaml.md.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    WithJsonSchema,
    model_serializer,
    model_validator,
)

from gpuops.core.mig.catalog import MODELS, find_model, normalize_model_name
from gpuops.core.partition_catalog import COMPUTE_MODE_NAMES, MEMORY_MODE_NAMES, find_partition_model
from gpuops.core.units import UnitError, parse_bytes, parse_percent
from gpuops.spec.base import SpecModel
from gpuops.spec.errors import FieldProblem, show
from gpuops.spec.selectors import MAX_GPU_INDEX, SelectorError, parse_gpu_indices, parse_selector
from gpuops.spec.types import (
    REMOTE_PATH_RE,
    Flag,
    GpuKey,
    PoolName,
    TeamName,
    _choice_checker,
    _string,
    check_gpu_key,
    check_team_name,
    closest,
)

# ---- the MIG catalog, as names ----------------------------------------------------------------

PROFILE_MODELS: dict[str, tuple[str, ...]] = {}
"""Every GPU instance profile name of the catalog (and older drivers' names of the same
profile) -> the models that have it. Sizes differ between models under one name: look them up
on the model, never by name."""
for _model in MODELS.values():
    for _profile in _model.profiles:
        for _name in (_profile.name, *_profile.aliases):
            PROFILE_MODELS[_name] = (*PROFILE_MODELS.get(_name, ()), _model.key)

# +me, +me.all, -me, +gfx: the attributes of media-extension and graphics profiles
_ATTRS = r"(?:\+me|\+me\.all|-me|\+gfx)"
PROFILE_RE = re.compile(rf"^(\d+)g\.(\d+)gb{_ATTRS}?\Z")
CI_RE = re.compile(rf"^([1-7])c(?:\.(\d+g\.\d+gb{_ATTRS}?))?\Z")
CI_LEVEL_RE = re.compile(rf"^([1-7])c\.(\d+g\.\d+gb{_ATTRS}?)\Z")
PLACEMENT_RE = re.compile(r"^\s*([^@\s]+)\s*@\s*(\S+)\s*\Z")
UUID_RE = re.compile(r"^GPU-[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\Z")
MODEL_TEXT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9 ._+-]{0,62}\Z")

MAX_INSTANCES = 64  # more than any GPU has slices: the solver says how many fit
MAX_SIZE = 1024**4  # 1 TiB: more than any GPU's memory
MAX_TENANTS = 64  # the limiter's region holds 64 tenants per GPU (gpuops.node.limiter.MAX_TENANTS)
MIB = 1024**2

POLICIES = ("fixed-share", "burst-share", "best-effort")
CLASSES = ("online", "offline")
Policy = Literal["fixed-share", "burst-share", "best-effort"]
TenantClass = Literal["online", "offline"]

DEFAULT_MPS_PIPE_DIRECTORY = "/run/gpuops/mps"
DEFAULT_MPS_LOG_DIRECTORY = "/var/log/gpuops/mps"
ALL_TENANTS = "*"


def profile_hint(name: str) -> str:
    """How to write a profile that is not in the catalog: a did-you-mean, or where it goes."""
    ci = CI_LEVEL_RE.match(name)
    if ci:
        return f"compute-instance splits go under compute: ({ci.group(2)}: [{ci.group(1)}c, ...])"
    if name.isdigit():
        return "write the profile name (e.g. 3g.40gb): profile ids differ between models"
    sized = "" if name.lower() in PROFILE_MODELS else _nearest_sizes(name.lower())
    if sized:
        return sized
    guess = closest(name, list(PROFILE_MODELS)) or closest(name.lower(), list(PROFILE_MODELS))
    return guess or "gpuops mig profiles MODEL lists a model's profiles"


def _nearest_sizes(name: str) -> str:
    """For a well-formed name the catalog lacks (1g.11gb): the profiles of the same compute size
    and attributes nearest in memory, with the models that have them; '' when none. Spelling
    distance would offer 1g.18gb (an H200's) for 1g.11gb, where 1g.10gb and 1g.12gb are meant."""
    match = PROFILE_RE.match(name)
    if match is None:
        return ""
    asked = (match.group(1), name[match.end(2) + 2 :])  # compute slices, attributes (+me, ...)
    gaps: dict[str, int] = {}
    for known in PROFILE_MODELS:
        other = PROFILE_RE.match(known)
        if other and (other.group(1), known[other.end(2) + 2 :]) == asked:
            gaps[known] = abs(int(other.group(2)) - int(match.group(2)))
    if not gaps:
        return ""
    best = sorted(k for k, gap in gaps.items() if gap == min(gaps.values()))
    return "did you mean " + " or ".join(f"{k!r} ({_models_of(k)})" for k in best) + "?"


def _models_of(profile: str) -> str:
    models = PROFILE_MODELS[profile]
    return ", ".join(models[:3]) + (", ..." if len(models) > 3 else "")


def check_profile_name(value: Any) -> str:
    """A GPU instance profile name that some catalog model has: 1g.10gb, 3g.40gb, 1g.5gb+me."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _string(value, "a MIG profile name such as 3g.40gb")
    if text in PROFILE_MODELS:
        return text
    if PROFILE_RE.match(text) or CI_LEVEL_RE.match(text) or text.isdigit():
        raise FieldProblem(f"unknown MIG profile {show(text)}", profile_hint(text))
    raise FieldProblem(f"not a MIG profile name (got {show(text)})", profile_hint(text))


def check_ci_name(value: Any) -> str:
    """A compute-instance profile: 1c, 2c, 3c, 4c, 7c, or in full: 1c.3g.40gb."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    text = _string(value, "a compute-instance profile such as 1c")
    if CI_RE.match(text):
        return text
    raise FieldProblem(
        f"not a compute-instance profile (got {show(text)})", "1c, 2c, 3c, 4c or 7c (or in full: 1c.3g.40gb)"
    )


def parse_placement(text: str) -> tuple[str, int]:
    """'3g.40gb@4' -> ('3g.40gb', 4). Raises FieldProblem."""
    match = PLACEMENT_RE.match(text)
    if not match:
        raise FieldProblem(
            f"expected PROFILE@START (got {show(text)})", "e.g. 3g.40gb@4: the first memory slice it takes"
        )
    name, start = match.groups()
    check_profile_name(name)
    if not start.isdigit() or int(start) > 7:
        raise FieldProblem(
            f"the start of {name} must be a memory slice from 0 to 7 (got {show(start)})",
            "e.g. 3g.40gb@4; gpuops mig profiles MODEL shows the allowed starts",
        )
    return name, int(start)


def check_placement(value: Any) -> str:
    text = _string(value, "a placement such as 3g.40gb@4")
    name, start = parse_placement(text)
    return f"{name}@{start}"


def check_instance_count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldProblem(f"expected a number of instances (got {show(value)})")
    if not 0 <= value <= MAX_INSTANCES:
        raise FieldProblem(f"must be between 0 and {MAX_INSTANCES} (got {value})")
    return value


def _size(value: Any, what: str) -> int:
    if isinstance(value, bool) or value is None or not isinstance(value, (int, float, str)):
        raise FieldProblem(f"expected a size such as 20GiB (got {show(value)})")
    if isinstance(value, (int, float)) and value <= 0:
        raise FieldProblem(f"{what} must be more than 0 (got {show(value)})", "leave it out for no limit")
    if isinstance(value, (int, float)):
        raise FieldProblem(
            f"a size needs a unit (got {show(value)})", f"write e.g. {show(value)}GiB or {show(value)}MiB"
        )
    try:
        size = parse_bytes(value)
    except (UnitError, OverflowError, ValueError):
        raise FieldProblem(
            f"expected a size such as 20GiB or 512MiB (got {show(value)})",
            "units: KiB, MiB, GiB, TiB (powers of 1024); KB, MB, GB, TB (powers of 1000)",
        ) from None
    if size <= 0:
        raise FieldProblem(f"{what} must be more than 0 (got {show(value)})", "leave it out for no limit")
    if size > MAX_SIZE:
        raise FieldProblem(f"{what} of {show(value)} is more than any GPU's memory")
    return size


def check_memory_cap(value: Any) -> int:
    return _size(value, "a memory cap")


def check_pinned_limit(value: Any) -> int:
    size = _size(value, "a pinned memory limit")
    if size % MIB:
        raise FieldProblem(
            f"MPS takes whole MiB (got {show(value)})",
            f"e.g. {size // MIB}MiB; set_default_device_pinned_mem_limit accepts M or G values",
        )
    return size


def format_exact_bytes(value: int) -> str:
    """20 * 1024**3 -> '20GiB'; a text that reads back as exactly `value`."""
    for unit, factor in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= factor and value % factor == 0:
            return f"{value // factor}{unit}"
    return f"{value}B"


def check_thread_percentage(value: Any) -> int:
    """MPS active thread percentage: a whole percentage from 1 to 100 (50 or "50%")."""
    number: Any = value
    if isinstance(value, str) and re.fullmatch(r"\s*\d+\s*%?\s*", value):
        number = int(value.strip().rstrip("%"))
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    if isinstance(number, bool) or not isinstance(number, int):
        raise FieldProblem(f"expected a whole percentage from 1 to 100 (got {show(value)})", "e.g. 50 or 50%")
    if number == 0:
        raise FieldProblem(
            "must be between 1 and 100 (got 0)",
            "0% would leave MPS clients no threads at all; leave it out for the default 100",
        )
    if not 1 <= number <= 100:
        raise FieldProblem(
            f"must be between 1 and 100 (got {number})",
            "it is the share of the GPU's (or MIG instance's) SMs one MPS client may use",
        )
    return number


def check_compute_share(value: Any) -> float:
    """Limiter compute share: "30%" or 30, more than 0 and at most 100."""
    if isinstance(value, bool) or value is None or not isinstance(value, (int, float, str)):
        raise FieldProblem(f"expected a percentage such as 30% (got {show(value)})")
    try:
        share = parse_percent(value)
    except (UnitError, ValueError):
        if isinstance(value, (int, float)) or re.fullmatch(r"\s*-?\d+(\.\d+)?\s*%?\s*", str(value)):
            raise FieldProblem(f"must be more than 0% and at most 100% (got {show(value)})") from None
        raise FieldProblem(f"expected a percentage such as 30% (got {show(value)})") from None
    if share <= 0:
        raise FieldProblem(
            f"must be more than 0% (got {show(value)})", "leave compute out (policy best-effort) for no share"
        )
    if share * 10 < 1:
        raise FieldProblem(
            f"the limiter counts shares in tenths of a percent (got {show(value)})", "e.g. 0.5%"
        )
    return share


def format_share(value: float) -> str:
    text = repr(float(value))
    return (text[:-2] if text.endswith(".0") else text) + "%"


def check_node_selector(value: Any) -> str:
    text = _string(value, "a node selector such as gpu-a-*,zone=a")
    try:
        parse_selector(text)
    except SelectorError as exc:
        raise FieldProblem(
            str(exc), "node-name globs (gpu-a-*) and label terms (zone=a, zone!=b), comma-separated"
        ) from None
    return text


def check_gpu_uuid(value: Any) -> str:
    text = _string(value, "a GPU UUID")
    if not UUID_RE.match(text):
        hint = "MIG instances are not selected one by one" if text.startswith("MIG-") else ""
        raise FieldProblem(
            f"not a GPU UUID (got {show(text)})", hint or "as nvidia-smi -L shows it: GPU-8f2c3d4e-...."
        )
    return text


def check_gpu_model(value: Any) -> str:
    """A GPU model: a catalog model (any spelling, stored as its key) or another model's name."""
    text = _string(value, "a GPU model such as H100-80GB")
    found = find_model(text)
    if found is not None:
        return found.key
    amd = find_partition_model(text)
    if amd is not None:
        return amd.key
    if not MODEL_TEXT_RE.match(text) or not normalize_model_name(text):
        raise FieldProblem(f"not a GPU model name (got {show(text)})", "e.g. H100-80GB, A100-80GB, L40S")
    short = normalize_model_name(text)
    prefixed = sorted(m.key for m in MODELS.values() if normalize_model_name(m.key).startswith(short + "-"))
    if prefixed:
        raise FieldProblem(
            f"ambiguous GPU model {show(text)}", f"name the memory size too: {', '.join(prefixed)}"
        )
    return text


def _as_list(value: Any) -> Any:
    return [value] if isinstance(value, str) else value


def check_tenant_key(value: Any) -> str:
    if value == ALL_TENANTS:
        return ALL_TENANTS
    return check_team_name(value)


def check_directory(value: Any) -> str:
    text = _string(value, "an absolute directory on the node")
    if not text.startswith("/") or not REMOTE_PATH_RE.match(text) or "/../" in f"{text}/" or len(text) > 200:
        raise FieldProblem(
            f"not a usable absolute directory (got {show(text)})",
            "an absolute path of letters, digits and _ . / + @ = , - (e.g. /run/gpuops/mps)",
        )
    return text.rstrip("/") or "/"


_SIZE_OUT = PlainSerializer(format_exact_bytes, return_type=Any, when_used="json")
_SIZE_SCHEMA = WithJsonSchema(
    {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*([KMGT]i?B?|[kmgt]|B)\s*$", "examples": ["20GiB"]}
)

ProfileName = Annotated[
    str,
    BeforeValidator(check_profile_name),
    WithJsonSchema({"type": "string", "enum": sorted(PROFILE_MODELS)}),
]
ComputeName = Annotated[
    str, BeforeValidator(check_ci_name), WithJsonSchema({"type": "string", "pattern": CI_RE.pattern})
]
PlacementText = Annotated[
    str,
    BeforeValidator(check_placement),
    WithJsonSchema({"type": "string", "pattern": r"^\d+g\.\d+gb(\+me)?@[0-7]$", "examples": ["3g.40gb@4"]}),
]
InstanceCount = Annotated[
    int,
    BeforeValidator(check_instance_count),
    WithJsonSchema({"type": "integer", "minimum": 0, "maximum": MAX_INSTANCES}),
]
MemoryCap = Annotated[int, BeforeValidator(check_memory_cap), _SIZE_OUT, _SIZE_SCHEMA]
PinnedLimit = Annotated[int, BeforeValidator(check_pinned_limit), _SIZE_OUT, _SIZE_SCHEMA]
ThreadPercentage = Annotated[
    int,
    BeforeValidator(check_thread_percentage),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1, "maximum": 100},
                {"type": "string", "pattern": r"^\s*\d+\s*%?\s*$"},
            ]
        }
    ),
]
ComputeShare = Annotated[
    float,
    BeforeValidator(check_compute_share),
    PlainSerializer(format_share, return_type=Any, when_used="json"),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "number", "exclusiveMinimum": 0, "maximum": 100},
                {"type": "string", "pattern": r"^\s*\d+(\.\d+)?\s*%?\s*$"},
            ],
            "examples": ["30%"],
        }
    ),
]
NodeSelectorText = Annotated[
    str,
    BeforeValidator(check_node_selector),
    WithJsonSchema({"type": "string", "examples": ["gpu-a-*,zone=a", "*"]}),
]
GpuUuid = Annotated[
    str, BeforeValidator(check_gpu_uuid), WithJsonSchema({"type": "string", "pattern": UUID_RE.pattern})
]
GpuModelName = Annotated[
    str, BeforeValidator(check_gpu_model), WithJsonSchema({"type": "string", "examples": sorted(MODELS)})
]
TenantKey = Annotated[
    str,
    BeforeValidator(check_tenant_key),
    WithJsonSchema({"type": "string", "description": "a team name, or * for tenants without an entry"}),
]
Directory = Annotated[str, BeforeValidator(check_directory), WithJsonSchema({"type": "string"})]
PolicyField = Annotated[Policy, BeforeValidator(_choice_checker(POLICIES))]
ClassField = Annotated[TenantClass, BeforeValidator(_choice_checker(CLASSES))]


def _mode_checker(names: tuple[str, ...], what: str, example: str) -> Any:
    def check(value: Any) -> str:
        text = _string(value, f"a {what} partition mode such as {example}")
        if text in names:
            return text
        if text.upper() in names:
            raise FieldProblem(f"write the mode in capitals: {text.upper()} (got {show(text)})")
        raise FieldProblem(
            f"not a {what} partition mode (got {show(text)})",
            closest(text.upper(), list(names)) or "one of " + ", ".join(names),
        )

    return check


ComputeMode = Annotated[
    str,
    BeforeValidator(_mode_checker(COMPUTE_MODE_NAMES, "compute", "CPX")),
    WithJsonSchema({"type": "string", "enum": list(COMPUTE_MODE_NAMES)}),
]
MemoryMode = Annotated[
    str,
    BeforeValidator(_mode_checker(MEMORY_MODE_NAMES, "memory", "NPS4")),
    WithJsonSchema({"type": "string", "enum": list(MEMORY_MODE_NAMES)}),
]


# ---- models -------------------------------------------------------------------------------------


def _gpu_shorthand(value: Any) -> Any:
    """gpus: 3 | "0-3" | GPU-UUID | [0, 1] | [GPU-..., GPU-...] | {model: ..., indices: ..., uuids: [...]}."""
    if value is None or isinstance(value, dict):
        return value
    if isinstance(value, bool):
        raise FieldProblem("expected GPU indices, UUIDs or {model: ...} (got a true/false)")
    if isinstance(value, int):
        check_gpu_key(value)
        return {"indices": str(value)}
    if isinstance(value, str):
        items = [part.strip() for part in value.split(",")]
        if any(part.upper().startswith(("GPU-", "MIG-")) for part in items):
            return {"uuids": [check_gpu_uuid(part) for part in items]}
        check_gpu_key(value)
        return {"indices": value}
    if isinstance(value, list):
        if not value:
            raise FieldProblem("no GPUs listed", "leave gpus out to select every GPU of the nodes")
        if all(isinstance(v, str) and v.upper().startswith(("GPU-", "MIG-")) for v in value):
            return {"uuids": [check_gpu_uuid(v) for v in value]}
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            text = ",".join(str(v) for v in value)
            try:
                parse_gpu_indices(text)
            except SelectorError as exc:
                raise FieldProblem(str(exc), f"GPU indices from 0 to {MAX_GPU_INDEX}") from None
            return {"indices": text}
        raise FieldProblem(
            "a GPU list holds indices or UUIDs, one kind", "e.g. [0, 1] or [GPU-8f2c..., GPU-1a2b...]"
        )
    raise FieldProblem(f"expected GPU indices, UUIDs or {{model: ...}} (got {show(value)})")


def _gpus_schema(schema: dict[str, Any]) -> None:
    """The short forms (3, "0-3", [0, 1], a UUID or a list of them) are valid too."""
    mapping = {k: v for k, v in schema.items() if k not in ("title", "description")}
    for key in mapping:
        del schema[key]
    schema["anyOf"] = [
        mapping,
        {"type": "integer", "minimum": 0, "maximum": MAX_GPU_INDEX},
        {"type": "string", "description": "GPU indices (3, 0-3, 4,5) or GPU UUIDs, comma-separated"},
        {"type": "array", "items": {"type": ["integer", "string"]}},
    ]


class GpuSelect(SpecModel):
    """Which GPUs of the selected nodes: by index, by UUID, by model, or a model and indices."""

    model_config = ConfigDict(json_schema_extra=_gpus_schema)

    indices: GpuKey | None = None
    """GPU indices as NVML numbers them: 3, "0-3", "4,5", "0-1,6"."""
    uuids: list[GpuUuid] | None = None
    """GPU UUIDs as nvidia-smi -L shows them."""
    model: (
        Annotated[
            list[GpuModelName],
            BeforeValidator(_as_list),
            WithJsonSchema(
                {
                    "anyOf": [
                        {"type": "string", "examples": sorted(MODELS)},
                        {"type": "array", "items": {"type": "string"}},
                    ]
                }
            ),
        ]
        | None
    ) = None
    """GPU model(s): H100-80GB, A100-80GB (any spelling gpuops mig models accepts), or another
    model's name (L40S). With indices: those GPUs, when they are of that model."""

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        return _gpu_shorthand(data)

    @model_serializer(mode="wrap")
    def _short(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        data = handler(self)
        if info.mode_is_json() and isinstance(data, dict):
            given = {k: v for k, v in data.items() if v is not None}
            if list(given) == ["indices"]:
                return given["indices"]
            if list(given) == ["uuids"]:
                return given["uuids"]
            if list(given) == ["model"] and len(given["model"]) == 1:
                return {"model": given["model"][0]}
        return data


class Select(SpecModel):
    """The GPUs an entry applies to: the selected nodes' GPUs, all of them or those of `gpus`."""

    nodes: NodeSelectorText = "*"
    """Node selector: name globs and label terms, comma-separated (gpu-a-*,zone=a). Default * (all)."""
    gpus: GpuSelect | None = None
    """GPU indices ("0-3"), UUIDs, or {model: H100-80GB}. Default: every GPU of the nodes."""


class MigSpec(SpecModel):
    """MIG mode and layout: instance counts or explicit placements, with compute-instance splits."""

    enabled: Flag
    """MIG mode. false: MIG off (no instances)."""
    profiles: dict[ProfileName, InstanceCount] | None = None
    """GPU instances by profile: {"1g.10gb": 2, "3g.40gb": 1}; the solver places them. {} = none.
    Leave out (with placements) to set the mode only and keep the instances as they are."""
    placements: list[PlacementText] | None = None
    """Explicit placements PROFILE@START (start in memory slices): ["3g.40gb@4", "1g.10gb@0"]."""
    compute: dict[ProfileName, list[ComputeName]] = Field(default_factory=dict)
    """Compute-instance split of every instance of a GPU instance profile:
    {"3g.40gb": [1c, 1c, 1c]}. Default: one compute instance taking the whole GPU instance."""


class MpsTenantSpec(SpecModel):
    """MPS values for one team's MPS server (its users' clients)."""

    active_thread_percentage: ThreadPercentage | None = None
    """Share of the SMs one client may use, 1 to 100."""
    pinned_memory_limit: PinnedLimit | None = None
    """Device memory one client may pin (allocate), e.g. 10GiB."""


class MpsSpec(SpecModel):
    """An MPS control daemon per GPU, or per MIG instance when MIG is on."""

    enabled: Flag
    """Run the MPS control daemon(s). false: stop them."""
    active_thread_percentage: ThreadPercentage | None = None
    """Default share of the SMs one client may use, 1 to 100 (MPS default 100)."""
    pinned_memory_limit: PinnedLimit | None = None
    """Default device memory one client may pin, e.g. 20GiB (MPS default: no limit)."""
    per_tenant: dict[TeamName, MpsTenantSpec] = Field(default_factory=dict)
    """Per-team values, for the MPS server of the team's users: {nlp: {active_thread_percentage: 30}}."""
    pipe_directory: Directory | None = None
    """Where the daemons' pipe directories go, one per GPU or MIG instance (<dir>/<UUID>).
    Default /run/gpuops/mps."""
    log_directory: Directory | None = None
    """Where their log directories go (<dir>/<UUID>). Default /var/log/gpuops/mps."""


class LimiterTenantSpec(SpecModel):
    """One tenant's line in the limiter's tenant table."""

    model_config = ConfigDict(serialize_by_alias=True)

    memory: MemoryCap | None = None
    """GPU memory cap of the tenant on each selected GPU, e.g. 20GiB. Default: no cap."""
    compute: ComputeShare | None = None
    """Compute share: a cap under fixed-share, a guarantee under burst-share, e.g. 30%."""
    policy: PolicyField | None = None
    """This tenant's policy, overriding the entry's."""
    klass: ClassField = Field(default="online", alias="class")
    """online (default), or offline: yields the GPU to online tenants."""


class LimiterSpec(SpecModel):
    """The interception limiter's tenant table on the selected GPUs."""

    enabled: Flag = True
    """false: no limiter lines for these GPUs."""
    policy: PolicyField | None = None
    """fixed-share (shares are caps), burst-share (shares are guarantees, idle time is lent out) or
    best-effort (no share). Default: fixed-share for a tenant with a compute share, else best-effort."""
    tenants: dict[TenantKey, LimiterTenantSpec] = Field(default_factory=dict)
    """Teams (or * for every tenant without an entry) and their memory cap, share and class."""


class PartitionSpec(SpecModel):
    """Partition modes of GPUs split by modes (AMD Instinct MI300 class): the compute partition
    (logical GPUs) and the memory partition (NUMA memory pools). Either may be left out: kept."""

    compute: ComputeMode | None = None
    """SPX (one logical GPU), DPX (2), TPX (3, MI300A), QPX (4) or CPX (8 on MI300X, 6 on MI300A)."""
    memory: MemoryMode | None = None
    """NPS1 (one memory pool) or NPS4 (four; MI300X)."""


class CarveEntry(SpecModel):
    """Desired state of a GPU selection. Entries apply in order: for each of mig, mps, limiter and
    partition, a later entry overrides an earlier one on the GPUs both select."""

    select: Select
    """The GPUs: {nodes: "gpu-a-*,zone=a", gpus: "0-3"}."""
    mig: MigSpec | None = None
    mps: MpsSpec | None = None
    limiter: LimiterSpec | None = None
    partition: PartitionSpec | None = None
    """AMD partition modes: {compute: CPX, memory: NPS4}. GPUs without modes are skipped when
    selected by node or model; naming one by index or UUID is an error."""
    pool: PoolName | None = None
    """Set by `gpuops rebalance` on the entries that carve a pool's GPUs: it rewrites them when it
    plans that pool again (docs/pools.md). Otherwise an entry like any other."""


KINDS = ("mig", "mps", "limiter", "partition")


def entry_data(entry: CarveEntry | SpecModel) -> dict[str, Any]:
    """A carve entry (or one of its settings) built in code as fleet.yaml data: the fields it was
    built with, in the file's forms (sizes `20GiB`, shares `30%`, a GPU selection's short form
    `"0-3"`, `class:`). The writers of fleet.yaml (`gpuops export`, `gpuops rebalance` and the
    Pool screen, `apply --plan`'s checks of a saved plan) build typed entries with values (bytes,
    percentages), usually with `model_construct`, and write them with this; what they write is
    then loaded, and checked, as any fleet.yaml is."""
    data: dict[str, Any] = entry.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude_none=True)
    return data


__all__ = [
    "ALL_TENANTS",
    "CLASSES",
    "DEFAULT_MPS_LOG_DIRECTORY",
    "DEFAULT_MPS_PIPE_DIRECTORY",
    "KINDS",
    "POLICIES",
    "PROFILE_MODELS",
    "CarveEntry",
    "GpuSelect",
    "LimiterSpec",
    "LimiterTenantSpec",
    "MigSpec",
    "MpsSpec",
    "MpsTenantSpec",
    "PartitionSpec",
    "Select",
    "entry_data",
    "format_exact_bytes",
    "parse_placement",
]
