"""The shape of the package: no import cycle, no module over 400 lines."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tidings"
MAX_LINES = 400
# Modules allowed past MAX_LINES, each with its reason. None today.
KNOWN_LONG: set[str] = set()


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def sources() -> dict[str, Path]:
    return {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def imported(tree: ast.Module, name: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """The tidings modules a module imports, anywhere in it: at the top, in
    functions, and under ``if TYPE_CHECKING`` (a cycle of type-only imports
    is a cycle too)."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            # "from a.b import c" imports a.b.c when that is a module, else a.b.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                for alias in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("tidings") and target != name:
                yield target


def import_graph() -> dict[str, set[str]]:
    modules = sources()
    known = set(modules)
    return {
        name: set(
            imported(ast.parse(path.read_text()), name, path.name == "__init__.py", known)
        )
        for name, path in modules.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph.get(node, ())):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 40 and graph["tidings.http.contacts"] >= {"tidings.storage.contacts"}
    assert cycles(graph) == []


def test_the_cycle_check_sees_type_only_imports() -> None:
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from tidings.b import B\n"
    known = {"tidings.a", "tidings.b"}
    graph = {
        "tidings.a": set(imported(ast.parse(source), "tidings.a", False, known)),
        "tidings.b": set(imported(ast.parse("from . import a"), "tidings.b", False, known)),
    }
    assert cycles(graph) == [["tidings.a", "tidings.b"]]


def test_no_module_over_400_lines() -> None:
    long = {
        str(path.relative_to(PACKAGE.parent)): count
        for path in PACKAGE.rglob("*.py")
        if (count := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert {name: n for name, n in long.items() if name not in KNOWN_LONG} == {}
