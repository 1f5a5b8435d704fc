"""`gpuops validate`, `gpuops schema` and `gpuops import`: check fleet.yaml files, print their
JSON Schema, convert other tools' configurations into fleet.yaml.

gpuops validate FLEET.yaml... [--json]   every mistake as file:line:column: path: message (exit 1)
gpuops schema [-o FILE]                  the JSON Schema, for editors (yaml-language-server)
gpuops import mig-parted CONFIG [-c/--label LABEL | --all] [--nodes SELECTOR] [-o FILE|DIR]
                                         a mig-parted v1 config (or the Kubernetes ConfigMap
                                         holding one) as fleet.yaml carve: entries
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from gpuops.spec import Fleet, SpecError, SpecIssue, fleet_json_schema, load_fleet
from gpuops.spec.carve_checks import carve_warnings
from gpuops.spec.errors import printable
from gpuops.spec.migparted import Imported, read_mig_parted, read_mig_parted_all, render_carve
from gpuops.spec.source import decode, read_text

_SAFE_FILE_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._+-]{0,200}\Z")

import_app = typer.Typer(
    name="import",
    help="Convert other tools' configurations into fleet.yaml settings.",
    no_args_is_help=True,
)


def register(app: typer.Typer) -> None:
    app.command("validate")(validate)
    app.command("schema")(schema)
    app.add_typer(import_app, name="import")


def _say(text: str, *, err: bool = False) -> None:
    stream = sys.stderr if err else sys.stdout
    encoding = getattr(stream, "encoding", None) or "utf-8"
    try:
        text.encode(encoding)
    except (UnicodeEncodeError, LookupError):
        text = text.replace("\u2014", "-").encode("ascii", "backslashreplace").decode("ascii")
    typer.echo(text, err=err)


def _plural(count: int, word: str) -> str:
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _summary(fleet: Fleet) -> str:
    return f"{_plural(len(fleet.nodes), 'node')}, {_plural(len(fleet.teams), 'team')}"


def _check(name: str) -> tuple[Fleet | None, list[SpecIssue]]:
    try:
        return load_fleet(name), []
    except SpecError as exc:
        return None, exc.errors
    except Exception as exc:  # a bug must still not print a traceback
        what = printable(f"{type(exc).__name__}: {exc}")
        return None, [SpecIssue(name, 0, 0, "", f"internal error ({what}); please report this")]


def validate(
    files: Annotated[
        list[str], typer.Argument(metavar="FLEET.yaml...", help="Files to check ('-' reads standard input).")
    ],
    as_json: Annotated[
        bool, typer.Option("--json", help="Print one JSON object with every file's result and errors.")
    ] = False,
) -> None:
    """Check fleet.yaml files: every mistake with its file:line:column (exit 1 if any). Warnings
    (limiter memory caps that are no promise, or smaller than one CUDA context) go to stderr and
    do not change the exit code."""
    failed = False
    results: list[dict[str, Any]] = []
    for name in files:
        fleet, issues = _check(name)
        failed = failed or fleet is None
        warnings = carve_warnings(fleet) if fleet is not None else []
        if as_json:
            entry: dict[str, Any] = {"file": name, "ok": fleet is not None}
            if fleet is not None:
                entry.update(nodes=len(fleet.nodes), teams=len(fleet.teams), warnings=warnings)
            entry["errors"] = [issue.to_json() for issue in issues]
            results.append(entry)
        elif fleet is not None:
            for line in warnings:
                _say(f"warning: {line}", err=True)
            _say(f"{printable(name)}: OK \u2014 {_summary(fleet)}")
        else:
            for issue in issues:
                _say(str(issue), err=True)
    if as_json:
        _say(json.dumps({"ok": not failed, "files": results}, indent=2))
    if failed:
        raise typer.Exit(1)


def schema(
    output: Annotated[
        Optional[Path],
        typer.Option("--output", "-o", help="Write the schema to this file instead of stdout."),
    ] = None,
) -> None:
    """Print the JSON Schema of fleet.yaml, for editors (see docs/fleet-yaml.md)."""
    text = json.dumps(fleet_json_schema(), indent=2) + "\n"
    if output is None:
        _say(text.rstrip("\n"))
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        _say(printable(f"{output}: cannot write: {exc.strerror or exc}"), err=True)
        raise typer.Exit(1) from None


@import_app.command("mig-parted")
def import_mig_parted(
    config: Annotated[
        str, typer.Argument(metavar="CONFIG", help="mig-parted v1 config file ('-' reads standard input).")
    ],
    label: Annotated[
        Optional[str],
        typer.Option(
            "--selected-config",
            "--label",
            "-c",
            "-l",
            help="The mig-configs label to convert (optional if there is one).",
        ),
    ] = None,
    every: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Convert every label: with -o DIR one DIR/LABEL.yaml each, else one YAML document each.",
        ),
    ] = False,
    nodes: Annotated[
        str, typer.Option("--nodes", "-n", help="Node selector the entries apply to (default: every node).")
    ] = "*",
    output: Annotated[
        Optional[Path],
        typer.Option(
            "--output", "-o", help="Write the carve: section to this file (with --all: this folder)."
        ),
    ] = None,
) -> None:
    """Convert a mig-parted config (one label, or --all) into fleet.yaml carve: entries.

    The entries are printed to paste under carve: (or written with -o). Mistakes: one located
    line each on stderr, exit 1."""
    name = "<stdin>" if config == "-" else config
    if config == "-":
        text, problem = decode(sys.stdin.buffer.read(), name)
    else:
        text, problem = read_text(config, name)
    if problem is not None or text is None:
        _say(str(problem or SpecIssue(name, 0, 0, "", "cannot read")), err=True)
        raise typer.Exit(1)
    if every and label is not None:
        _say("--all and --label exclude each other: convert one label or all of them", err=True)
        raise typer.Exit(2)
    try:
        if every:
            results = read_mig_parted_all(text, name, nodes=nodes)
        else:
            results = [read_mig_parted(text, name, label, nodes=nodes)]
    except SpecError as exc:
        for issue in exc.errors:
            _say(str(issue), err=True)
        raise typer.Exit(1) from None
    except Exception as exc:  # a bug must still not print a traceback
        _say(printable(f"{name}: internal error ({type(exc).__name__}: {exc}); please report this"), err=True)
        raise typer.Exit(1) from None
    for imported in results:
        for warning in imported.warnings:
            _say(f"warning: {warning}", err=True)
    if every:
        _write_all(results, name, output)
        return
    text = render_carve(results[0], source=name)
    if output is None:
        _say(text.rstrip("\n"))
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        _say(printable(f"{output}: cannot write: {exc.strerror or exc}"), err=True)
        raise typer.Exit(1) from None
    _say(printable(f"wrote label {results[0].label}'s carve: entries to {output}"), err=True)


def _write_all(results: list[Imported], source: str, folder: Path | None) -> None:
    """One YAML document per label on stdout, or one LABEL.yaml per label in `folder` (checked
    before anything is written, so a refused name leaves the folder as it was)."""
    if folder is None:
        _say("\n".join("---\n" + render_carve(i, source=source).rstrip("\n") for i in results))
        return
    unsafe = [i.label for i in results if not _SAFE_FILE_RE.match(i.label)]
    if unsafe:
        _say(printable(f"{source}: labels that cannot be file names: {', '.join(unsafe)}"), err=True)
        raise typer.Exit(1)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for i in results:
            (folder / f"{i.label}.yaml").write_text(render_carve(i, source=source), encoding="utf-8")
    except OSError as exc:
        _say(printable(f"{folder}: cannot write: {exc.strerror or exc}"), err=True)
        raise typer.Exit(1) from None
    _say(printable(f"wrote {len(results)} labels' carve: entries to {folder}/LABEL.yaml"), err=True)
