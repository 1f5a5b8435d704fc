"""Entry point of the `gpuops` command: each command group lives in its own module."""

from __future__ import annotations

import importlib
import sys

import typer

from gpuops.cli import output

app = typer.Typer(
    name="gpuops",
    help="Monitor, carve and pool GPU servers across teams.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Each module exposes register(app); adding a command is adding a module here.
_COMMAND_MODULES = (
    "gpuops.cli.discover",
    "gpuops.cli.agent",
    "gpuops.cli.mig",
    "gpuops.cli.spec",
    "gpuops.cli.fleet",
    "gpuops.cli.sim",
    "gpuops.cli.demo",
    "gpuops.cli.tui",
    "gpuops.cli.limiter",
    "gpuops.cli.plan",
    "gpuops.cli.tenants",
    "gpuops.cli.inventory",
    "gpuops.cli.inventory",
    "gpuops.cli.exporter",
)

for _name in _COMMAND_MODULES:
    importlib.import_module(_name).register(app)


def main() -> None:
    output.install()
    try:
        try:
            app()
        finally:
            # What is still buffered is written here, inside the handlers below, not at
            # interpreter exit where a failure is only "Exception ignored" and exit 120.
            sys.stdout.flush()
    except (output.OutputError, BrokenPipeError) as exc:
        output.give_up(exc)
        sys.exit(1)


if __name__ == "__main__":
    main()
