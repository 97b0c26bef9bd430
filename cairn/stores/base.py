"""The storage interface: the only layer that touches disk or the network.

Keys are '/'-separated paths relative to the store's root. A checkpoint save calls,
in order:

1. ``write_object`` for every shard (any order, concurrently from several threads or
   ranks); each call is durable when it returns;
2. ``put_if_absent`` for the manifest: the commit. It creates the object only if no object
   exists under that key, atomically (link(2) on disk, ``If-None-Match: *`` on S3), and
   says whether this call created it.

A load calls ``size`` and ``read`` for the manifest, then ``read_into`` for tensor bytes
(ranged, concurrently). Listing (``list``) and deletion (``delete``) serve ``latest`` and
retention. Implementations raise ``ObjectNotFoundError`` for a missing key and
``StorageError`` for everything else that went wrong underneath.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

__all__ = ["Store", "ObjectInfo", "Chunk"]

Chunk = bytes | bytearray | memoryview


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: float
    """Seconds since the epoch when the object was last written (for grace periods)."""


class Store(ABC):
    """A flat namespace of immutable-once-committed objects under one root URL."""

    url: str

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
    def read(self, key: str) -> bytes:
        """The whole object."""

    @abstractmethod
    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Fill ``out`` with ``len(out)`` bytes of ``key`` starting at ``offset``."""

    @abstractmethod
    def size(self, key: str) -> int:
        """Object size in bytes (without reading it)."""

    @abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Every object whose key starts with ``prefix``, in no particular order."""

    @abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Remove the keys; missing keys are ignored."""

    def exists(self, key: str) -> bool:
        from cairn.errors import ObjectNotFoundError

        try:
            self.size(key)
        except ObjectNotFoundError:
            return False
        return True

    def child_url(self, key: str) -> str:
        return self.url.rstrip("/") + "/" + key

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release connections or pools."""
