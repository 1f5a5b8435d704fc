"""spec/ depends one way: the fleet model on the carve modules, never back at run time (they name
`Fleet` for type checking only), and no module hides an import inside a function."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

SPEC = Path(__file__).resolve().parents[2] / "gpuops" / "spec"

CYCLES = """
import grimp
graph = grimp.build_graph("gpuops", exclude_type_checking_imports=True, cache_dir=None)
spec = sorted(m for m in graph.modules if m.startswith("gpuops.spec."))
for a in spec:
    for b in sorted(graph.find_modules_directly_imported_by(a)):
        if b.startswith("gpuops.spec.") and graph.chain_exists(importer=b, imported=a):
            print(a, "<->", b)
"""


def test_no_run_time_import_cycle_in_spec() -> None:
    # a fresh interpreter: grimp reads the package the tests import, as it is on disk
    result = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def test_spec_imports_at_module_level_only() -> None:
    hidden = []
    for path in sorted(SPEC.glob("*.py")):
        tree = ast.parse(path.read_text())
        top = {id(n) for n in tree.body}
        top |= {
            id(n)
            for stmt in tree.body
            if isinstance(stmt, ast.If) and _type_checking(stmt)
            for n in stmt.body
        }
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                hidden.append(f"{path.name}:{node.lineno}")
    assert hidden == []
