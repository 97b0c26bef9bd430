"""House rules that reviewers would otherwise have to remember."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO


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
