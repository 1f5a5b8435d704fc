"""Entry point of the `gpuops` command: each command group lives in its own module, imported only
when that command runs or its help is shown, so a command pays only for what it uses at start."""

from __future__ import annotations

import importlib
import sys
from typing import Annotated, Any, NamedTuple

import typer
from typer.core import TyperCommand, TyperGroup, TyperOption
from typer.main import get_group

import gpuops
from gpuops.cli import output
from gpuops.cli.coercion import plain_coercion


class Entry(NamedTuple):
    name: str
    module: str
    summary: str  # the start of the command's own help, shown by `gpuops --help`


# Each module exposes register(app). Adding a command is adding its row here, in the order
# `gpuops --help` lists them; test_cli_lazy checks the rows against the modules' own commands.
COMMANDS = (
    Entry(
        "discover",
        "gpuops.cli.discover",
        "Show GPUs, MIG layout and processes of this host (--local) or of a fleet (-f, --prometheus).",
    ),
    Entry(
        "agent",
        "gpuops.cli.agent",
        "Serve the node agent protocol (used by the fleet over SSH, or by hand for debugging).",
    ),
    Entry(
        "validate",
        "gpuops.cli.spec",
        "Check fleet.yaml files: every mistake with its file:line:column (exit 1 if any)",
    ),
    Entry(
        "schema",
        "gpuops.cli.spec",
        "Print the JSON Schema of fleet.yaml, for editors (see docs/fleet-yaml.md).",
    ),
    Entry(
        "status",
        "gpuops.cli.fleet",
        "A live table of every node and team, refreshed at the interval until Ctrl-C.",
    ),
    Entry(
        "demo",
        "gpuops.cli.demo",
        "Start a simulated fleet on loopback and watch it live (q quits and stops the fleet).",
    ),
    Entry(
        "tui",
        "gpuops.cli.tui",
        "The live fleet view: every GPU and MIG slice per team, tenants, nodes, events (k9s keys).",
    ),
    Entry(
        "plan",
        "gpuops.cli.plan",
        "Show what apply would change (+ add, ~ change, - remove; disruptive actions marked).",
    ),
    Entry(
        "apply",
        "gpuops.cli.plan",
        "Make the live state what fleet.yaml says: per node concurrently, per GPU transactionally, "
        "verified after.",
    ),
    Entry(
        "assert",
        "gpuops.cli.plan",
        "Exit 0 when every node has what fleet.yaml says, 1 with the differences when not.",
    ),
    Entry(
        "export", "gpuops.cli.plan", "The live MIG, MPS and limiter settings as fleet.yaml carve: entries."
    ),
    Entry(
        "tenants",
        "gpuops.cli.tenants",
        "Per team over a window: GPUs owned, guaranteed, used (mean, p95, peak), borrowed, lent, "
        "idle capacity of its silo, memory; then each pool as a whole (guaranteed, used, idle).",
    ),
    Entry(
        "rebalance",
        "gpuops.cli.tenants",
        "Propose moving under-used silo GPUs into a pool, with guarantees no lower than each team's "
        "p95 use and a carving that enforces them.",
    ),
    Entry(
        "inventory",
        "gpuops.cli.inventory",
        "Write an Ansible inventory of the fleet's nodes: YAML by default; with --list or --host, "
        "what a dynamic inventory script answers.",
    ),
    Entry(
        "exporter",
        "gpuops.cli.exporter",
        "Serve the fleet's metrics for Prometheus: every node's GPUs and reachability over SSH, with "
        "fleet.yaml's teams, owners, pools and guarantees, until Ctrl-C.",
    ),
    Entry(
        "mig",
        "gpuops.cli.mig",
        "MIG profiles and placements: check a layout before carving a GPU (no GPU needed).",
    ),
    Entry("import", "gpuops.cli.spec", "Convert other tools' configurations into fleet.yaml settings."),
    Entry(
        "sim",
        "gpuops.cli.sim",
        "A simulated GPU fleet on this machine: real SSH servers on 127.0.0.1, one per node.",
    ),
    Entry(
        "limiter",
        "gpuops.cli.limiter",
        "Memory caps and compute shares per tenant for unmodified CUDA programs (interception limiter).",
    ),
)
_MODULE_OF = {entry.name: entry.module for entry in COMMANDS}


def load_module_commands(module: str) -> dict[str, Any]:
    """The click commands a command module registers, by name (imports the module)."""
    scratch = typer.Typer()
    importlib.import_module(module).register(scratch)
    return dict(get_group(scratch).commands)


# Typer's help names every option's Python type (`--json <bool>`, `--backend <str>`), which reads
# as if a flag took a value. Help shows what click (and argparse) show instead: nothing after a
# flag, an upper-case placeholder after an option that takes a value.
_CLICK_METAVARS = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": "BOOLEAN"}


def _plain_metavar(option: TyperOption, ctx: Any) -> None:
    if option.metavar is not None:
        return
    if option.is_flag or option.count:
        option.metavar = ""
        return
    shown = option.display_type_rich(ctx) or ""
    inner = shown[1:-1] if shown.startswith("<") and shown.endswith(">") else shown
    option.metavar = f"[{inner}]" if "|" in inner else _CLICK_METAVARS.get(inner, inner.upper())


def plain_metavars(command: Any, ctx: Any) -> None:
    """Every option of a command and of its subcommands, the help option included."""
    for param in [*command.params, command.get_help_option(ctx)]:
        if isinstance(param, TyperOption):
            _plain_metavar(param, ctx)
        plain_coercion(param)
    for sub in getattr(command, "commands", {}).values():
        plain_metavars(sub, ctx)


class LazyCommands(TyperGroup):
    """Lists every command from COMMANDS; imports a command's module only to run it or show its
    own help. Until then the listing holds a command that carries the summary alone."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for entry in COMMANDS:
            self.commands.setdefault(entry.name, TyperCommand(name=entry.name, help=entry.summary))
        self._loaded: set[str] = set()

    def get_params(self, ctx: Any) -> list[Any]:
        params = super().get_params(ctx)
        for param in params:
            if isinstance(param, TyperOption):
                _plain_metavar(param, ctx)
            plain_coercion(param)
        return params

    def resolve_command(self, ctx: Any, args: list[str]) -> tuple[str | None, Any, list[str]]:
        module = _MODULE_OF.get(args[0]) if args else None
        if module is not None and module not in self._loaded:
            # A module registers its commands as a set (spec: validate, schema, import).
            loaded = load_module_commands(module)
            for command in loaded.values():
                plain_metavars(command, ctx)
            self.commands.update(loaded)
            self._loaded.add(module)
        return super().resolve_command(ctx, args)


def _print_version(value: bool) -> None:
    if value:
        print(f"gpuops {gpuops.__version__}")
        raise typer.Exit()


def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    """Monitor, carve and pool GPU servers across teams."""


app = typer.Typer(
    name="gpuops",
    help="Monitor, carve and pool GPU servers across teams.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=LazyCommands,
    # Inherited by every command's context, so `gpuops <command> -h` works as well.
    context_settings={"help_option_names": ["-h", "--help"]},
    # A group needs a callback to be one when no command is registered up front.
    callback=_root,
)


# The root context's obj when gpuops runs as a program: a command may then hand the process over
# (`gpuops agent` becomes the node's entry); a caller in the same process (a test's CliRunner) keeps it.
AS_PROGRAM = "gpuops-program"


def main() -> None:
    output.install()
    try:
        try:
            app(obj=AS_PROGRAM)
        finally:
            # What is still buffered is written here, inside the handlers below, not at
            # interpreter exit where a failure is only "Exception ignored" and exit 120.
            sys.stdout.flush()
    except (output.OutputError, BrokenPipeError) as exc:
        output.give_up(exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
