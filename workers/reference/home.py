"""The site's home page: the README itself, its links turned from repository paths
(``docs/how-to/runs.md``, ``BENCHMARKS.md``) into the site's (``how-to/runs.md``,
``benchmarks.md``), so the landing page and the site's home never drift apart."""

from __future__ import annotations

import re
from pathlib import Path

__all__ = ["LINKS", "page"]

LINKS = {"docs/": "", "BENCHMARKS.md": "benchmarks.md", "CHANGELOG.md": "changelog.md"}
"""Repository path prefixes in the README's links, and what they are on the site."""

_LINK = re.compile(r"(\]\()([^)#\s]+)")


def _site_path(match: re.Match[str]) -> str:
    target = match.group(2)
    for prefix, replacement in LINKS.items():
        if target.startswith(prefix):
            return match.group(1) + replacement + target[len(prefix) :]
    return match.group(0)


def page(readme: str | None = None) -> str:
    """The home page's Markdown from the README's (by default, the checkout's README.md)."""
    if readme is None:
        readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    return _LINK.sub(_site_path, readme)
