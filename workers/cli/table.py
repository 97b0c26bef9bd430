"""An aligned text table for the terminal: every column as wide as its widest cell, numbers
right-aligned, so each row's columns start at the same offset whatever the cells hold.

Width is measured in terminal cells, not characters: East Asian wide and full-width characters
take two, combining marks none. Control and format characters (a newline, an ANSI escape, a
right-to-left override in a tensor name) would break the row or reorder what follows it on the
screen, so they are shown escaped (``\\n``, ``\\x1b``, ``\\u202e``). Pure formatting: no I/O.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Collection, Sequence
from numbers import Real

__all__ = ["Cell", "MISSING", "cell_text", "display_width", "table"]

Cell = str | int | float | None
"""A table cell: text, a number (right-aligned when its whole column is numbers) or None."""

MISSING = "-"
"""What a ``None`` cell shows."""

_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _safe_char(ch: str) -> str:
    if ch in _ESCAPES:
        return _ESCAPES[ch]
    if unicodedata.category(ch)[0] == "C":  # control, format, surrogate, private use, unassigned
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    return ch


def cell_text(value: Cell) -> str:
    """What a cell shows: ``None`` as ``-``, numbers as written, text with control and format
    characters escaped (one line, nothing the terminal would act on)."""
    if value is None:
        return MISSING
    text = value if isinstance(value, str) else str(value)
    if text.isprintable():  # the common case: nothing to escape
        return text
    return "".join(_safe_char(ch) for ch in text)


def display_width(text: str) -> int:
    """Terminal cells ``text`` takes (after ``cell_text``): wide characters 2, combining 0."""
    if text.isascii():
        return len(text)
    width = 0
    for ch in text:
        if unicodedata.combining(ch):
            continue
        width += 2 if unicodedata.east_asian_width(ch) in ("W", "F") else 1
    return width


def _is_number(value: Cell) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


def _numeric_column(values: Sequence[Cell]) -> bool:
    """Numbers, with perhaps some ``None``: at least one number and no text."""
    return any(_is_number(v) for v in values) and all(_is_number(v) or v is None for v in values)


def table(
    headers: Sequence[str],
    rows: Sequence[Sequence[Cell]],
    *,
    right: Collection[int] = (),
    indent: str = "",
    gap: int = 2,
) -> list[str]:
    """The lines of a table: a header row, then one line per row (no trailing spaces).

    A column is right-aligned when it is listed in ``right`` (by index: numbers already
    formatted as text, such as ``12,680``) or when its cells are numbers (``None`` aside);
    its header is aligned the same way. Every row must have one cell per header."""
    ncols = len(headers)
    for i, row in enumerate(rows):
        if len(row) != ncols:
            raise ValueError(f"row {i} has {len(row)} cells, the table has {ncols} columns")
    texts = [[cell_text(h) for h in headers], *([cell_text(v) for v in row] for row in rows)]
    widths = [max(display_width(line[c]) for line in texts) for c in range(ncols)]
    aligned_right = [c in right or _numeric_column([row[c] for row in rows]) for c in range(ncols)]
    lines = []
    for line in texts:
        out = []
        for c, text in enumerate(line):
            pad = " " * (widths[c] - display_width(text))
            out.append(pad + text if aligned_right[c] else text + pad)
        lines.append((indent + (" " * gap).join(out)).rstrip())
    return lines
