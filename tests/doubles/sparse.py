"""Checkpoints of any declared size without their bytes: a test and benchmark double.

``SparseStore`` is a ``MemoryStore`` that keeps metadata objects (manifests, rank indexes,
pointers, history segments) whole and checkpoint shard files as sizes only: their bytes read back as zeros.
``zero_rank`` writes one rank's share of a blocked (v3) checkpoint whose tensors are all zeros
— shard sizes declared, every block's real BLAKE3 checksum (of zeros, computed once per block
length) — so a 2 TB, 1,024-rank checkpoint can be planned, committed, read back through every
metadata check and restore-planned on a laptop, and a rank's slice really read (zeros, checked).
"""

from __future__ import annotations

import functools
import re
import threading
import time
from collections.abc import Iterable, Iterator, Sequence

from blake3 import blake3

from cairn.checkpoint.blocks import Block
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.index import write_rank_index
from cairn.checkpoint.layout import checkpoint_prefix, shard_key
from cairn.checkpoint.manifest import IndexRef, PartSpec, ShardEntry, TensorEntry
from cairn.checkpoint.shards import RankShards
from cairn.checkpoint.tensors import CHECKSUM_PREFIX, dtype_from_tag
from cairn.errors import StorageError
from cairn.stores.base import Chunk, ObjectInfo, split_key, too_large
from cairn.stores.memory import MemoryStore

__all__ = ["SparseStore", "zero_checksum", "zero_rank"]

_SHARD = re.compile(r"/rank[0-9]{3,}-[0-9]{4,}\.bin$")
"""Checkpoint shard files (``layout.shard_key``): the objects kept as sizes; everything else
(manifests, rank indexes, history segments, pointers) is kept whole."""
_ZEROS = bytes(8 << 20)


class SparseStore(MemoryStore):
    """Checkpoint shard files as sizes (reading as zeros), everything else kept; counts reads per key."""

    def __init__(self, name: str = "sparse") -> None:
        super().__init__(name)
        self.url = f"memory://{name}"
        self._sparse: dict[str, tuple[int, float]] = {}
        self._sparse_lock = threading.Lock()
        self.reads: dict[str, int] = {}
        self.written_bytes = 0
        """Bytes of metadata objects written (shard bytes are declared, not written)."""

    def declare(self, key: str, size: int) -> None:
        """A shard file of ``size`` zero bytes."""
        split_key(key)
        with self._sparse_lock:
            self._sparse[key] = (size, time.time())

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        if not _SHARD.search(key):
            data = b"".join(bytes(memoryview(c).cast("B")) for c in chunks)
            with self._sparse_lock:
                self.written_bytes += len(data)
            super().write_object(key, [data])
            return
        self.declare(key, sum(len(memoryview(c).cast("B")) for c in chunks))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        created = super().put_if_absent(key, data)
        with self._sparse_lock:
            self.written_bytes += len(data) if created else 0
        return created

    def _count(self, key: str) -> None:
        with self._sparse_lock:
            self.reads[key] = self.reads.get(key, 0) + 1

    def read(self, key: str, max_bytes: int) -> bytes:
        self._count(key)
        with self._sparse_lock:
            sparse = self._sparse.get(key)
        if sparse is None:
            return super().read(key, max_bytes)
        if sparse[0] > max_bytes:
            raise too_large(key, max_bytes, sparse[0])
        if sparse[0] > len(_ZEROS):
            raise StorageError(f"{key}: a sparse shard is read by ranges only")
        return _ZEROS[: sparse[0]]

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self._count(key)
        with self._sparse_lock:
            sparse = self._sparse.get(key)
        if sparse is None:
            super().read_into(key, offset, out)
            return
        view = out.cast("B") if out.format != "B" else out
        if offset + len(view) > sparse[0]:
            raise StorageError(f"{key}: short object")
        view[:] = b"\0" * len(view)

    def size(self, key: str) -> int:
        with self._sparse_lock:
            sparse = self._sparse.get(key)
        return super().size(key) if sparse is None else sparse[0]

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        yield from super().list(prefix, start_after)
        with self._sparse_lock:
            items = [(k, s, t) for k, (s, t) in self._sparse.items() if k.startswith(prefix)]
        for key, size, mtime in items:
            if start_after is None or key > start_after:
                yield ObjectInfo(key=key, size=size, mtime=mtime)

    def delete(self, keys: Iterable[str]) -> None:
        doomed = list(keys)
        super().delete(doomed)
        with self._sparse_lock:
            for key in doomed:
                self._sparse.pop(key, None)

    def index_reads(self) -> int:
        """How many times a rank index object was read."""
        return sum(n for key, n in self.reads.items() if key.endswith(".index.json"))


@functools.lru_cache(maxsize=64)
def zero_checksum(nbytes: int) -> str:
    """BLAKE3 of ``nbytes`` zero bytes (what a block of zeros is checksummed as)."""
    h = blake3()
    for start in range(0, nbytes, len(_ZEROS)):
        h.update(_ZEROS[: min(len(_ZEROS), nbytes - start)])
    return CHECKSUM_PREFIX + h.hexdigest()


def zero_rank(
    store: SparseStore,
    content: CheckpointContent,
    parts: dict[str, PartSpec],
    blocks: Sequence[Block],
    *,
    nonce: str,
    rank: int,
    shard_bytes: int = 64 << 20,
) -> IndexRef:
    """Phase 1 of one rank of a checkpoint whose tensors are zeros: its shards declared (packed
    like ``write_shards`` packs them), its index written; returns its ``IndexRef``."""
    prefix = checkpoint_prefix(content.run_id, content.kind, content.step)
    shards: list[ShardEntry] = []
    tensors: list[TensorEntry] = []
    current: list[TensorEntry] = []
    size = 0

    def close() -> None:
        nonlocal size, current
        if current:
            key = current[0].shard
            store.declare(f"{prefix}/{key}", size)
            shards.append(ShardEntry(key=key, rank=rank, bytes=size))
            tensors.extend(current)
        current, size = [], 0

    for block in sorted(blocks, key=lambda b: b.name):
        spec = parts[block.tensor]
        dtype = str(spec.dtype)
        length = block.size * dtype_from_tag(dtype).itemsize
        if current and size + length > shard_bytes:
            close()
        key = shard_key(nonce, rank, len(shards))
        current.append(
            TensorEntry(
                name=block.name,
                dtype=dtype,
                shape=[block.size],
                shard=key,
                offset=size,
                length=length,
                checksum=zero_checksum(length),
            )
        )
        size += length
    close()
    return write_rank_index(store, content, RankShards(rank=rank, shards=shards, tensors=tensors), nonce=nonce)
