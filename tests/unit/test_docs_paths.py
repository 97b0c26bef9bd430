"""The docs name files that exist: every repository path a page writes in backticks
(`cairn/...`, `workers/...`, `bench/...`) is there, so a move or rename cannot leave a page
pointing at nothing (placeholders in capitals, like `bench/suites/NAME.py`, are not paths)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.conftest import REPO

PAGES = sorted([REPO / "README.md", REPO / "BENCHMARKS.md", REPO / "CHANGELOG.md", *(REPO / "docs").rglob("*.md")])
_PATH = re.compile(r"`((?:cairn|workers|activities|workflows|bench|tests|deploy|examples|docs)/[A-Za-z0-9_./-]+)`")


def named_paths(text: str) -> set[str]:
    return {p for p in _PATH.findall(text) if not re.search(r"(^|/)[A-Z]+(\.|/|$)", p)}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_a_page_names_exists(page: Path) -> None:
    assert sorted(p for p in named_paths(page.read_text()) if not (REPO / p).exists()) == []


def test_the_check_sees_a_missing_path() -> None:
    text = "see `cairn/checkpoint/no_such_module.py` and `bench/suites/NAME.py`"
    assert named_paths(text) == {"cairn/checkpoint/no_such_module.py"}
