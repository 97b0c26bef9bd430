"""The storage interface: the only layer that touches disk or the network.

Keys are '/'-separated paths relative to the store's root: no empty, '.' or '..' segment,
no leading '/', no NUL or line break (``split_key``). A malformed key, or an object that is
not what this store writes (a directory, a FIFO, a device, a symlink), is refused with
``InvalidObjectError``: the same request would meet the same thing again, so it is not retried.

A checkpoint save calls, in order:

1. ``write_object`` for every shard (any order, concurrently from several threads or
   ranks); each call is durable when it returns;
2. ``put_if_absent`` for the manifest: the commit. It creates the object only if no object
   exists under that key, atomically (link(2) on disk, ``If-None-Match: *`` on S3), and
   says whether this call created it.

A load calls ``read`` for the manifest, then ``read_into`` for tensor bytes (ranged,
concurrently). ``latest`` calls ``read`` (its advisory pointer, then the manifest it names) and
``list`` with ``start_after`` (only what sorts after that step).

Every ``read`` states the most bytes its object may hold (``max_bytes``: the bound of its kind,
``cairn.checkpoint.layout``): a larger object is refused with ``SizeLimitError`` from its size
before a byte of it is read, and no read takes more than ``max_bytes + 1`` bytes, so nothing
planted in a store can make a reader allocate for it.
Retention calls ``list`` and ``delete``, then ``abort_stale_uploads`` with its grace period
(``stale_uploads`` in a dry run), to collect uploads that a crashed writer left incomplete:
``list`` does not show them, yet the store keeps (and bills) their parts.
Implementations raise ``ObjectNotFoundError`` for a missing key, ``InvalidObjectError`` as
above, and ``StorageError`` for everything else that went wrong underneath.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass

from cairn.errors import InvalidObjectError, ObjectNotFoundError, SizeLimitError

__all__ = ["Store", "ObjectInfo", "Chunk", "key_problem", "span_buffer", "split_key", "too_large"]

Chunk = bytes | bytearray | memoryview


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot name one object inside a store (None when it can): the one statement
    of the key rules, shared by the stores and the manifest's shard keys."""
    if not key:
        return "empty"
    if key.startswith("/"):
        return "absolute (leading '/')"
    for char, name in (("\0", "NUL"), ("\n", "a newline"), ("\r", "a carriage return")):
        if char in key:
            return f"contains {name}"
    if any(part in ("", ".", "..") for part in key.split("/")):
        return "has an empty, '.' or '..' segment"
    return None


def split_key(key: str) -> list[str]:
    """The segments of ``key``; ``InvalidObjectError`` if it could name something outside the
    store or is not one object's name (``key_problem``)."""
    problem = key_problem(key)
    if problem is not None:
        raise InvalidObjectError(
            f"object key {problem}",
            expected="'/'-separated names, no '', '.', '..', NUL or line break",
            found=repr(key),
        )
    return key.split("/")


def too_large(key: str, max_bytes: int, found: int | None) -> SizeLimitError:
    """The refusal of an object over its bound (``found``: its size, None: more than the bound)."""
    return SizeLimitError(
        "object larger than its kind allows (not written by Cairn, or damaged)",
        field=key,
        expected=f"<= {max_bytes} bytes",
        found=f"> {max_bytes} bytes" if found is None else f"{found} bytes",
    )


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float
    """Seconds since the epoch when the object was last written (for grace periods)."""


def span_buffer(sizes: Sequence[int], buffer: memoryview) -> memoryview:
    """``buffer`` as bytes, refused before any read if a span of ``sizes`` does not fit it
    (``Store.read_spans``)."""
    view = buffer.cast("B") if buffer.format != "B" else buffer
    if max(sizes, default=0) > len(view):
        raise ValueError(f"read_spans: a span of {max(sizes)} bytes does not fit a {len(view)}-byte buffer")
    return view


class Store(ABC):
    """A flat namespace of immutable-once-committed objects under one root URL."""

    url: str
    read_piece_bytes: int = 8 << 20
    """How many bytes a restore asks for per ``read_into`` call: big enough to amortize a call
    (a request, on S3), small enough that checking one piece overlaps reading the next."""

    @abstractmethod
    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        """Write the concatenation of ``chunks`` under ``key``, replacing any object there.

        Durable when it returns. ``size`` (total bytes), when given, lets a store plan
        multipart uploads. Readers never see a partially written object.
        """

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` iff nothing is there; True if this call created it."""

    @abstractmethod
    def read(self, key: str, max_bytes: int) -> bytes:
        """The whole object, which may hold at most ``max_bytes`` bytes.

        A larger object is refused with ``SizeLimitError`` (``too_large``) from its size (a
        stat, the GET's ``Content-Length``) before its bytes are read; at most ``max_bytes + 1``
        bytes are ever taken, so one that grew after its size was read is refused too.
        """

    @abstractmethod
    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Fill ``out`` with ``len(out)`` bytes of ``key`` starting at ``offset``."""

    def read_spans(
        self, key: str, offset: int, sizes: Sequence[int], buffer: memoryview
    ) -> Generator[memoryview, None, None]:
        """Consecutive spans of ``key`` from ``offset``, ``sizes[i]`` bytes each, each yielded
        as ``buffer[:sizes[i]]`` once filled (valid until the next is asked for): many spans,
        one span's memory. Here one ``read_into`` a span; a store whose requests cost (S3)
        reads them all with one request."""
        view_of = span_buffer(sizes, buffer)
        at = offset
        for size in sizes:
            view = view_of[:size]
            self.read_into(key, at, view)
            at += size
            yield view

    @abstractmethod
    def size(self, key: str) -> int:
        """Object size in bytes (without reading it)."""

    @abstractmethod
    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in no particular order.

        ``start_after``: only keys that sort strictly after it (by code point, which is S3's
        UTF-8 byte order). Stores skip what sorts before it without visiting it (S3's
        ``StartAfter``; on disk, directories whose every key sorts before it are not entered),
        so a listing that resumes after a known step costs what is after it, not the run.
        """

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Remove the keys; missing keys are ignored."""

    def stale_uploads(self, prefix: str, older_than_seconds: float, now: float | None = None) -> builtins.list[str]:
        """Keys of the incomplete uploads under ``prefix`` begun ``older_than_seconds`` or more
        before ``now`` (default: the current time): what ``abort_stale_uploads`` would abort.

        Only stores with resumable uploads hold such leftovers (S3 multipart uploads). The
        default returns []: on local disk a crashed writer's temp file is an ordinary entry
        that ``list`` shows, and retention deletes it like any orphan.
        """
        return []

    def abort_stale_uploads(
        self, prefix: str, older_than_seconds: float, now: float | None = None
    ) -> builtins.list[str]:
        """Abort the incomplete uploads ``stale_uploads`` names; return their keys.

        The default does nothing and returns [] (see ``stale_uploads``).
        """
        return []

    def save_target(self, run_id: str, nbytes: int) -> Store:
        """The store the next checkpoint save of ``run_id`` (about ``nbytes``) writes to: this
        one. A tier in front of a durable store (``cairn.checkpoint.tier``) answers itself when
        it has room, else the durable store."""
        return self

    def root_exists(self) -> bool:
        """Whether the store itself exists (a directory, a bucket with objects under the prefix);
        reading commands refuse a store that does not, instead of reporting it empty."""
        return True

    def exists(self, key: str) -> bool:
        try:
            self.size(key)
        except ObjectNotFoundError:
            return False
        return True

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections or pools."""
