"""An in-memory store: the test double for the Store interface (no patching of internals).

It refuses the keys the real stores refuse (``split_key``), so a test on it meets the same errors."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Iterable, Iterator

from cairn.errors import ObjectNotFoundError, StorageError
from cairn.stores.base import Chunk, ObjectInfo, Store, split_key, too_large

__all__ = ["MemoryStore"]


class MemoryStore(Store):
    def __init__(self, name: str = "test") -> None:
        self.url = f"memory://{name}"
        self._objects: dict[str, tuple[bytes, float]] = {}
        self._lock = threading.Lock()

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        split_key(key)
        # Each chunk copied once, as it comes (a join would hold every chunk and then the whole
        # object again: twice the object, and a second copy of it at the end).
        buffer = io.BytesIO()
        for chunk in chunks:
            buffer.write(memoryview(chunk).cast("B"))
        data = buffer.getvalue()
        del buffer
        with self._lock:
            self._objects[key] = (data, time.time())

    def put_if_absent(self, key: str, data: bytes) -> bool:
        split_key(key)
        with self._lock:
            if key in self._objects:
                return False
            self._objects[key] = (bytes(data), time.time())
            return True

    def _get(self, key: str) -> bytes:
        split_key(key)
        with self._lock:
            try:
                return self._objects[key][0]
            except KeyError:
                raise ObjectNotFoundError(f"no object {key}") from None

    def read(self, key: str, max_bytes: int) -> bytes:
        data = self._get(key)
        if len(data) > max_bytes:
            raise too_large(key, max_bytes, len(data))
        return data

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        data = self._get(key)
        view = out.cast("B") if out.format != "B" else out
        if offset + len(view) > len(data):
            raise StorageError(f"{key}: short object")
        view[:] = data[offset : offset + len(view)]

    def size(self, key: str) -> int:
        return len(self._get(key))

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        with self._lock:
            items = [
                (k, len(d), t)
                for k, (d, t) in self._objects.items()
                if k.startswith(prefix) and (start_after is None or k > start_after)
            ]
        for key, size, mtime in items:
            yield ObjectInfo(key=key, size=size, mtime=mtime)

    def delete(self, keys: Iterable[str]) -> None:
        doomed = list(keys)
        for key in doomed:
            split_key(key)  # a malformed key refuses the call before anything is deleted
        with self._lock:
            for key in doomed:
                self._objects.pop(key, None)

    # Test-only helper: reach in to corrupt an object.
    def corrupt(self, key: str, data: bytes) -> None:
        with self._lock:
            self._objects[key] = (data, self._objects[key][1])
