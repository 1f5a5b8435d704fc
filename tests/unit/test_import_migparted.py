# ruff: noqa: E501  (the expected error lines are long by nature)
"""`gpuops import mig-parted`: the reference's example config, CI-level profiles, every refusal
with its place in the file, and the command line."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from gpuops.cli import spec as spec_cli
from gpuops.spec import SpecError, parse_fleet
from gpuops.spec.migparted import read_mig_parted, render_carve

# reference/mig-mps.md, section 1 (mig-parted's examples/config.yaml and the Hopper example)
REFERENCE = """\
version: v1
mig-configs:
  all-disabled:
    - devices: all
      mig-enabled: false
  all-balanced:
    - device-filter: ["0x233110DE", "0x233010DE", "0x232210DE"]  # H100-80GB/H800
      devices: all
      mig-enabled: true
      mig-devices: {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    - device-filter: ["0x233510DE", "0x233B10DE"]                # H200 141GB / NVL
      devices: all
      mig-enabled: true
      mig-devices: {"1g.18gb": 2, "2g.35gb": 1, "3g.71gb": 1}
  custom-config:
    - devices: [0,1,2,3]
      mig-enabled: false
    - devices: [4]
      mig-enabled: true
      mig-devices: {"1g.5gb": 7}
"""

HEADER = "# a later entry overrides an earlier one on the GPUs both select, as in mig-parted\n"


def convert(text: str, label: str | None = None, **kw: Any) -> str:
    imported = read_mig_parted(textwrap.dedent(text), "m.yaml", label, **kw)
    return render_carve(imported, source="m.yaml")


def errors(text: str, label: str | None = None) -> list[str]:
    with pytest.raises(SpecError) as info:
        read_mig_parted(textwrap.dedent(text), "m.yaml", label)
    return [str(e) for e in info.value.errors]


def as_fleet(carve: str) -> str:
    """A fleet.yaml with the converted carve: section (the first node an H100 box)."""
    return (
        "version: 1\nnodes:\n"
        "  - {name: gpu-h100, host: h1, labels: {model: h100-80gb}}\n"
        "  - {name: gpu-h200, host: h2, labels: {model: h200}}\n"
        "  - {name: gpu-a100, host: h3, labels: {model: a100-40gb}}\n"
    ) + "".join(line + "\n" for line in carve.splitlines() if not line.startswith("#"))


def test_all_disabled() -> None:
    text = convert(REFERENCE, "all-disabled")
    assert text == (
        "# imported from mig-parted config m.yaml, label all-disabled (gpuops import mig-parted)\n"
        + HEADER
        + "carve:\n"
        "  - select: {nodes: '*'}\n"
        "    mig:\n"
        "      enabled: false\n"
    )
    fleet = parse_fleet(as_fleet(text))
    assert fleet.desired_for("gpu-h100", 3, None, "NVIDIA H100 80GB HBM3").mig is not None
    off = fleet.desired_for("gpu-h100", 3, None, "NVIDIA H100 80GB HBM3").mig
    assert off is not None and not off.enabled
    # a GPU without MIG is skipped, as mig-parted skips it under devices: all
    assert fleet.desired_for("gpu-h100", 0, None, "NVIDIA L40S").mig is None


def test_all_balanced_with_h100_and_h200_filters() -> None:
    imported = read_mig_parted(REFERENCE, "m.yaml", "all-balanced")
    assert imported.warnings == []  # 0x2322, the H800 PCIe, is an H100 PCIe in the catalog
    text = render_carve(imported, source="m.yaml")
    assert text == (
        "# imported from mig-parted config m.yaml, label all-balanced (gpuops import mig-parted)\n"
        + HEADER
        + "carve:\n"
        "  - select: {nodes: '*', gpus: {model: [H100-PCIE-80GB, H100-80GB]}}\n"
        "    mig:\n"
        "      enabled: true\n"
        "      profiles: {1g.10gb: 2, 2g.20gb: 1, 3g.40gb: 1}\n"
        "  - select: {nodes: '*', gpus: {model: H200-141GB}}\n"
        "    mig:\n"
        "      enabled: true\n"
        "      profiles: {1g.18gb: 2, 2g.35gb: 1, 3g.71gb: 1}\n"
    )
    fleet = parse_fleet(as_fleet(text))
    h100 = fleet.desired_for("gpu-h100", 0, None, "NVIDIA H100 80GB HBM3")
    assert h100.ok and h100.solved_layout is not None
    assert [str(p) for p in h100.solved_layout.placements] == [
        "2g.20gb@0",
        "1g.10gb@2",
        "1g.10gb@3",
        "3g.40gb@4",
    ]
    h200 = fleet.desired_for("gpu-h200", 0, None, "NVIDIA H200 NVL")
    assert h200.ok and h200.mig is not None and h200.mig.entry == 1
    assert fleet.desired_for("gpu-a100", 0, None, "NVIDIA A100-SXM4-40GB").mig is None


def test_custom_config() -> None:
    text = convert(REFERENCE, "custom-config")
    assert text.split("carve:\n", 1)[1] == (
        "  - select: {nodes: '*', gpus: 0-3}\n"
        "    mig:\n"
        "      enabled: false\n"
        "  - select: {nodes: '*', gpus: 4}\n"
        "    mig:\n"
        "      enabled: true\n"
        "      profiles: {1g.5gb: 7}\n"
    )
    fleet = parse_fleet(as_fleet(text).replace("{nodes: '*'", "{nodes: gpu-a100"))
    a100 = fleet.desired_for("gpu-a100", 4, None, "NVIDIA A100-SXM4-40GB")
    assert a100.ok and a100.solved_layout is not None and len(a100.solved_layout.placements) == 7
    assert not fleet.desired_for("gpu-a100", 2, None, "NVIDIA A100-SXM4-40GB").mig.enabled  # type: ignore[union-attr]
    assert fleet.desired_for("gpu-a100", 5, None, "NVIDIA A100-SXM4-40GB").mig is None
    # an H100 named by index: the plan says 1g.5gb is no H100 profile
    wrong = fleet.desired_for("gpu-a100", 4, None, "NVIDIA H100 80GB HBM3")
    assert [p.message for p in wrong.problems] == [
        "unknown profile '1g.5gb' for H100-80GB; valid: 1g.10gb, 1g.10gb+me, 1g.20gb, 2g.20gb, 3g.40gb, 4g.40gb, 7g.80gb"
    ]


def test_the_only_label_needs_no_c_and_nodes_can_be_chosen() -> None:
    text = convert(
        """\
        version: v1
        mig-configs:
          only: [{devices: all, mig-enabled: true, mig-devices: {}}]
        """,
        nodes="zone=a,gpu-*",
    )
    assert text.split("carve:\n", 1)[1] == (
        "  - select: {nodes: 'zone=a,gpu-*'}\n    mig:\n      enabled: true\n      profiles: {}\n"
    )


def test_ci_level_profiles_become_compute_splits() -> None:
    imported = read_mig_parted(
        textwrap.dedent(
            """\
            version: v1
            mig-configs:
              x:
                - device-filter: "0x233010DE"
                  devices: [0, 1, 2, 3]
                  mig-enabled: true
                  mig-devices: {"1c.3g.40gb": 6}
                - devices: [4, 5]
                  mig-enabled: true
                  mig-devices: {"2c.3g.40gb": 1, "1c.3g.40gb": 1, "1c.7g.80gb": 0}
                - device-filter: ["0x233010DE:0x16C110DE"]
                  devices: all
                  mig-enabled: true
                  mig-devices: {"3c.3g.40gb": 2}
                - devices: [7]
                  mig-enabled: true
                  mig-devices: {"1c.7g.80gb": 7}
            """
        ),
        "m.yaml",
    )
    assert [str(w) for w in imported.warnings] == [
        "m.yaml:11:23: mig-configs.x[2].device-filter[0]: subsystem id of 0x233010DE:0x16C110DE not kept: the entry selects every H100-80GB"
    ]
    assert imported.entries == [
        {
            "select": {"nodes": "*", "gpus": {"model": "H100-80GB", "indices": "0-3"}},
            "mig": {"enabled": True, "profiles": {"3g.40gb": 2}, "compute": {"3g.40gb": ["1c", "1c", "1c"]}},
        },
        {
            "select": {"nodes": "*", "gpus": "4-5"},
            "mig": {"enabled": True, "profiles": {"3g.40gb": 1}, "compute": {"3g.40gb": ["2c", "1c"]}},
        },
        {
            "select": {"nodes": "*", "gpus": {"model": "H100-80GB"}},
            "mig": {"enabled": True, "profiles": {"3g.40gb": 2}},
        },
        {
            "select": {"nodes": "*", "gpus": 7},
            "mig": {"enabled": True, "profiles": {"7g.80gb": 1}, "compute": {"7g.80gb": ["1c"] * 7}},
        },
    ]
    fleet = parse_fleet(as_fleet(render_carve(imported, source="m.yaml")).replace("'*'", "gpu-h100"))
    # later entries win, as in mig-parted: GPU 5 of an H100 box gets the third spec
    assert fleet.desired_for("gpu-h100", 5, None, "NVIDIA H100 80GB HBM3").mig.entry == 2  # type: ignore[union-attr]
    d = fleet.desired_for("gpu-h100", 5, None, "NVIDIA A100-SXM4-80GB")
    assert d.mig is not None and d.mig.entry == 1 and d.solved_layout is not None
    assert [c.name for c in d.solved_layout.instances[0].compute] == ["2c.3g.40gb", "1c.3g.40gb"]


# (description, config, -c label, the lines it must print)
REFUSED: list[tuple[str, str, str | None, list[str]]] = [
    (
        "unknown version and key",
        """\
        version: v2
        mig-config: {}
        """,
        None,
        [
            "m.yaml:1:1: at least one entry in 'mig-configs' is required",
            "m.yaml:1:10: version: unknown version 'v2'; gpuops reads mig-parted's version: v1",
            "m.yaml:2:1: mig-config: unexpected field 'mig-config'; did you mean 'mig-configs'?",
        ],
    ),
    (
        "missing version",
        """\
        mig-configs: {a: [{devices: all, mig-enabled: false}]}
        """,
        None,
        ["m.yaml:1:1: missing required key 'version'; mig-parted configs start with 'version: v1'"],
    ),
    (
        "empty labels",
        """\
        version: v1
        mig-configs: {}
        """,
        None,
        ["m.yaml:2:14: mig-configs: at least one entry in 'mig-configs' is required"],
    ),
    (
        "a label without specs",
        """\
        version: v1
        mig-configs:
          a: []
          b:
        """,
        "a",
        [
            "m.yaml:3:3: mig-configs.a: at least one entry in 'a' is required",
            "m.yaml:4:3: mig-configs.b: at least one entry in 'b' is required",
        ],
    ),
    (
        "several labels without -c",
        """\
        version: v1
        mig-configs:
          a: [{devices: all, mig-enabled: false}]
          b: [{devices: all, mig-enabled: false}]
        """,
        None,
        ["m.yaml:2:1: mig-configs: the file has 2 configurations: choose one with -c; a, b"],
    ),
    (
        "an unknown label",
        """\
        version: v1
        mig-configs:
          all-balanced: [{devices: all, mig-enabled: false}]
        """,
        "all-balance",
        ["m.yaml:2:1: mig-configs: no configuration 'all-balance'; did you mean 'all-balanced'?"],
    ),
    (
        "spec mistakes",
        """\
        version: v1
        mig-configs:
          a:
            - devices: some
              mig-enabled: yes
              devise: [1]
            - devices: [-1, 300]
              mig-enabled: true
            - devices: all
              mig-enabled: false
              mig-devices: {"1g.10gb": 1}
            - mig-enabled: true
              mig-devices: {"1g.10gb": 0, "2g.20gb": 0}
        """,
        "a",
        [
            "m.yaml:4:16: mig-configs.a[0].devices: invalid string input for 'devices': 'some'; all, or a list",
            "m.yaml:5:20: mig-configs.a[0].mig-enabled: expected true or false (got 'yes')",
            "m.yaml:6:7: mig-configs.a[0].devise: unexpected field 'devise'; did you mean 'devices'?",
            "m.yaml:7:7: mig-configs.a[1]: missing required field 'mig-devices' when 'mig-enabled' is true; {} for no instances",
            "m.yaml:7:17: mig-configs.a[1].devices[0]: expected a GPU index (got -1)",
            "m.yaml:7:21: mig-configs.a[1].devices[1]: GPU index 300 is out of range (0 to 255)",
            "m.yaml:11:7: mig-configs.a[2].mig-devices: MIG devices included when 'mig-enabled' is false",
            "m.yaml:12:7: mig-configs.a[3]: missing required field 'devices'",
            "m.yaml:13:20: mig-configs.a[3].mig-devices: all counts for all MigProfiles are 0; use {} for no instances",
        ],
    ),
    (
        "profile mistakes",
        """\
        version: v1
        mig-configs:
          a:
            - devices: all
              mig-enabled: true
              mig-devices: {"1g.11gb": 1, "3g.40gb": -1, "2g.20gb": x, "4c.3g.40gb": 1}
        """,
        "a",
        [
            "m.yaml:6:46: mig-configs.a[0].mig-devices[\"3g.40gb\"]: invalid count for '3g.40gb': -1",
            "m.yaml:6:61: mig-configs.a[0].mig-devices[\"2g.20gb\"]: expected a count (got 'x')",
        ],
    ),
    (
        "a compute instance the GPU instance does not have",
        """\
        version: v1
        mig-configs:
          a: [{devices: all, mig-enabled: true, mig-devices: {"4c.3g.40gb": 1}}]
        """,
        None,
        [
            'm.yaml:3:55: mig-configs.a[0].mig-devices["4c.3g.40gb"]: 3g.40gb has no 4c compute instance; valid: 1c.3g.40gb, 2c.3g.40gb, 3c.3g.40gb'
        ],
    ),
    (
        "device filters",
        """\
        version: v1
        mig-configs:
          a:
            - devices: all
              device-filter: [0x2330, "zzz"]
              mig-enabled: false
            - devices: all
              device-filter: ["0x232210DE", "0x20B010AB"]
              mig-enabled: true
              mig-devices: {"1g.10gb": 7}
        """,
        "a",
        [
            "m.yaml:5:23: mig-configs.a[0].device-filter[0]: not a PCI device id (got 9008); 0xDDDDVVVV, e.g. 0x233010DE (H100 SXM)",
            "m.yaml:5:31: mig-configs.a[0].device-filter[1]: not a PCI device id (got 'zzz'); 0xDDDDVVVV, e.g. 0x233010DE (H100 SXM)",
        ],
    ),
    (
        "profiles no catalog model has: did-you-mean keeps the slice count",
        """\
        version: v1
        mig-configs:
          a:
            - devices: all
              mig-enabled: true
              mig-devices: {"1g.11gb": 1, "3g.96gb": 1, "1g.24gb+gfz": 1, "2g.48gb+xyz": 1}
        """,
        "a",
        [
            "m.yaml:6:21: mig-configs.a[0].mig-devices[\"1g.11gb\"]: 1g.11gb is not a profile of any catalog model; did you mean '1g.18gb'?",
            "m.yaml:6:35: mig-configs.a[0].mig-devices[\"3g.96gb\"]: 3g.96gb is not a profile of any catalog model; did you mean '3g.95gb'?",
            "m.yaml:6:49: mig-configs.a[0].mig-devices[\"1g.24gb+gfz\"]: 1g.24gb+gfz is not a profile of any catalog model; did you mean '1g.24gb+gfx'?",
            "m.yaml:6:67: mig-configs.a[0].mig-devices[\"2g.48gb+xyz\"]: 2g.48gb+xyz is not a profile of any catalog model; did you mean '2g.48gb+gfx'?",
        ],
    ),
    (
        "layouts that fit no GPU they select",
        """\
        version: v1
        mig-configs:
          a:
            - devices: all
              device-filter: ["0x20B010DE", "0x233010DE"]
              mig-enabled: true
              mig-devices: {"1g.10gb": 7}
            - devices: all
              device-filter: "0x233010DE"
              mig-enabled: true
              mig-devices: {"3g.71gb": 1}
            - devices: all
              mig-enabled: true
              mig-devices: {"7g.80gb": 2}
        """,
        "a",
        [
            "m.yaml:7:20: mig-configs.a[0].mig-devices: 1g.10gb: at most 4 per GPU (asked for 7) (on A100-SXM4-40GB); fix the counts; gpuops mig check MODEL PROFILE... tries a layout",
            "m.yaml:11:21: mig-configs.a[1].mig-devices[\"3g.71gb\"]: 3g.71gb is not a profile of H100-80GB (device-filter); did you mean '3g.40gb'?",
            "m.yaml:14:20: mig-configs.a[2].mig-devices: 7g.80gb: at most 1 per GPU (asked for 2) (on A100-80GB); the layout fits no catalog model",
        ],
    ),
    (
        "compute splits that differ between instances",
        """\
        version: v1
        mig-configs:
          x:
            - devices: all
              mig-enabled: true
              mig-devices: {"1c.3g.40gb": 4}
            - devices: all
              mig-enabled: true
              mig-devices: {"3g.40gb": 1, "1c.3g.40gb": 3}
        """,
        "x",
        [
            "m.yaml:6:20: mig-configs.x[0].mig-devices: 3g.40gb instances with different compute splits (1c, 1c, 1c; 1c) cannot be written in fleet.yaml; one split per profile per entry: put GPUs that differ in entries of their own",
            "m.yaml:9:20: mig-configs.x[1].mig-devices: 3g.40gb instances with different compute splits (3c; 1c, 1c, 1c) cannot be written in fleet.yaml; one split per profile per entry: put GPUs that differ in entries of their own",
        ],
    ),
    (
        "not a mapping",
        """\
        - version: v1
        """,
        None,
        ["m.yaml:1:1: expected a mig-parted config, a mapping (got a list); start with 'version: v1'"],
    ),
    (
        "YAML syntax",
        """\
        version: v1
        mig-configs: {a: [
        """,
        None,
        [
            "m.yaml:3:1: YAML syntax error: expected the node content, but found '<stream end>' (while parsing a flow node)"
        ],
    ),
    (
        "a duplicate key",
        """\
        version: v1
        version: v1
        mig-configs: {a: [{devices: all, mig-enabled: false}]}
        """,
        None,
        ["m.yaml:2:1: version: duplicate key 'version' (first at line 1); keep one of them"],
    ),
]


@pytest.mark.parametrize(
    ("config", "label", "expected"), [(c, lb, e) for _, c, lb, e in REFUSED], ids=[r[0] for r in REFUSED]
)
def test_refused(config: str, label: str | None, expected: list[str]) -> None:
    assert errors(config, label) == expected


def test_empty_device_lists_are_left_out_with_a_warning() -> None:
    imported = read_mig_parted(
        "version: v1\nmig-configs:\n  a:\n    - {devices: [], mig-enabled: false}\n"
        "    - {devices: [3, 1, 2, 2], mig-enabled: true, mig-devices: {}}\n",
        "m.yaml",
    )
    assert [str(w) for w in imported.warnings] == [
        "m.yaml:4:17: mig-configs.a[0].devices: selects no GPU; left out"
    ]
    assert imported.entries == [
        {"select": {"nodes": "*", "gpus": "1-3"}, "mig": {"enabled": True, "profiles": {}}}
    ]


def test_a_bad_node_selector() -> None:
    with pytest.raises(SpecError) as info:
        read_mig_parted(REFERENCE, "m.yaml", "all-disabled", nodes="a,,b")
    assert str(info.value) == "--nodes: empty term in selector 'a,,b'"


# ---- the command line -----------------------------------------------------------------------------

app = typer.Typer(pretty_exceptions_enable=False)


@app.callback()
def _root() -> None:
    """Test app holding only the spec commands."""


spec_cli.register(app)
runner = CliRunner()


def run(*args: str, stdin: str | None = None) -> Any:
    result = runner.invoke(app, list(args), input=stdin)
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def test_cli_prints_the_carve_section(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(REFERENCE)
    r = run("import", "mig-parted", str(config), "-c", "all-balanced", "--nodes", "gpu-h-*")
    assert r.exit_code == 0
    assert r.stdout.startswith(f"# imported from mig-parted config {config}, label all-balanced")
    assert "  - select: {nodes: gpu-h-*, gpus: {model: H200-141GB}}\n" in r.stdout
    assert r.stderr == ""
    out = tmp_path / "carve.yaml"
    r = run("import", "mig-parted", str(config), "--selected-config", "custom-config", "-o", str(out))
    # -o says what it wrote, on stderr (issue 28: it said nothing).
    assert r.exit_code == 0 and r.stdout == ""
    assert r.stderr == f"wrote label custom-config's carve: entries to {out}\n"
    assert "profiles: {1g.5gb: 7}" in out.read_text()


def test_cli_reads_stdin_and_reports_errors_one_per_line() -> None:
    r = run("import", "mig-parted", "-", stdin="version: v2\nmig-configs: {a: [{devices: all}]}\n")
    assert r.exit_code == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [
        "<stdin>:1:10: version: unknown version 'v2'; gpuops reads mig-parted's version: v1",
        "<stdin>:2:19: mig-configs.a[0]: missing required field 'mig-enabled'",
    ]


def test_cli_refusals(tmp_path: Path) -> None:
    r = run("import", "mig-parted", str(tmp_path / "none.yaml"))
    assert r.exit_code == 1 and r.stderr == f"{tmp_path / 'none.yaml'}: no such file\n"
    config = tmp_path / "config.yaml"
    config.write_text(REFERENCE)
    r = run("import", "mig-parted", str(config))
    assert r.exit_code == 1
    assert r.stderr == (
        f"{config}:2:1: mig-configs: the file has 3 configurations: choose one with -c; "
        "all-disabled, all-balanced, custom-config\n"
    )
    r = run("import", "mig-parted", str(config), "-c", "all-disabled", "-o", str(tmp_path / "no" / "x.yaml"))
    assert r.exit_code == 1 and "cannot write" in r.stderr
    r = run("import")
    assert r.exit_code in (0, 2) and "mig-parted" in r.output
