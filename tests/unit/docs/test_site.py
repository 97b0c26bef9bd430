"""The documentation site builds with ``mkdocs build --strict``, as ``make docs`` does: a broken
link or anchor, a page missing from the nav, a snippet that includes nothing, an API reference
that does not resolve fails the suite. Built into a temporary directory, never the checkout."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

ENV = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config), "--site-dir", str(site)],
        cwd=config.parent,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_site_builds_strict(tmp_path: Path) -> None:
    built = mkdocs_build(REPO / "mkdocs.yml", tmp_path / "site")
    warnings = [line for line in built.stderr.splitlines() if line.startswith(("WARNING", "ERROR"))]
    assert built.returncode == 0 and warnings == [], "\n".join(warnings) or built.stderr[-3000:]
    for page in ("index.html", "tutorial/index.html", "reference/cli/index.html", "reference/api/index.html"):
        assert (tmp_path / "site" / page).is_file(), page
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    assert 'id="cairn.checkpoint.CheckpointRef"' in api  # mkdocstrings resolved the public names


def test_no_page_is_a_stub() -> None:
    stubs = [str(p.relative_to(REPO)) for p in (REPO / "docs").rglob("*.md") if "(being written)" in p.read_text()]
    assert stubs == []


def _strictness() -> dict[str, object]:
    """The settings of mkdocs.yml that make a broken link fail the build."""
    loader = type("Loader", (yaml.SafeLoader,), {})
    loader.add_multi_constructor("tag:yaml.org,2002:python/", lambda *_: None)  # mkdocs.yml's !!python/name
    config = yaml.load((REPO / "mkdocs.yml").read_text(), Loader=loader)  # noqa: S506 (a SafeLoader)
    return {key: config[key] for key in ("strict", "validation")}


@pytest.mark.parametrize(
    "page",
    [
        "See [the format](no-such-page.md).",
        "See [the manifest](other.md#no-such-heading).",
        "![a plot](images/no-such-plot.png)",
    ],
)
def test_the_settings_fail_a_broken_link(tmp_path: Path, page: str) -> None:
    """The same strictness on a two-page site: each kind of broken reference fails the build."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# Home\n\n{page}\n")
    (docs / "other.md").write_text("# Other\n\n## A heading\n")
    config = {"site_name": "t", "nav": ["index.md", "other.md"], **_strictness()}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    built = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert built.returncode != 0, built.stderr
    (docs / "index.md").write_text("# Home\n\nSee [a heading](other.md#a-heading).\n")
    assert mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site").returncode == 0
