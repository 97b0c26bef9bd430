"""The sections of ``BENCHMARKS.md``: one module per benchmark, named as in ``bench.registry``.

Each has ``section(results, targets) -> lines``: its text under the heading the registry gives
it (the report writes the heading and, for a benchmark with a plot, the image line after the
text), adding its rows to the targets table; a benchmark with a plot also has ``plot(results,
folder) -> paths`` (``NAME.png``), and one whose title has ``{fields}`` has ``title_fields(results)``.
What they share is here: the median (min–max) cell and the targets table. Nothing heavy imports.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Targets", "spread", "verdict"]


def spread(x: dict[str, Any], unit: str = "s", scale: float = 1.0, digits: int = 3) -> str:
    """median (min–max)"""
    unit = f" {unit}" if unit else ""
    return f"{x['median'] * scale:.{digits}f}{unit} ({x['min'] * scale:.{digits}f}–{x['max'] * scale:.{digits}f})"


def verdict(ok: bool) -> str:
    return "**met**" if ok else "**missed**"


class Targets:
    """The rows of the targets table, in the order the sections add them."""

    def __init__(self) -> None:
        self.rows: list[tuple[str, str, str, str]] = []

    def add(self, target: str, measured: str, ok: bool, note: str) -> None:
        self.rows.append((target, measured, verdict(ok), note))
