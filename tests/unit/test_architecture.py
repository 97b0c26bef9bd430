"""House rules that reviewers would otherwise have to remember: the layering (the app layers over
``cairn``, and ``cairn``'s own layers, ``LAYERS``), no import cycles (an import inside a function
counts), package docstrings that list their modules, small modules, nothing that unpickles."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGES = ("cairn", "activities", "workflows", "workers")
MAX_MODULE_LINES = 450
"""A product module past this holds more than one concern: split it along its seams."""
LAYERS = (
    ("errors",),
    ("faults", "jsonio", "numerics", "sampler", "corpus", "checkpoint_interval"),
    ("config", "config_files", "state", "data"),
    ("stores",),
    ("checkpoint",),
    ("distributed", "effects", "interop", "trackers"),
    ("trainers",),
    ("training",),
    ("session", "models"),
    ("runs", "gang"),
)
"""``cairn``'s packages and top-level modules, lowest layer first (the table in ``cairn``'s
docstring): each imports only from its own layer or a lower one. ``cairn`` itself (its lazy
public names) is above them all."""


def _modules(packages: tuple[str, ...] = PACKAGES, root: Path = REPO) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for package in packages:
        for path in (root / package).rglob("*.py"):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join(parts)] = path
    return out


def _runtime_nodes(tree: ast.AST, *, type_checking: bool = False) -> Iterator[ast.AST]:
    """Every node that can run: ``if TYPE_CHECKING:`` blocks (annotations only) are left out,
    unless ``type_checking``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if (
            not type_checking
            and isinstance(node, ast.If)
            and (
                (isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING")
                or (isinstance(node.test, ast.Attribute) and node.test.attr == "TYPE_CHECKING")
            )
        ):
            stack.extend(node.orelse)
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def import_graph(modules: dict[str, Path], *, type_checking: bool = False) -> dict[str, set[str]]:
    """Module -> the project modules it imports, at module level or inside functions alike (and,
    with ``type_checking``, under ``if TYPE_CHECKING:`` too)."""

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in _runtime_nodes(tree, type_checking=type_checking):
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


def test_no_import_cycles_even_through_type_checking_imports() -> None:
    """Annotations count too: a module whose types need a higher one types against a protocol."""
    assert import_cycles(import_graph(_modules(), type_checking=True)) == []


def test_the_strict_cycle_check_sees_a_cycle_through_type_checking(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import g\n")
    (tmp_path / "pkg" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\ndef g(): ...\n"
    )
    modules = _modules(("pkg",), tmp_path)
    assert import_cycles(import_graph(modules)) == []
    assert import_cycles(import_graph(modules, type_checking=True)) == [["pkg.a", "pkg.b"]]


def layer_violations(graph: dict[str, set[str]], root: str, layers: tuple[tuple[str, ...], ...]) -> list[str]:
    """``A -> B`` for every import of ``root``'s modules that reaches a higher layer than the
    importer's (a module is in the layer of ``root``'s package or module it belongs to; ``root``
    itself is above every layer)."""
    layer = {name: i for i, names in enumerate(layers) for name in names}

    def of(module: str) -> int:
        parts = module.split(".")
        return len(layers) if len(parts) == 1 else layer[parts[1]]

    return sorted(
        f"{source} -> {target}"
        for source, targets in graph.items()
        if source.split(".")[0] == root
        for target in targets
        if target.split(".")[0] == root and of(target) > of(source)
    )


def _children(package: Path) -> set[str]:
    """A package's modules and subpackages, by name."""
    modules = {p.stem for p in package.glob("*.py") if p.name != "__init__.py"}
    return modules | {p.name for p in package.iterdir() if (p / "__init__.py").is_file()}


def test_every_part_of_cairn_has_one_layer() -> None:
    names = [name for names in LAYERS for name in names]
    assert len(names) == len(set(names))
    assert set(names) == _children(REPO / "cairn")


def test_cairn_imports_only_from_its_own_layer_or_lower() -> None:
    """Function-level imports count; annotations (``if TYPE_CHECKING:``) do not."""
    assert layer_violations(import_graph(_modules(("cairn",))), "cairn", LAYERS) == []


def test_cairns_annotations_respect_the_layers_too() -> None:
    """A lower layer never imports a higher one, not even under ``TYPE_CHECKING``: it types against
    a protocol of its own (``cairn.interop.exchange``)."""
    assert layer_violations(import_graph(_modules(("cairn",)), type_checking=True), "cairn", LAYERS) == []


def test_the_layer_check_sees_an_upward_import_hidden_in_a_function(tmp_path: Path) -> None:
    (tmp_path / "pkg" / "low").mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "low" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "low" / "part.py").write_text("def f():\n    from pkg.high import g\n")
    (tmp_path / "pkg" / "high.py").write_text("from pkg.low.part import f\ndef g(): ...\n")
    (tmp_path / "pkg" / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.high import g\n"
    )
    graph = import_graph(_modules(("pkg",), tmp_path))
    assert layer_violations(graph, "pkg", (("low", "typed"), ("high",))) == ["pkg.low.part -> pkg.high"]
    assert layer_violations(graph, "pkg", (("low",), ("high", "typed"))) == ["pkg.low.part -> pkg.high"]


def _docstring(package: Path) -> str:
    return ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""


def test_cairns_docstring_holds_the_layer_table() -> None:
    rows = re.findall(r"^ {4}(\d+)  ([a-z_]+(?:, [a-z_]+)*)(?: {2,}.*)?$", _docstring(REPO / "cairn"), re.M)
    assert [(int(n), tuple(names.split(", "))) for n, names in rows] == list(enumerate(LAYERS))


def _listed_modules(docstring: str) -> set[str] | None:
    """The ``name``s of a package docstring's paragraph that starts ``Modules:`` (None: no such paragraph)."""
    paragraph = next((p for p in docstring.split("\n\n") if p.startswith("Modules:")), None)
    return None if paragraph is None else set(re.findall(r"``([a-z_][a-z0-9_]*)``", paragraph))


@pytest.mark.parametrize(
    "package", sorted(str(p.parent.relative_to(REPO)) for p in (REPO / "cairn").glob("*/**/__init__.py"))
)
def test_a_package_docstring_lists_exactly_its_modules(package: str) -> None:
    """Every package of ``cairn`` says what its modules own in a ``Modules:`` paragraph: each
    module there exists, and each module is there."""
    assert _listed_modules(_docstring(REPO / package)) == _children(REPO / package)


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
