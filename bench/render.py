"""What the benchmarks' sections of ``BENCHMARKS.md`` share: the median (min–max) cell and the
targets table that the sections fill in as they are rendered. Imports nothing heavy.
"""

from __future__ import annotations

from typing import Any


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
