"""The floor: the same bytes moved by plain I/O, which a Cairn save or restore is measured
against — one file written (+ fsync) / read into one fresh buffer on local disk; for S3, a
file-like view of the arrays to upload and a buffer to download into. Also a peer's files made
durable as Cairn's are (``fsync_tree``)."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np


def floor_write_file(arrays: list[np.ndarray], path: Path) -> None:
    """The bytes of ``arrays``, one after another, into one file, then fsync."""
    with open(path, "wb", buffering=0) as f:
        for a in arrays:
            view = memoryview(a.reshape(-1).view(np.uint8))
            while view:
                view = view[f.write(view) :]
        os.fsync(f.fileno())


def floor_read_file(path: Path, nbytes: int) -> np.ndarray:
    out = np.empty(nbytes, dtype=np.uint8)
    with open(path, "rb", buffering=0) as f:
        view = memoryview(out)
        while view:
            n = f.readinto(view)
            if not n:
                raise RuntimeError("short floor file")
            view = view[n:]
    return out


class ArraysReader(io.RawIOBase):
    """A file-like view of several arrays' bytes, one after another (no up-front copy)."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self._views = [memoryview(a.reshape(-1).view(np.uint8)) for a in arrays]
        self._i = 0
        self._pos = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        out = memoryview(b).cast("B")
        n = 0
        while n < len(out) and self._i < len(self._views):
            view = self._views[self._i][self._pos :]
            take = min(len(view), len(out) - n)
            out[n : n + take] = view[:take]
            n += take
            self._pos += take
            if self._pos == len(self._views[self._i]):
                self._i, self._pos = self._i + 1, 0
        return n


class BufferWriter(io.RawIOBase):
    """A seekable writer into one preallocated buffer (the download's destination)."""

    def __init__(self, nbytes: int) -> None:
        self.buf = np.empty(nbytes, dtype=np.uint8)
        self._view = memoryview(self.buf)
        self._pos = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else (self._pos + pos if whence == 1 else len(self._view) + pos)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def write(self, b: Any) -> int:
        data = memoryview(b).cast("B")
        self._view[self._pos : self._pos + len(data)] = data
        self._pos += len(data)
        return len(data)


def fsync_tree(path: Path) -> None:
    """Make a peer's files durable, as Cairn's are (fsync every file and its directory)."""
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(path.parent if path.is_file() else path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def s3_floor(endpoint: str) -> tuple[Any, Any]:
    """The S3 floor's boto3 client and transfer settings: ``cairn.stores.s3_client``'s client (the
    same addressing and signing as ``S3Store``'s) and the store's default part size and
    concurrency — the same transfer, minus Cairn."""
    from boto3.s3.transfer import TransferConfig

    from cairn.stores.s3 import S3Store
    from cairn.stores.s3_client import new_client

    store = S3Store("bench-floor", endpoint_url=endpoint)  # opens nothing: its defaults
    part, concurrency = store.part_size, store.max_concurrency
    store.close()
    transfer = TransferConfig(multipart_threshold=part, multipart_chunksize=part, max_concurrency=concurrency)
    return new_client(endpoint, concurrency), transfer
