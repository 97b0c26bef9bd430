"""The suite's own guards (``tests/conftest.py``): the checkout guard sees new files but not the
tools' caches, and the memory bound of the hostile-input helpers is really measured."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import numpy as np

from tests.conftest import checkout_files


def test_checkout_guard_sees_new_files_but_not_tool_caches(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "a.py").write_text("")
    before = checkout_files(tmp_path)
    (tmp_path / ".pytest_cache").mkdir()
    (tmp_path / "src" / "__pycache__").mkdir()
    assert checkout_files(tmp_path) == before
    (tmp_path / ".cairn" / "store").mkdir(parents=True)
    assert checkout_files(tmp_path) - before == {".cairn", ".cairn/store"}


def test_memory_bound_of_refusals_is_measured() -> None:
    """The helpers above measure allocations: a 100 MiB array is seen (sanity of tracemalloc)."""
    tracemalloc.start()
    try:
        np.ones(100 << 17)
        assert tracemalloc.get_traced_memory()[1] >= 100 << 20
    finally:
        tracemalloc.stop()
