"""Small Markdown helpers the generated pages share: table cells, docstring text, anchors."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

__all__ = ["cell", "prose", "slug", "table"]

_RST_LITERAL = re.compile(r"``([^`]+)``")


def prose(text: str | None) -> str:
    """A docstring or help text as Markdown: reStructuredText's ````x```` literals as `` `x` ``."""
    return _RST_LITERAL.sub(r"`\1`", text or "").strip()


def cell(text: object) -> str:
    """``text`` as one table cell: one line, pipes escaped."""
    return " ".join(prose(str(text)).split()).replace("|", "\\|")


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def slug(text: str) -> str:
    """The anchor Python-Markdown's toc extension gives a heading of ``text``."""
    text = re.sub(r"[^\w\s-]", "", text.strip().lower())
    return re.sub(r"[-\s]+", "-", text).strip("-")
