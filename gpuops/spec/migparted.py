"""`gpuops import mig-parted`: a mig-parted v1 config (one of its labels) as fleet.yaml `carve:`
entries.

The file is read the way nvidia-mig-parted reads it (api/spec/v1): `version: v1`, `mig-configs`
with at least one label and at least one spec per label, each spec with `devices` (`all` or a
list of indices), `mig-enabled`, `mig-devices` (required when enabled, empty when not; counts of
GI-level `3g.40gb` or CI-level `1c.3g.40gb` profiles, not all 0) and an optional
`device-filter` (PCI ids `0xDDDDVVVV`, mapped to gpuops' catalog models). Unknown keys are
refused. Every mistake is one located line, as for fleet.yaml.

The file may also be Kubernetes manifests (the GPU operator's default ConfigMap, mig-parted's
DaemonSet examples): the ConfigMap data entry that holds `mig-configs:` is read, and mistakes are
located in the manifest file.

Only the label converted is checked against gpuops' catalog (the others only for what
mig-parted itself would refuse), as mig-parted only ever looks at the selected one. Inside it, a
spec whose device-filter names no GPU in gpuops' catalog, or only GPUs without MIG, is left out
with one warning naming the ids (mig-parted skips specs whose filter matches no GPU present).

mig-parted applies the specs in order, so on a GPU that two specs select the later one wins:
exactly what `carve:` does. CI-level profiles are grouped into GPU instances as mig-parted's
apply does (consecutive compute instances of one GI profile share an instance while they fit).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.nodes import MappingNode, ScalarNode

from gpuops.core.mig.catalog import (
    MODELS,
    NON_MIG_PCI_DEVICES,
    NVIDIA_VENDOR_ID,
    MigModel,
    model_for_pci_device_id,
)
from gpuops.spec.carve_entry import CI_LEVEL_RE, MigSpec
from gpuops.spec.desired import desired_mig
from gpuops.spec.dump import dump_yaml, flow
from gpuops.spec.errors import DataPath, SpecError, SpecIssue, show
from gpuops.spec.mig_solve import place_compute_instances, solve_layout
from gpuops.spec.selectors import SelectorError, format_gpu_indices, parse_selector
from gpuops.spec.source import Document, parse_yaml
from gpuops.spec.types import closest

VERSION = "v1"
_SPEC_KEYS = ("devices", "device-filter", "mig-enabled", "mig-devices")
_FILTER_RE = re.compile(r"^\s*(0[xX][0-9a-fA-F]{1,8}|\d{1,10})(?::(0[xX][0-9a-fA-F]{1,8}|\d{1,10}))?\s*\Z")
# mig-parted's profile syntax (go-nvlib ParseMigProfile): [Cc.]Gg.MMgb, then +attr,... or -attr,...
_GI_RE = re.compile(r"^(\d+)g\.\d+gb(?:[+-][A-Za-z][A-Za-z0-9.]*(?:,[A-Za-z][A-Za-z0-9.]*)*)?\Z")


@dataclass
class Imported:
    """The carve entries (plain data, as fleet.yaml holds them) and what the conversion left out."""

    label: str
    entries: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[SpecIssue] = field(default_factory=list)


class _Reader:
    def __init__(self, doc: Document) -> None:
        self.doc = doc
        self.issues: list[SpecIssue] = list(doc.issues)
        self.warnings: list[SpecIssue] = []

    def error(self, path: DataPath, message: str, hint: str = "", *, at_key: bool = False) -> None:
        self.issues.append(self.doc.issue(path, message, hint, at_key=at_key))

    def warn(self, path: DataPath, message: str, hint: str = "") -> None:
        self.warnings.append(self.doc.issue(path, message, hint))


def read_mig_parted(
    text: str, file: str = "<mig-parted>", label: str | None = None, *, nodes: str = "*"
) -> Imported:
    """The spec list of `label` (the file's only label when None) as carve entries selecting
    `nodes`. Raises SpecError with every mistake, located."""
    r, configs, specs = _read_file(text, file, nodes)
    chosen = _choose(r, configs, label)
    if r.issues or chosen is None:
        raise SpecError(r.issues or [SpecIssue(file, 0, 0, "", "nothing to import")])
    out = _convert_label(r, chosen, specs[chosen], nodes)
    if r.issues:
        raise SpecError(r.issues)
    return out


def read_mig_parted_all(text: str, file: str = "<mig-parted>", *, nodes: str = "*") -> list[Imported]:
    """Every label of the file, in file order, each as its own carve entries. Raises SpecError
    with the mistakes of every label."""
    r, configs, specs = _read_file(text, file, nodes)
    if r.issues:
        raise SpecError(r.issues)
    out = [_convert_label(r, name, specs[name], nodes) for name in configs]
    if r.issues:
        raise SpecError(r.issues)
    return out


def _read_file(
    text: str, file: str, nodes: str
) -> tuple[_Reader, dict[str, Any], dict[str, list[dict[str, Any]]]]:
    try:
        parse_selector(nodes)
    except SelectorError as exc:
        raise SpecError([SpecIssue("--nodes", 0, 0, "", str(exc))]) from None
    doc = _parse_config(text, file)
    r = _Reader(doc)
    data = doc.data
    if r.issues:
        raise SpecError(r.issues)
    if not isinstance(data, dict):
        r.error((), f"expected a mig-parted config, a mapping (got {show(data)})", "start with 'version: v1'")
        raise SpecError(r.issues)
    configs = _read_top(r, data)
    specs: dict[str, list[dict[str, Any]]] = {}
    for name, value in configs.items():
        specs[name] = _read_label(r, name, value)
    return r, configs, specs


def _convert_label(r: _Reader, label: str, specs: list[dict[str, Any]], nodes: str) -> Imported:
    out = Imported(label)
    start = len(r.warnings)
    for j, spec in enumerate(specs):
        entry = _convert(r, ("mig-configs", label, j), spec, nodes)
        if entry is not None:
            out.entries.append(entry)
    out.warnings = sorted(r.warnings[start:], key=SpecIssue.sort_key)
    return out


# ---- Kubernetes manifests holding a mig-parted config ------------------------------------------


def _parse_config(text: str, file: str) -> Document:
    """The mig-parted config of `text`: the file itself, or the ConfigMap entry holding one when
    the file is Kubernetes manifests (positions then point into the manifest file)."""
    embedded = _configmap_entry(text, file)
    if embedded is None:
        return parse_yaml(text, file)
    if isinstance(embedded, SpecIssue):
        return Document(file, issues=[embedded])
    inner, line_shift, column_shift = embedded
    doc = parse_yaml(inner, file)
    return _shifted(doc, line_shift, column_shift)


def _configmap_entry(text: str, file: str) -> tuple[str, int, int] | SpecIssue | None:
    """None when `text` is not Kubernetes manifests; else the config text with the line and
    column shifts that place it in the file, or why there is none to read."""
    if not re.search(r"^(apiVersion|kind)\s*:", text, re.MULTILINE):
        return None
    try:
        roots = list(YAML(typ="safe", pure=True).compose_all(text))
    except Exception:  # a syntax error: parse_yaml says where
        return None
    found: list[tuple[str, ScalarNode]] = []
    for root in roots:
        fields = _mapping(root)
        if fields is None or "mig-configs" in fields:
            continue
        kind = fields.get("kind")
        if not (isinstance(kind, ScalarNode) and kind.value == "ConfigMap"):
            continue
        data = _mapping(fields.get("data"))
        meta = _mapping(fields.get("metadata")) or {}
        name = meta.get("name")
        where = name.value if isinstance(name, ScalarNode) else "?"
        for key, value in (data or {}).items():
            if isinstance(value, ScalarNode) and re.search(r"^\s*mig-configs\s*:", value.value, re.MULTILINE):
                found.append((f"ConfigMap {where}, data.{key}", value))
    if not found:
        if any("mig-configs" in (_mapping(root) or {}) for root in roots):
            return None
        return SpecIssue(
            file,
            1,
            1,
            "",
            "Kubernetes manifests without a mig-parted config",
            "gpuops reads the ConfigMap data entry that holds 'mig-configs:'",
        )
    if len(found) > 1:
        return SpecIssue(
            file,
            found[1][1].start_mark.line + 1,
            1,
            "",
            f"{len(found)} mig-parted configs in the manifests ({'; '.join(w for w, _ in found)})",
            "keep one, or save the one to import as its own file",
        )
    _, node = found[0]
    lines = text.splitlines()
    if node.style != "|":
        # quoted or folded text: positions inside it cannot be mapped, point at its start
        return node.value, node.start_mark.line, node.start_mark.column
    first = node.start_mark.line + 1  # the block starts on the line after '|'
    indent = next((len(ln) - len(ln.lstrip(" ")) for ln in lines[first:] if ln.strip()), 0)
    return node.value, first, indent


def _mapping(node: Any) -> dict[str, Any] | None:
    if not isinstance(node, MappingNode):
        return None
    return {k.value: v for k, v in node.value if isinstance(k, ScalarNode)}


def _shifted(doc: Document, lines: int, columns: int) -> Document:
    def move(pos: tuple[int, int]) -> tuple[int, int]:
        return (pos[0] + lines, pos[1] + columns) if pos[0] > 0 else pos

    doc.key_positions = {k: move(v) for k, v in doc.key_positions.items()}
    doc.value_positions = {k: move(v) for k, v in doc.value_positions.items()}
    doc.issues = [
        dataclasses.replace(i, line=i.line + lines, column=i.column + columns) if i.line > 0 else i
        for i in doc.issues
    ]
    return doc


def _read_top(r: _Reader, data: dict[str, Any]) -> dict[str, Any]:
    for key in data:
        if key not in ("version", "mig-configs"):
            r.error(
                (key,), f"unexpected field {show(key)}", closest(key, ["version", "mig-configs"]), at_key=True
            )
    if "version" not in data:
        r.error((), "missing required key 'version'", "mig-parted configs start with 'version: v1'")
    elif data["version"] != VERSION:
        r.error(
            ("version",), f"unknown version {show(data['version'])}", "gpuops reads mig-parted's version: v1"
        )
    configs = data.get("mig-configs")
    if configs is None:
        r.error(
            () if "mig-configs" not in data else ("mig-configs",),
            "at least one entry in 'mig-configs' is required",
        )
        return {}
    if not isinstance(configs, dict):
        r.error(("mig-configs",), f"expected a mapping of labels (got {show(configs)})")
        return {}
    if not configs:
        r.error(("mig-configs",), "at least one entry in 'mig-configs' is required")
    return configs


def _read_label(r: _Reader, name: str, value: Any) -> list[dict[str, Any]]:
    path: DataPath = ("mig-configs", name)
    if value is None:
        value = []
    if not isinstance(value, list):
        r.error(path, f"expected a list of specs (got {show(value)})")
        return []
    if not value:
        r.error(path, f"at least one entry in {show(name)} is required", at_key=True)
    good: list[dict[str, Any]] = []
    for j, spec in enumerate(value):
        checked = _read_spec(r, (*path, j), spec)
        good.append(checked if checked is not None else {})
    return good


def _read_spec(r: _Reader, path: DataPath, spec: Any) -> dict[str, Any] | None:
    if not isinstance(spec, dict):
        r.error(path, f"expected a spec mapping (got {show(spec)})", "devices:, mig-enabled:, mig-devices:")
        return None
    before = len(r.issues)
    for key in spec:
        if key not in _SPEC_KEYS:
            r.error((*path, key), f"unexpected field {show(key)}", closest(key, _SPEC_KEYS), at_key=True)
    for key in ("devices", "mig-enabled"):
        if key not in spec:
            r.error(path, f"missing required field {show(key)}", at_key=True)
    devices = spec.get("devices")
    if "devices" in spec:
        if isinstance(devices, str):
            if devices != "all":
                r.error(
                    (*path, "devices"),
                    f"invalid string input for 'devices': {show(devices)}",
                    "all, or a list",
                )
        elif isinstance(devices, list):
            for k, d in enumerate(devices):
                if isinstance(d, bool) or not isinstance(d, int) or d < 0:
                    r.error((*path, "devices", k), f"expected a GPU index (got {show(d)})")
                elif d > 255:
                    r.error((*path, "devices", k), f"GPU index {d} is out of range (0 to 255)")
        else:
            r.error((*path, "devices"), f"expected all or a list of GPU indices (got {show(devices)})")
    enabled = spec.get("mig-enabled")
    if "mig-enabled" in spec and not isinstance(enabled, bool):
        r.error((*path, "mig-enabled"), f"expected true or false (got {show(enabled)})")
    _read_filter(r, path, spec)
    migdevs = spec.get("mig-devices")
    if "mig-devices" in spec and migdevs is not None:
        _read_devices(r, (*path, "mig-devices"), migdevs)
    if enabled is True and "mig-devices" not in spec:
        r.error(
            path,
            "missing required field 'mig-devices' when 'mig-enabled' is true",
            "{} for no instances",
            at_key=True,
        )
    if enabled is False and isinstance(migdevs, dict) and migdevs:
        r.error((*path, "mig-devices"), "MIG devices included when 'mig-enabled' is false", at_key=True)
    return spec if len(r.issues) == before else None


def _read_filter(r: _Reader, path: DataPath, spec: dict[str, Any]) -> None:
    if "device-filter" not in spec:
        return
    value = spec["device-filter"]
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        r.error((*path, "device-filter"), f"expected a PCI id or a list of them (got {show(value)})")
        return
    for k, item in enumerate(items):
        where = (*path, "device-filter") if isinstance(value, str) else (*path, "device-filter", k)
        if not isinstance(item, str) or (item and not _FILTER_RE.match(item)):
            r.error(
                where, f"not a PCI device id (got {show(item)})", "0xDDDDVVVV, e.g. 0x233010DE (H100 SXM)"
            )


def _read_devices(r: _Reader, path: DataPath, value: Any) -> None:
    if not isinstance(value, dict):
        r.error(path, f"expected profile counts (got {show(value)})", 'e.g. {"1g.10gb": 7}')
        return
    for key, count in value.items():
        if isinstance(count, bool) or not isinstance(count, int):
            r.error((*path, key), f"expected a count (got {show(count)})")
        elif count < 0:
            r.error((*path, key), f"invalid count for {show(key)}: {count}")
        if _gi_name(key) is None:
            r.error(
                (*path, key),
                f"not a MIG profile {show(key)}",
                "e.g. 3g.40gb, 1g.10gb+me, 1c.3g.40gb",
                at_key=True,
            )
    counts = [c for c in value.values() if isinstance(c, int) and not isinstance(c, bool)]
    if value and counts and all(c == 0 for c in counts):
        r.error(path, "all counts for all MigProfiles are 0", "use {} for no instances")


def _profile_hint(gi_name: str, models: Sequence[MigModel]) -> str:
    """A did-you-mean among the profiles of `models` with the same slice count (a 3g.95gb is
    never a 1g.5gb), else the list of them."""
    slices = gi_name.split("g.", 1)[0]
    same = sorted(
        {n for m in models for p in m.profiles for n in (p.name, *p.aliases) if n.startswith(slices + "g.")}
    )
    return closest(gi_name, same) or (
        f"{slices}g profiles: {', '.join(same)}" if same else "gpuops mig models lists them"
    )


def _gi_name(key: str) -> str | None:
    """'1c.3g.40gb' -> '3g.40gb'; '3g.40gb' -> itself; None for anything else."""
    ci = CI_LEVEL_RE.match(key)
    if ci:
        return ci.group(2)
    return key if _GI_RE.match(key) else None


def _choose(r: _Reader, configs: dict[str, Any], label: str | None) -> str | None:
    labels = list(configs)
    if label is None:
        if len(labels) == 1:
            return labels[0]
        if labels:
            r.error(
                ("mig-configs",),
                f"the file has {len(labels)} configurations: choose one with -c",
                ", ".join(labels),
                at_key=True,
            )
        return None
    if label not in configs:
        r.error(
            ("mig-configs",),
            f"no configuration {show(label)}",
            closest(label, labels) or f"labels: {', '.join(labels)}",
            at_key=True,
        )
        return None
    return label


def _filter_models(r: _Reader, path: DataPath, spec: dict[str, Any]) -> list[str] | None:
    """The catalog models of a device-filter (None: no filter). Ids outside the catalog, or of
    GPUs without MIG, are left out with one warning naming them; [] when none is left (the
    spec is skipped)."""
    if "device-filter" not in spec:
        return None
    value = spec["device-filter"]
    items = [value] if isinstance(value, str) else list(value)
    items = [i for i in items if i]
    if not items:
        return None
    models: list[str] = []
    unknown: list[str] = []
    no_mig: list[str] = []
    for k, item in enumerate(items):
        where = (*path, "device-filter") if isinstance(value, str) else (*path, "device-filter", k)
        match = _FILTER_RE.match(item)
        assert match is not None
        raw = int(match.group(1), 0)
        nvidia = raw & 0xFFFF == NVIDIA_VENDOR_ID or raw <= 0xFFFF
        model = model_for_pci_device_id(raw) if nvidia else None
        if model is None:
            device = raw >> 16 if raw > 0xFFFF else raw
            (no_mig if nvidia and device in NON_MIG_PCI_DEVICES else unknown).append(item)
            continue
        if match.group(2):
            r.warn(where, f"subsystem id of {item} not kept: the entry selects every {model.key}")
        if model.key not in models:
            models.append(model.key)
    where = (*path, "device-filter")
    if not models and not unknown and not spec.get("mig-enabled"):
        return []  # MIG off on GPUs without MIG: nothing to do, as in mig-parted
    left = []
    if unknown:
        left.append(f"{', '.join(unknown)} not in gpuops' catalog")
    if no_mig:
        left.append(f"{', '.join(no_mig)} without MIG")
    if left:
        outcome = "the spec is skipped" if not models else f"the entry selects {', '.join(models)}"
        r.warn(where, f"left out: {'; '.join(left)}; {outcome}", "gpuops mig models lists the MIG models")
    return models


def _convert(r: _Reader, path: DataPath, spec: dict[str, Any], nodes: str) -> dict[str, Any] | None:
    models = _filter_models(r, path, spec)
    devices = spec["devices"]
    select: dict[str, Any] = {"nodes": nodes}
    gpus: dict[str, Any] = {}
    if models == []:
        return None
    if models:
        gpus["model"] = models[0] if len(models) == 1 else models
    if isinstance(devices, list):
        if not devices:
            r.warn((*path, "devices"), "selects no GPU; left out")
            return None
        gpus["indices"] = devices[0] if len(set(devices)) == 1 else format_gpu_indices(set(devices))
    if gpus:
        select["gpus"] = gpus["indices"] if list(gpus) == ["indices"] else gpus
    if not spec["mig-enabled"]:
        return {"select": select, "mig": {"enabled": False}}
    mig = _layout(r, (*path, "mig-devices"), spec.get("mig-devices") or {}, models)
    if mig is None:
        return None
    return {"select": select, "mig": {"enabled": True, **mig}}


def _layout(
    r: _Reader, path: DataPath, counts: dict[str, int], models: Sequence[str] | None
) -> dict[str, Any] | None:
    """mig-devices as profiles (and compute splits): CI-level profiles grouped into GPU
    instances the way mig-parted creates them."""
    keys = MODELS if not models else {k: MODELS[k] for k in models}
    per_gi: dict[str, list[int]] = {}  # GI profile -> compute slices of each CI wanted
    for key, count in counts.items():
        if count <= 0:
            continue
        gi_name = _gi_name(key)
        assert gi_name is not None
        having = [m for m in keys.values() if m.find_profile(gi_name) is not None]
        lacking = [k for k, m in keys.items() if m.find_profile(gi_name) is None]
        if not having or (models and lacking):
            where = f"{', '.join(lacking)} (device-filter)" if models else "any catalog model"
            hint = _profile_hint(gi_name, [keys[k] for k in lacking] if models else list(keys.values()))
            r.error((*path, key), f"{gi_name} is not a profile of {where}", hint, at_key=True)
            continue
        gi = having[0].profile(gi_name)
        ci = CI_LEVEL_RE.match(key)
        slices = int(ci.group(1)) if ci else gi.compute_slices
        if slices not in {cp.slices for cp in gi.compute_profiles}:
            valid = ", ".join(f"{cp.slices}c.{gi.name}" for cp in gi.compute_profiles)
            r.error(
                (*path, key), f"{gi.name} has no {slices}c compute instance", f"valid: {valid}", at_key=True
            )
            continue
        per_gi.setdefault(gi_name, []).extend([slices] * count)
    profiles: dict[str, int] = {}
    compute: dict[str, list[str]] = {}
    for gi_name, wanted in per_gi.items():
        gi = next(m.profile(gi_name) for m in keys.values() if m.find_profile(gi_name) is not None)
        instances: list[list[int]] = []
        for slices in sorted(wanted, reverse=True):
            # mig-parted creates the next CI of the same GI profile in the last GI while it fits
            if instances and not isinstance(
                place_compute_instances(gi, [f"{s}c" for s in [*instances[-1], slices]]), str
            ):
                instances[-1].append(slices)
            else:
                instances.append([slices])
        splits = {tuple(i) for i in instances}
        if len(splits) > 1:
            shown = "; ".join(", ".join(f"{s}c" for s in split) for split in sorted(splits, reverse=True))
            r.error(
                path,
                f"{gi_name} instances with different compute splits ({shown}) cannot be written "
                "in fleet.yaml",
                "one split per profile per entry: put GPUs that differ in entries of their own",
            )
            continue
        profiles[gi_name] = len(instances)
        (split,) = splits
        if split != (gi.compute_slices,):
            compute[gi_name] = [f"{s}c" for s in split]
    out: dict[str, Any] = {"profiles": profiles}
    if compute:
        out["compute"] = compute
    _check_fits(r, path, out, list(keys) if models else None)
    return out


def _check_fits(r: _Reader, path: DataPath, layout: dict[str, Any], models: list[str] | None) -> None:
    """The layout must fit the filter's models (each), or some catalog model without a filter:
    mig-parted would accept the file and fail at apply time; gpuops says so now."""
    if not layout["profiles"]:
        return
    mig = desired_mig(MigSpec.model_validate({"enabled": True, **layout}))
    candidates = [MODELS[k] for k in models] if models else list(MODELS.values())
    results = [solve_layout(mig, m) for m in candidates]
    failed = [(m, res) for m, res in zip(candidates, results, strict=True) if not res.ok]
    if models and failed:
        model, res = failed[0]
        r.error(
            path,
            f"{res.reason} (on {model.key})",
            "fix the counts; gpuops mig check MODEL PROFILE... tries a layout",
        )
    elif not models and len(failed) == len(candidates):
        fitting = [(m, res) for m, res in failed if not res.reason.startswith("unknown profile")]
        model, res = (fitting or failed)[0]
        r.error(path, f"{res.reason} (on {model.key})", "the layout fits no catalog model")


def render_carve(imported: Imported, *, source: str) -> str:
    """The entries as a `carve:` section to paste into fleet.yaml: each selection on one line, and
    each MIG setting that is a mapping (profile counts, per-GPU-instance settings)."""
    seq = CommentedSeq()
    for entry in imported.entries:
        mig = CommentedMap((k, flow(v) if isinstance(v, dict) else v) for k, v in entry["mig"].items())
        seq.append(CommentedMap([("select", flow(entry["select"])), ("mig", mig)]))
    comment = (
        f"imported from mig-parted config {source}, label {imported.label} (gpuops import mig-parted)\n"
        "a later entry overrides an earlier one on the GPUs both select, as in mig-parted"
    )
    return dump_yaml({"carve": seq}, comment=comment)


__all__ = ["Imported", "read_mig_parted", "render_carve"]
