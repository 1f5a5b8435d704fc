"""NVIDIA's own mig-parted configs (tests/data/migparted, see its NOTICE) through
`gpuops import mig-parted`: every label of every file imports, and on simulated GPUs of each
catalog model the carve gives what mig-parted's apply gives (issue 19)."""

from __future__ import annotations

import functools
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import typer
from ruamel.yaml import YAML
from typer.testing import CliRunner

from gpuops.cli import spec as spec_cli
from gpuops.core.mig.catalog import MODELS, MigModel
from gpuops.core.mig.placement import solve
from gpuops.node.backends.sim import SimBackend
from gpuops.spec import parse_fleet
from gpuops.spec.migparted import read_mig_parted_all, render_carve

DATA = Path(__file__).resolve().parent.parent / "data" / "migparted"
FILES = sorted(DATA.glob("*.yaml"))

app = typer.Typer(pretty_exceptions_enable=False)


@app.callback()
def _root() -> None:
    """Test app holding only the spec commands."""


spec_cli.register(app)
runner = CliRunner()


@functools.cache  # read once per process: collection (test_plan_keeps_instances) and tests share it
def configs(path: Path) -> dict[str, Any]:
    """The file's mig-configs, read without gpuops: the file, or its ConfigMap's config.yaml."""
    yaml = YAML(typ="safe", pure=True)
    for doc in list(YAML(typ="safe", pure=True).load_all(path.read_text())):
        if isinstance(doc, dict) and "mig-configs" in doc:
            return dict(doc["mig-configs"])
        if isinstance(doc, dict) and doc.get("kind") == "ConfigMap":
            for value in (doc.get("data") or {}).values():
                inner = yaml.load(value)
                if isinstance(inner, dict) and "mig-configs" in inner:
                    return dict(inner["mig-configs"])
    raise AssertionError(f"no mig-parted config in {path}")


def run(*args: str) -> Any:
    result = runner.invoke(app, list(args))
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_the_six_files_are_here() -> None:
    assert len(FILES) == 6 and (DATA / "LICENSE").is_file() and (DATA / "NOTICE").is_file()
    assert sum(len(configs(f)) for f in FILES) == 254  # 9 + 9 + 81 + 24 + 50 + 81 labels


@pytest.mark.slow
@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_every_label_imports(path: Path) -> None:
    for label in configs(path):
        r = run("import", "mig-parted", str(path), "--label", label)
        assert r.exit_code == 0, (label, r.stderr)
        assert r.stdout.startswith(f"# imported from mig-parted config {path}, label {label}")
        assert all(line.startswith("warning: ") for line in r.stderr.splitlines())


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_all_labels_at_once(path: Path, tmp_path: Path) -> None:
    labels = list(configs(path))
    r = run("import", "mig-parted", str(path), "--all")
    assert r.exit_code == 0, r.stderr
    docs = r.stdout.split("---\n")[1:]
    assert [d.splitlines()[0].rsplit("label ", 1)[1].split(" ")[0] for d in docs] == labels
    out = tmp_path / "carve"
    r = run("import", "mig-parted", str(path), "--all", "-o", str(out))
    assert r.exit_code == 0 and r.stdout == ""
    assert f"wrote {len(labels)} labels' carve: entries to {out}/LABEL.yaml" in r.stderr
    assert sorted(p.stem for p in out.iterdir()) == sorted(labels)


def test_all_and_label_exclude_each_other() -> None:
    r = run("import", "mig-parted", str(FILES[0]), "--all", "--label", "all-disabled")
    assert r.exit_code == 2 and "exclude each other" in r.stderr


def test_specs_for_gpus_gpuops_does_not_know_are_skipped_with_one_warning(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "version: v1\nmig-configs:\n  a:\n"
        '    - device-filter: ["0x2B8510DE", "0x2B9910DE"]\n'
        '      devices: all\n      mig-enabled: true\n      mig-devices: {"1g.5gb": 7}\n'
        '    - device-filter: ["0x1FB010DE", "0x233010DE"]\n'
        '      devices: all\n      mig-enabled: true\n      mig-devices: {"1g.10gb": 7}\n'
        '    - device-filter: "0x26B910DE"\n      devices: all\n      mig-enabled: false\n'
    )
    r = run("import", "mig-parted", str(config))
    assert r.exit_code == 0
    assert r.stderr.splitlines() == [
        f"warning: {config}:4:22: mig-configs.a[0].device-filter: left out: 0x2B8510DE, 0x2B9910DE not in "
        "gpuops' catalog; the spec is skipped; gpuops mig models lists the MIG models",
        f"warning: {config}:8:22: mig-configs.a[1].device-filter: left out: 0x1FB010DE without MIG; "
        "the entry selects H100-80GB; gpuops mig models lists the MIG models",
    ]
    assert r.stdout.split("carve:\n", 1)[1] == (
        "  - select: {nodes: '*', gpus: {model: H100-80GB}}\n"
        "    mig:\n      enabled: true\n      profiles: {1g.10gb: 7}\n"
    )


def test_other_labels_are_not_checked_against_the_catalog(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(
        "version: v1\nmig-configs:\n  off: [{devices: all, mig-enabled: false}]\n"
        '  future: [{devices: all, mig-enabled: true, mig-devices: {"9g.999gb": 1}}]\n'
    )
    assert run("import", "mig-parted", str(config), "-c", "off").exit_code == 0
    r = run("import", "mig-parted", str(config), "-c", "future")
    assert r.exit_code == 1
    assert r.stderr == (
        f'{config}:4:60: mig-configs.future[0].mig-devices["9g.999gb"]: 9g.999gb is not a profile of any '
        "catalog model; gpuops mig models lists them\n"
    )


def test_mistakes_inside_a_configmap_point_into_the_manifest(tmp_path: Path) -> None:
    source = DATA / "gpu-operator-default-mig-parted-config.yaml"
    text = source.read_text().replace('"3g.72gb": 1', '"3g.73gb": 1')
    line = next(i for i, ln in enumerate(text.splitlines(), 1) if '"3g.73gb": 1' in ln)
    broken = tmp_path / "cm.yaml"
    broken.write_text(text)
    r = run("import", "mig-parted", str(broken), "-l", "all-balanced")
    assert r.exit_code == 1
    assert r.stderr == (
        f'{broken}:{line}:13: mig-configs.all-balanced[3].mig-devices["3g.73gb"]: 3g.73gb is not a profile '
        "of GH200-144GB (device-filter); did you mean '3g.72gb'?\n"
    )


# ---- applied to simulated GPUs: what mig-parted's apply makes ---------------------------------


def mig_parted_result(specs: list[dict[str, Any]], model: MigModel) -> Counter[str] | str | None:
    """What mig-parted leaves on GPU 0 of `model`: None (no spec selects it), "off", the
    instances by profile name, or "fails" (a profile the GPU lacks, or a layout that does not fit)."""
    devices = {pci >> 16 for pci in model.pci_device_ids}
    winner = None
    for spec in specs:
        flt = spec.get("device-filter") or []
        flt = [flt] if isinstance(flt, str) else flt
        if flt and not any(int(f.split(":")[0], 16) >> 16 in devices for f in flt):
            continue
        if spec["devices"] == "all" or 0 in spec["devices"]:
            winner = spec
    if winner is None:
        return None
    if not winner["mig-enabled"]:
        return "off"
    want = Counter({k: v for k, v in (winner.get("mig-devices") or {}).items() if v})
    if any(model.find_profile(name) is None for name in want) or not solve(model, dict(want)).ok:
        return "fails"
    return Counter({model.profile(n).name: c for n, c in want.items()})


def simulated(model: MigModel, placements: list[Any]) -> Counter[str]:
    backend = SimBackend(
        {"hostname": "n", "gpus": [{"model": model.key, "mig": True}], "workloads": []}, clock=lambda: 0.0
    )
    for p in placements:
        backend.create_gpu_instance(0, p.profile_id, p.start)
    mig = backend.inventory().gpus[0].mig
    assert mig is not None
    return Counter(model.profile(gi.profile_id).name for gi in mig.gpu_instances)


@pytest.mark.parametrize("path", FILES, ids=[f.name for f in FILES])
def test_applied_to_every_catalog_model_as_mig_parted_would(path: Path) -> None:
    checked = 0
    # Every label read in one pass (the CLI reads each on its own in test_every_label_imports).
    every = read_mig_parted_all(path.read_text(), str(path))
    assert [i.label for i in every] == list(configs(path))
    for (label, specs), imported in zip(configs(path).items(), every, strict=True):
        carve = render_carve(imported, source="x")
        fleet = parse_fleet("version: 1\nnodes:\n  - {name: n, host: h}\n" + carve.split("\n", 2)[2])
        for model in MODELS.values():
            expected = mig_parted_result(specs, model)
            desired = fleet.desired_for("n", 0, None, model)
            if expected is None:
                assert desired.mig is None, (label, model.key)
            elif expected == "off":
                assert desired.mig is not None and not desired.mig.enabled, (label, model.key)
            elif expected == "fails":
                assert not desired.ok, (label, model.key)  # gpuops refuses what mig-parted cannot do
            else:
                assert desired.ok and desired.solved_layout is not None, (label, model.key, desired.problems)
                got = simulated(model, list(desired.solved_layout.placements))
                assert got == expected, (label, model.key)
                checked += 1
    assert checked > 0
