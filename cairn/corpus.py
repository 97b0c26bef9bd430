"""Text every machine has, for language models that never download: the Python standard
library's own sources (``STDLIB_CORPUS``, in a fixed order), or a user's files, read in order
up to a limit."""

from __future__ import annotations

import sysconfig
from collections.abc import Sequence
from pathlib import Path

__all__ = ["STDLIB_CORPUS", "read_texts", "stdlib_paths"]

STDLIB_CORPUS = (
    "json/decoder.py",
    "json/encoder.py",
    "textwrap.py",
    "string.py",
    "heapq.py",
    "bisect.py",
    "fractions.py",
    "shlex.py",
    "glob.py",
    "fnmatch.py",
    "colorsys.py",
    "calendar.py",
)
"""Standard-library sources, in this order (they ship with every Python)."""


def stdlib_paths() -> list[Path]:
    """The ``STDLIB_CORPUS`` files this Python has."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return [root / name for name in STDLIB_CORPUS if (root / name).is_file()]


def read_texts(paths: Sequence[Path], limit: int) -> list[bytes]:
    """The files' bytes in order, at most ``limit`` bytes in all (the last file read cut short)."""
    chunks: list[bytes] = []
    total = 0
    for path in paths:
        if total >= limit:
            break
        data = path.read_bytes()[: limit - total]
        chunks.append(data)
        total += len(data)
    return chunks
