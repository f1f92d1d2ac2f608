"""pyvmm's modules import one another downward only: no circle, not even
through an import inside a function or under TYPE_CHECKING (a lower module
that needs something of a higher one is passed it, or the shared piece
lives lower). A package's __init__ importing its own submodules is the one
exception, as it makes no layer of its own."""

from __future__ import annotations

import ast
from pathlib import Path

from conftest import ROOT

PACKAGE = ROOT / "pyvmm"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The pyvmm modules ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # ``from pkg import sub`` imports the submodule when there is one.
            targets = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    if path.name == "__init__.py":  # its own submodules: the package itself
        found = {t for t in found if not t.startswith(name + ".")}
    return found


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_finder_sees_a_circle_through_a_function_level_import(tmp_path):
    known = {"pyvmm.a": tmp_path / "a.py", "pyvmm.b": tmp_path / "b.py"}
    known["pyvmm.a"].write_text("from pyvmm import b\n")
    known["pyvmm.b"].write_text("def later():\n    from pyvmm.a import thing\n")
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert circles(graph) == [["pyvmm.a", "pyvmm.b"]]


def test_no_module_of_pyvmm_imports_one_that_imports_it_back():
    known = all_modules()
    graph = {name: imported(name, path, known) for name, path in known.items()}
    assert circles(graph) == []
