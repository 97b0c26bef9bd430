"""The benchmarks' registry against the files: every suite and section module is registered,
every registered one exists and imports as a module of the ``bench`` package (run from the
repository root, nothing on ``sys.path`` added), and the layers of ``bench/`` hold."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from bench.registry import BENCHMARKS, by_name
from tests.conftest import REPO

BENCH = REPO / "bench"


def _modules(folder: str) -> set[str]:
    return {p.stem for p in (BENCH / folder).glob("*.py") if p.stem != "__init__"}


def _functions(module: str) -> set[str]:
    path = REPO / (module.replace(".", "/") + ".py")
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def _bench_imports(path: Path) -> set[str]:
    """The ``bench.*`` modules a file imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bench"):
            out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("bench"))
    return out


def test_the_registry_names_exactly_the_suites_and_sections_present() -> None:
    registered = {(b.module or b.name) for b in BENCHMARKS}
    assert _modules("suites") == registered
    assert _modules("sections") == registered
    assert len({b.name for b in BENCHMARKS}) == len(BENCHMARKS)
    assert [b.section for b in BENCHMARKS] == list(range(1, len(BENCHMARKS) + 1))  # the document's order


def test_every_registered_module_imports_from_the_repository_root_alone() -> None:
    modules = [m for b in BENCHMARKS for m in (b.suite, b.renderer)] + ["bench.run_all", "bench.report"]
    code = "import importlib, sys\nfor name in sys.argv[1:]:\n    importlib.import_module(name)\n"
    done = subprocess.run(
        [sys.executable, "-E", "-s", "-c", code, *modules],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr


def test_no_bench_file_patches_sys_path() -> None:
    assert not [p for p in BENCH.rglob("*.py") if "sys.path" in p.read_text()]


def test_each_module_has_what_the_runner_and_the_report_call() -> None:
    for b in BENCHMARKS:
        assert "main" in _functions(b.suite), b.name
        section = _functions(b.renderer)
        assert "section" in section, b.name
        assert ("plot" in section) == (b.plot is not None), b.name
        assert ("title_fields" in section) == ("{" in b.title), b.name


def test_measuring_never_imports_rendering_and_the_harness_imports_no_benchmark() -> None:
    for path in (BENCH / "suites").glob("*.py"):
        assert not {m for m in _bench_imports(path) if m.startswith("bench.sections")}, path
    for path in (BENCH / "harness").glob("*.py"):
        assert {m for m in _bench_imports(path) if not m.startswith("bench.harness")} == set(), path


def test_by_name_keeps_the_order_asked_and_refuses_an_unknown_name() -> None:
    assert [b.name for b in by_name(["tier", "store"])] == ["tier", "store"]
    with pytest.raises(ValueError, match="nope"):
        by_name(["nope"])
