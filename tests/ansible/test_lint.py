"""ansible/ is clean for ansible-lint's production profile and yamllint, and parses for
ansible-playbook; each role has the standard layout with an argument spec."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.ansible.helpers import ANSIBLE_DIR, PLAYBOOK, ansible_env, ansible_tool

ROLES = ("gpuops_facts", "gpuops_node", "gpuops_limiter", "gpuops_mps")


def run(argv: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, cwd=ANSIBLE_DIR, capture_output=True, text=True, timeout=120, env=ansible_env(tmp_path)
    )


def test_ansible_lint_production_profile(tmp_path: Path) -> None:
    r = run([ansible_tool("ansible-lint"), "--profile", "production", "--offline", "--nocolor"], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Profile 'production' was required, and it passed" in r.stdout + r.stderr


def test_yamllint(tmp_path: Path) -> None:
    r = run([ansible_tool("yamllint"), "--strict", "."], tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr


def test_syntax_check(tmp_path: Path) -> None:
    inventory = tmp_path / "hosts.yml"
    inventory.write_text("all:\n  children:\n    gpuops_nodes:\n      hosts:\n        n1:\n")
    r = run(
        [ansible_tool("ansible-playbook"), "--syntax-check", "-i", str(inventory), str(PLAYBOOK)], tmp_path
    )
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("role", ROLES)
def test_role_layout(role: str) -> None:
    base = ANSIBLE_DIR / "roles" / role
    for part in ("defaults/main.yml", "tasks/main.yml", "meta/main.yml", "meta/argument_specs.yml"):
        assert (base / part).is_file(), f"{role}: no {part}"
