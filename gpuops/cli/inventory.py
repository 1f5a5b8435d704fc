"""`gpuops inventory -f fleet.yaml [--list | --host NAME]`: fleet.yaml as an Ansible inventory
(gpuops/spec/inventory.py), for `ansible-playbook -i ... ansible/bootstrap.yml`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from gpuops.cli.errors import fail
from gpuops.cli.fleet_file import load_or_fail
from gpuops.spec.dump import dump_yaml
from gpuops.spec.inventory import InventoryError, dynamic_host, dynamic_list, inventory


def register(app: typer.Typer) -> None:
    @app.command("inventory")
    def inventory_command(
        fleet_file: Path = typer.Option(..., "-f", "--fleet", help="fleet.yaml of the nodes."),
        as_list: bool = typer.Option(
            False, "--list", help="JSON, as a dynamic inventory script prints for --list."
        ),
        host: str | None = typer.Option(None, "--host", help="JSON: one node's variables."),
    ) -> None:
        """Write an Ansible inventory of the fleet's nodes: YAML by default; with --list or --host,
        what a dynamic inventory script answers. Nodes are in gpuops_nodes and in team_<team>."""
        if as_list and host is not None:
            fail("give either --list or --host NAME, not both", code=2)
        fleet = load_or_fail(fleet_file)
        try:
            if host is not None:
                try:
                    found = dynamic_host(fleet, host)
                except KeyError:
                    fail(f"{fleet_file}: no node named {host!r}", code=2)
                typer.echo(json.dumps(found, indent=2))
            elif as_list:
                typer.echo(json.dumps(dynamic_list(fleet), indent=2))
            else:
                typer.echo(dump_yaml(inventory(fleet), comment=f"gpuops inventory -f {fleet_file}"), nl=False)
        except InventoryError as exc:
            fail(f"{fleet_file}: {exc}")
