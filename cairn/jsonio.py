"""Bounded JSON: every byte of JSON that enters Cairn (config files, run inputs, manifests)
is read and parsed under explicit limits, and every way it can fail is one typed error.

Two steps, each usable alone:

- ``read_regular_file`` opens without blocking and refuses anything that is not a regular
  file (a FIFO would block forever, ``/dev/zero`` would never end, a directory is not data)
  before reading a byte, then reads at most ``max_bytes + 1`` bytes.
- ``parse_json`` decodes strict UTF-8, refuses nesting deeper than ``max_depth`` and (when
  the reader says how many it expects) more than ``max_items`` values *before* ``json.loads``
  runs (so the parser can never recurse deeply, nor build millions of objects), refuses integers longer than
  ``max_int_digits`` (Python's own limit of 4300 digits would raise a bare ``ValueError``),
  ``NaN``/``Infinity`` and floats that overflow to infinity (``1e400``), strings longer than
  ``max_string_chars`` and lone UTF-16 surrogates (``"\\ud800"``, which no encoder can write back).

Each failure is a single ``error(...)`` (``ConfigError`` by default, ``ManifestError`` for
manifests) whose message names the file or object; never ``RecursionError``, ``ValueError``,
``UnicodeDecodeError`` or ``MemoryError``.
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from cairn.errors import CairnError, ConfigError

__all__ = ["JsonLimits", "open_regular_file", "read_regular_file", "parse_json", "load_json_file"]

_READ_CHUNK = 1 << 20
_SCAN_BLOCK = 1 << 20
_QUOTE = 0x22
_LONE_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass(frozen=True)
class JsonLimits:
    """Bounds on one JSON document. The defaults fit every file Cairn writes or reads with room
    to spare (a manifest of 4096 tensors is ~2 MiB, 4 levels deep, integers <= 39 digits)."""

    max_bytes: int = 16 << 20
    max_depth: int = 64
    max_int_digits: int = 64
    max_string_chars: int = 1 << 20
    max_items: int | None = None
    """Values and members a document may hold in all (None: as many as ``max_bytes`` allows):
    counted before parsing, so a reader that knows how many entries it expects bounds the
    memory and time of the parse by that, not by the bytes (a header of millions of ``{}``)."""


class _Refused(Exception):
    """Raised from inside ``json.loads`` hooks; becomes the caller's error type."""


def _file_kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


@contextmanager
def open_regular_file(
    path: str | Path,
    *,
    what: str,
    max_bytes: int,
    error: type[CairnError] = ConfigError,
) -> Iterator[BinaryIO]:
    """Open the regular file at ``path`` for reading, or refuse it at once with ``error``.

    The checks of ``read_regular_file`` (below) without the read, for readers that stream a
    file themselves (``np.load`` of a dataset). ``max_bytes`` bounds the size at open time.
    """
    where = str(path)
    try:
        # stat first, so a device is never even opened; fstat after opening closes the race.
        before = os.stat(path)
        if not stat.S_ISREG(before.st_mode):
            raise error(f"{where}: {what} is {_file_kind(before.st_mode)}, not a regular file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError as exc:
        raise error(f"{where}: {what} not found") from exc
    except OSError as exc:
        raise error(f"{where}: cannot read {what} ({exc.strerror or exc})") from exc
    with os.fdopen(fd, "rb") as file:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise error(f"{where}: {what} is {_file_kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise error(f"{what} too large", field=where, expected=f"<= {max_bytes} bytes", found=f"{st.st_size} bytes")
        yield file


def read_regular_file(
    path: str | Path,
    *,
    what: str,
    max_bytes: int,
    error: type[CairnError] = ConfigError,
) -> bytes:
    """The bytes of the regular file at ``path`` (symlinks to regular files are followed).

    Refused at once, without blocking and without reading: a missing or unreadable path, a
    directory, a FIFO, a socket, a character or block device (``/dev/zero``, ``/dev/urandom``,
    directly or through a symlink). A file over ``max_bytes`` is refused with its size; at
    most ``max_bytes + 1`` bytes are ever read, even from a file that grows or lies about its
    size (``/proc``). ``what`` names the file in messages (``"config file"``).
    """
    chunks: list[bytes] = []
    total = 0
    with open_regular_file(path, what=what, max_bytes=max_bytes, error=error) as file:
        try:
            while total <= max_bytes:
                chunk = os.read(file.fileno(), min(_READ_CHUNK, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
        except OSError as exc:
            raise error(f"{path}: cannot read {what} ({exc.strerror or exc})") from exc
    if total > max_bytes:
        raise error(
            f"{what} too large", field=str(path), expected=f"<= {max_bytes} bytes", found=f"> {max_bytes} bytes"
        )
    return b"".join(chunks)


@dataclass
class _Scan:
    depth: int = 0
    """Deepest nesting of arrays/objects outside strings."""
    longest_string: int = 0
    """Bytes between the quotes of the longest string: an upper bound on its characters."""
    items: int = 0
    """Commas and opening brackets outside strings: an upper bound on the values and members
    the parser builds (a container's k elements are separated by k - 1 commas)."""


def _scan(raw: bytes, max_depth: int, count_items: bool = False) -> _Scan:
    """Nesting depth, longest string and (``count_items``) the items of ``raw``, without parsing it.

    Exact for valid JSON and for every valid prefix of invalid JSON, which is all the parser
    ever recurses into. Stops early once the depth passes ``max_depth``.
    """
    # Blank escaped backslashes first, then escaped quotes; equal-length replacements keep
    # every position (and every string's byte length) unchanged.
    text = raw.replace(b"\\\\", b"__").replace(b'\\"', b"__") if b"\\" in raw else raw
    buf = np.frombuffer(text, dtype=np.uint8)
    out = _Scan()
    depth = 0
    inside = 0  # 1 when the block starts inside a string
    open_at = -1  # position of the opening quote of a string that spans blocks
    for start in range(0, buf.size, _SCAN_BLOCK):
        block = buf[start : start + _SCAN_BLOCK]
        quotes = np.flatnonzero(block == _QUOTE)
        folded = block | 0x20  # '[' -> '{', ']' -> '}'
        at = np.flatnonzero((folded == 0x7B) | (folded == 0x7D))
        if at.size:
            # A bracket is outside every string iff an even number of quotes precede it.
            outside = ((np.searchsorted(quotes, at) + inside) & 1) == 0
            steps = (block[at[outside]] & 2).astype(np.int32) - 1  # '[' '{' -> +1, ']' '}' -> -1
            out.items += int(np.count_nonzero(steps > 0)) if count_items else 0
            if steps.size:
                running = np.cumsum(steps)
                out.depth = max(out.depth, depth + int(running.max()))
                depth += int(running[-1])
                if out.depth > max_depth:
                    return out
        if count_items:
            commas = np.flatnonzero(block == 0x2C)
            out.items += int(np.count_nonzero(((np.searchsorted(quotes, commas) + inside) & 1) == 0))
        if quotes.size:
            quotes += start
            if inside:  # the first quote closes the string opened in an earlier block
                out.longest_string = max(out.longest_string, int(quotes[0]) - open_at - 1)
            pairs = quotes[inside:]
            opens, closes = pairs[0::2], pairs[1::2]
            if closes.size:
                out.longest_string = max(out.longest_string, int((closes - opens[: closes.size]).max()) - 1)
            if opens.size > closes.size:
                open_at = int(opens[-1])
            inside = (inside + int(quotes.size)) & 1
    return out


def _string_problem(value: Any, limits: JsonLimits) -> str | None:
    """The first string (key or value) that is too long or not valid Unicode, described."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, str):
            if len(item) > limits.max_string_chars:
                return f"string too long (expected <= {limits.max_string_chars} characters, found {len(item)})"
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return "string holds a lone UTF-16 surrogate escape (not valid Unicode)"
    return None


def parse_json(
    raw: bytes,
    *,
    where: str,
    error: type[CairnError] = ConfigError,
    limits: JsonLimits = JsonLimits(),
) -> Any:
    """Decode one JSON document under ``limits``; every failure is ``error`` naming ``where``."""
    if len(raw) > limits.max_bytes:
        raise error(
            "JSON document too large", field=where, expected=f"<= {limits.max_bytes} bytes", found=f"{len(raw)} bytes"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{where}: not UTF-8 text (binary file?): invalid byte at offset {exc.start}") from None
    scan = _scan(raw, limits.max_depth, count_items=limits.max_items is not None)
    if scan.depth > limits.max_depth:
        raise error(
            "JSON nested too deep",
            field=where,
            expected=f"<= {limits.max_depth} levels",
            found=f"{scan.depth} levels",
        )
    if limits.max_items is not None and scan.items > limits.max_items:
        raise error(
            "JSON holds more entries than expected",
            field=where,
            expected=f"<= {limits.max_items} values and members",
            found=f"about {scan.items}",
        )

    def parse_int(literal: str) -> int:
        digits = len(literal) - literal.startswith("-")
        if digits > limits.max_int_digits:
            raise _Refused(f"integer too long (expected <= {limits.max_int_digits} digits, found {digits})")
        return int(literal)

    def parse_float(literal: str) -> float:
        value = float(literal)
        if value in (float("inf"), float("-inf")):
            raise _Refused(f"number out of range (overflows to infinity): {literal[:40]}")
        return value

    def parse_constant(name: str) -> Any:
        raise _Refused(f"{name} is not a JSON number (NaN and Infinity are refused)")

    try:
        value = json.loads(text, parse_int=parse_int, parse_float=parse_float, parse_constant=parse_constant)
    except _Refused as exc:
        raise error(f"{where}: {exc}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{where}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:  # unreachable after the scan; kept so no parser path escapes untyped
        raise error(f"{where}: JSON nested too deep") from None
    if scan.longest_string > limits.max_string_chars or _LONE_SURROGATE_ESCAPE.search(raw) is not None:
        problem = _string_problem(value, limits)
        if problem is not None:
            raise error(f"{where}: {problem}")
    return value


def load_json_file(
    path: str | Path,
    *,
    what: str,
    error: type[CairnError] = ConfigError,
    limits: JsonLimits = JsonLimits(),
) -> Any:
    """``read_regular_file`` then ``parse_json``: a JSON file under ``limits``, or ``error``."""
    raw = read_regular_file(path, what=what, max_bytes=limits.max_bytes, error=error)
    return parse_json(raw, where=str(path), error=error, limits=limits)
