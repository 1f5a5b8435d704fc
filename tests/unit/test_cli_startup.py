"""What a command's start leaves out must not change what it does (docs/benchmarks.md, "Command
start-up"): field descriptions read only for the JSON Schema, validators built on first use."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpuops.spec import Fleet, fleet_json_schema, parse_fleet

REPO = Path(__file__).resolve().parents[2]
FLEET = """\
version: 1
ssh: {user: ops}
teams: {vision: {description: Vision team}}
nodes:
  - {name: gpu-a-01, host: 10.0.0.1, gpus: {"0-3": vision}}
carve:
  - select: {nodes: gpu-a-01, gpus: {indices: "0"}}
    mig: {enabled: true, profiles: {3g.40gb: 2}}
"""


def test_the_schema_is_the_same_after_models_were_built_for_validation() -> None:
    fleet = parse_fleet(FLEET, "f.yaml")  # builds the validators (without descriptions)
    fleet.model_dump()
    in_process = fleet_json_schema()
    fresh = subprocess.run(
        [sys.executable, "-m", "gpuops", "schema"], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert fresh.returncode == 0, fresh.stderr
    assert json.loads(fresh.stdout) == in_process
    assert json.dumps(in_process, indent=2) == fresh.stdout.rstrip("\n")
    # Descriptions come from the attribute docstrings, inherited ones included.
    defs = in_process["$defs"]
    assert defs["SshOptions"]["properties"]["user"]["description"]
    assert defs["SshDefaults"]["properties"]["user"] == defs["SshOptions"]["properties"]["user"]
    assert (
        Fleet.model_fields["carve"].description and "Desired state" in Fleet.model_fields["carve"].description
    )
    assert parse_fleet(FLEET, "f.yaml") == fleet


VALUES = [
    *["0", "7", "007", "-5", "+5", " 5", "5 ", "1_000", "1e1", "30.0", "-1.5", ".5", "5.", "inf", "nan"],
    *["", "abc", "true", "0x10", "99999999999999999999999", "123456789.123456789", "٣"],
    *[None, 0, 5, -1, 5.0, 2.5, True, False, b"x", ("a", "b"), [], ["x"], ("a", 1)],
    *[".", "a/", "~", "/", "/tmp", "/nonexistent/x", "-", "x\x00"],
]


def _outcome(runtime: Any, value: Any, param: Any, ctx: Any) -> tuple[str, Any]:
    try:
        result = runtime.coerce(value, param=param, ctx=ctx)
    except Exception as exc:  # the same error, word for word
        return type(exc).__name__, exc.format_message() if hasattr(exc, "format_message") else str(exc)
    return type(result).__name__, repr(result)  # repr: nan is nan


def test_plain_coercion_gives_what_typers_adapter_gives(tmp_path: Path) -> None:
    from typer._coercion import build_runtime_param

    from gpuops.cli.coercion import PlainRuntimeParam, _handled
    from gpuops.cli.main import COMMANDS, LazyCommands, load_module_commands

    afile = tmp_path / "f.yaml"
    afile.write_text("x")
    values = [*VALUES, str(afile), str(tmp_path)]
    root = LazyCommands(name="gpuops", context_settings={"help_option_names": ["-h", "--help"]})
    root_ctx = root.make_context("gpuops", [], resilient_parsing=True)
    checked = set()
    for module in sorted({entry.module for entry in COMMANDS}):
        pending = list(load_module_commands(module).values())
        while pending:
            command = pending.pop()
            pending.extend(getattr(command, "commands", {}).values())
            ctx = command.make_context(command.name, [], parent=root_ctx, resilient_parsing=True)
            for param in [*command.params, command.get_help_option(ctx)]:
                descriptor = param.type_descriptor
                if not _handled(descriptor):
                    continue
                plain = PlainRuntimeParam(
                    parameter_info=descriptor.parameter_info,
                    annotation=descriptor.annotation,
                    descriptor=descriptor,
                )
                typers = build_runtime_param(descriptor)
                checked.add(repr(descriptor.annotation))
                for value in values:
                    expected = _outcome(typers, value, param, ctx)
                    assert _outcome(plain, value, param, ctx) == expected, (command.name, param.name, value)
    assert checked == {
        "<class 'str'>",
        "<class 'bool'>",
        "<class 'int'>",
        "<class 'float'>",
        "<class 'pathlib.Path'>",
        "list[str]",
    }
