"""No import cycle between gpuops modules (docs/architecture.md): each module can be read, tested
and moved after what it imports. Function-local imports count (they run too, only later); imports
under `if TYPE_CHECKING:` do not, since they never run."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import grimp
import pytest


def import_cycles(package: str) -> list[list[str]]:
    """The strongly connected groups of two or more modules of `package`, each sorted."""
    graph = grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        on_stack.add(module)
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for module in sorted(graph.modules):
        if module not in order:
            visit(module)
    return sorted(groups)


def _describe(package: str, group: list[str]) -> str:
    graph = grimp.build_graph(package, exclude_type_checking_imports=True, cache_dir=None)
    arrows = []
    for a in group:
        for b in group:
            if graph.direct_import_exists(importer=a, imported=b):
                lines = [str(d["line_number"]) for d in graph.get_import_details(importer=a, imported=b)]
                arrows.append(f"{a} -> {b} (l.{', '.join(lines)})")
    return "; ".join(arrows)


def test_gpuops_has_no_import_cycle() -> None:
    cycles = import_cycles("gpuops")
    assert not cycles, "\n".join(_describe("gpuops", group) for group in cycles)


@pytest.fixture
def scratch_package(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "cyclepkg"
    root.mkdir()
    (root / "__init__.py").write_text("")
    sys.path.insert(0, str(tmp_path))
    try:
        yield root
    finally:
        sys.path.remove(str(tmp_path))


def test_a_function_local_cycle_is_found(scratch_package: Path) -> None:
    (scratch_package / "a.py").write_text("import cyclepkg.b\n")
    (scratch_package / "b.py").write_text("def later():\n    from cyclepkg import a\n    return a\n")
    assert import_cycles("cyclepkg") == [["cyclepkg.a", "cyclepkg.b"]]


def test_a_type_checking_only_cycle_is_allowed(scratch_package: Path) -> None:
    (scratch_package / "a.py").write_text("import cyclepkg.b\n")
    (scratch_package / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cyclepkg.a import X\n"
    )
    assert import_cycles("cyclepkg") == []
