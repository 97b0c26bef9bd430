"""House rules that reviewers would otherwise have to remember: the layering, no import cycles
(an import inside a function counts), small modules, nothing that unpickles."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("cairn", "activities", "workflows", "workers")
MAX_MODULE_LINES = 450
"""A product module past this holds more than one concern: split it along its seams."""


def _modules(packages: tuple[str, ...] = PACKAGES, root: Path = REPO) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node that can run: ``if TYPE_CHECKING:`` blocks (annotations only) are left out."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and (
            (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
            or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
        ):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at module level or inside functions alike."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in _runtime_nodes(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                edges.update(t for a in node.names if (t := resolve(a.name)))
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, base] if base else parts)
                for alias in node.names:
                    full = f"{base}.{alias.name}"
                    target = full if full in modules else resolve(base)
                    if target:
                        edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    cycles: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    cycles.append(sorted(component))
    return cycles


def test_no_import_cycles_among_the_projects_modules() -> None:
    assert import_cycles(import_graph(_modules())) == []


def test_the_cycle_check_sees_a_cycle_hidden_in_a_function(tmp_path: Path) -> None:
    """The check can fail: a module-level import one way and a function-level import back."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import g\n")
    (tmp_path / "pkg" / "b.py").write_text("def g():\n    from pkg import a\n")
    (tmp_path / "pkg" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import g\n"
    )
    graph = import_graph(_modules(("pkg",), tmp_path))
    assert import_cycles(graph) == [["pkg.a", "pkg.b"]]
    assert graph["pkg.c"] == set()  # annotations only: never imported at run time


@pytest.mark.parametrize("package", PACKAGES)
def test_product_modules_stay_small(package: str) -> None:
    sizes = {name: len(path.read_text().splitlines()) for name, path in _modules((package,)).items()}
    assert {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES} == {}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_core_library_never_imports_temporalio() -> None:
    offenders = [p for p in (REPO / "cairn").rglob("*.py") if "temporalio" in _imports(p)]
    assert offenders == []


def test_core_library_does_not_reach_up_into_the_app_layers() -> None:
    for path in (REPO / "cairn").rglob("*.py"):
        assert not _imports(path) & {"workflows", "activities", "workers"}, path


def test_activities_and_workflows_never_import_the_worker_processes() -> None:
    """Data flows one way: CLI and worker -> workflow/activity -> cairn."""
    for folder in ("activities", "workflows"):
        for path in (REPO / folder).rglob("*.py"):
            assert "workers" not in _imports(path), path


def _calls(path: Path) -> set[str]:
    """Dotted names of every function called in a module (``torch.load``, ``np.load`` ...)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            parts = []
            func = node.func
            while isinstance(func, ast.Attribute):
                parts.append(func.attr)
                func = func.value
            if isinstance(func, ast.Name):
                parts.append(func.id)
            names.add(".".join(reversed(parts)))
    return names


def test_nothing_unpickles() -> None:
    for folder in ("cairn", "workflows", "activities", "workers", "examples"):
        for path in (REPO / folder).rglob("*.py"):
            text = path.read_text()
            assert "pickle" not in _imports(path), path
            assert "allow_pickle=True" not in text, path
            # torch.load unpickles (even weights_only is a restricted unpickler): the adapter
            # reads raw tensors and JSON only.
            assert not {"torch.load", "torch.serialization.load"} & _calls(path), path
