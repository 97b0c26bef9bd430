"""Phase 1 of a save: every writer (rank) streams its tensors out as shard files.

Tensors are packed, in name order, into shard files of about ``shard_bytes`` (within a
compressed shard, the small tensors stored raw come first); each is hashed chunk by chunk
while it streams out of a zero-copy byte view (no full copy in memory), and the shards of one
writer go out concurrently. A shard's key holds the save attempt's nonce and the rank
(``cairn.checkpoint.layout.shard_key``), so ranks never collide and a losing attempt never
overwrites the winner's bytes. Nothing here commits: see ``cairn.checkpoint.commit``.
"""

from __future__ import annotations

import functools
import os
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
from blake3 import blake3

from cairn.checkpoint.codec import FRAME_BYTES, encode_frame, new_encoding
from cairn.checkpoint.compression import MIN_ENCODED_BYTES, decide, record_write
from cairn.checkpoint.content import CheckpointContent, check_content
from cairn.checkpoint.layout import checkpoint_prefix, shard_key
from cairn.checkpoint.manifest import Frame, ShardEntry, TensorEntry
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.tensors import CHECKSUM_PREFIX, HASH_CHUNK, as_le_contiguous, byte_view, dtype_tag
from cairn.stores.base import Chunk, Store

__all__ = ["RankShards", "new_save_nonce", "write_shards"]


@dataclass(frozen=True)
class RankShards:
    """What one writer (rank) wrote: its shard files and the index of its tensors."""

    rank: int
    shards: list[ShardEntry]
    tensors: list[TensorEntry]
    linked: list[ShardEntry] = field(default_factory=list)
    """Shards of earlier checkpoints (full store keys) some of ``tensors`` reference (``cairn.checkpoint.reuse``)."""


@dataclass
class _ShardPlan:
    key: str
    names: list[str]
    size: int


@functools.lru_cache(maxsize=8)
def _writers(workers: int, pid: int) -> ThreadPoolExecutor:
    """Shard writers, kept for the process (keyed by pid: a forked child gets its own), so a
    save does not start threads every time; writers wait only for the store."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cairn-shard")


def new_save_nonce() -> str:
    """One per save attempt, shared by all its ranks: names the attempt's shard files."""
    return uuid.uuid4().hex[:16]


def _plan_shards(
    arrays: Mapping[str, np.ndarray], nonce: str, rank: int, shard_bytes: int, first: int
) -> list[_ShardPlan]:
    plans: list[_ShardPlan] = []
    current: _ShardPlan | None = None
    for name in sorted(arrays):
        size = arrays[name].nbytes
        if current is None or (current.size and current.size + size > shard_bytes):
            current = _ShardPlan(key=shard_key(nonce, rank, first + len(plans)), names=[], size=0)
            plans.append(current)
        current.names.append(name)
        current.size += size
    return plans


def _write_shard(
    store: Store,
    prefix: str,
    plan: _ShardPlan,
    arrays: Mapping[str, np.ndarray],
    rank: int,
    known: Mapping[str, str] | None = None,
) -> tuple[ShardEntry, list[TensorEntry]]:
    """Stream one shard to the store, each chunk hashed on its way out — by a hashing thread
    behind the writer, so the hashing overlaps the writes and their flush (BLAKE3 releases the
    GIL); the checksums are complete before the shard is reported. ``known``: checksums the
    caller computed of these very arrays a moment ago (an incremental save), not hashed again."""
    known = known or {}
    hashed: list[tuple[str, np.ndarray, blake3 | None]] = []
    pending: list[futures.Future[object]] = []
    consumed: list[bool] = []
    with futures.ThreadPoolExecutor(1, thread_name_prefix="cairn-hash") as hashing:

        def chunks() -> Iterator[memoryview]:
            for name in plan.names:
                arr = arrays[name]
                view = byte_view(arr)
                h = None if name in known else blake3()
                hashed.append((name, arr, h))
                for start in range(0, len(view), HASH_CHUNK):
                    piece = view[start : start + HASH_CHUNK]
                    if h is not None:
                        pending.append(hashing.submit(h.update, piece))  # in order: one hashing thread
                    yield piece
            consumed.append(True)  # reached only when the store asked past the last chunk

        try:
            store.write_object(f"{prefix}/{plan.key}", chunks(), size=plan.size)
        finally:
            futures.wait(pending)
    for job in pending:
        job.result()
    if not consumed:  # a store must consume every chunk
        raise RuntimeError(f"store {store.url} did not consume shard {plan.key}")
    entries: list[TensorEntry] = []
    offset = 0
    for name, arr, h in hashed:
        entries.append(
            TensorEntry(
                name=name,
                dtype=dtype_tag(arr.dtype),
                shape=list(arr.shape),
                shard=plan.key,
                offset=offset,
                length=arr.nbytes,
                checksum=known[name] if h is None else CHECKSUM_PREFIX + h.hexdigest(),
            )
        )
        offset += arr.nbytes
    return ShardEntry(key=plan.key, rank=rank, bytes=plan.size), entries


def _raw_first(names: list[str], arrays: Mapping[str, np.ndarray]) -> list[str]:
    """A shard's tensors in the order an encoded shard stores them: the small ones stored raw
    first, then the encoded ones, each in name order. The raw ones then lie back to back from
    the shard's start, as in a raw shard, so a restore reads them in a few large requests
    (``placement.slabs_of``), not one request each behind every encoded tensor's odd-sized
    bytes. ``cairn.checkpoint.copy`` keeps the same order."""
    return sorted(names, key=lambda name: arrays[name].nbytes >= MIN_ENCODED_BYTES)


_LOOKAHEAD = 2
"""Frames encoded ahead of the one the store is taking (each at most ``FRAME_BYTES``)."""


def _write_encoded(
    store: Store,
    prefix: str,
    plan: _ShardPlan,
    arrays: Mapping[str, np.ndarray],
    rank: int,
    known: Mapping[str, str] | None = None,
) -> tuple[ShardEntry, list[TensorEntry]]:
    """``_write_shard`` with every tensor of ``MIN_ENCODED_BYTES`` or more stored in encoded frames
    (``cairn.checkpoint.codec``): one encoding thread works ``_LOOKAHEAD`` frames ahead of the
    store, the hashing thread hashes the logical bytes (the tensor's checksum) as before, and
    each frame's stored bytes are hashed as they are encoded."""
    known = known or {}
    hashed: list[tuple[str, np.ndarray, blake3 | None]] = []
    frames: dict[str, list[Frame]] = {name: [] for name in plan.names}
    pending: list[futures.Future[object]] = []
    consumed: list[bool] = []
    stored = [0]
    with (
        futures.ThreadPoolExecutor(1, thread_name_prefix="cairn-hash") as hashing,
        futures.ThreadPoolExecutor(1, thread_name_prefix="cairn-encode") as encoding,
    ):

        def pieces() -> Iterator[tuple[str, memoryview, int]]:
            for name in _raw_first(plan.names, arrays):
                arr = arrays[name]
                view = byte_view(arr)
                h = None if name in known else blake3()
                hashed.append((name, arr, h))
                for start in range(0, len(view), FRAME_BYTES):
                    piece = view[start : start + FRAME_BYTES]
                    if h is not None:
                        pending.append(hashing.submit(h.update, piece))  # in order: one hashing thread
                    yield name, piece, arr.itemsize

        def chunks() -> Iterator[Chunk]:
            ahead: deque[tuple[str, memoryview | futures.Future[tuple[bytes, Frame]]]] = deque()
            source = pieces()
            while True:
                for name, piece, itemsize in source:
                    raw = arrays[name].nbytes < MIN_ENCODED_BYTES
                    ahead.append((name, piece if raw else encoding.submit(encode_frame, piece, itemsize)))
                    if len(ahead) > _LOOKAHEAD:
                        break
                if not ahead:
                    break
                name, job = ahead.popleft()
                if isinstance(job, memoryview):  # a small tensor, stored raw
                    stored[0] += len(job)
                    yield job
                    continue
                data, frame = job.result()
                frames[name].append(frame)
                stored[0] += len(data)
                yield data
            consumed.append(True)  # reached only when the store asked past the last chunk

        try:
            store.write_object(f"{prefix}/{plan.key}", chunks())
        finally:
            futures.wait(pending)
    for job in pending:
        job.result()
    if not consumed:  # a store must consume every chunk
        raise RuntimeError(f"store {store.url} did not consume shard {plan.key}")
    entries: list[TensorEntry] = []
    offset = 0
    for name, arr, h in hashed:
        entry = TensorEntry(
            name=name,
            dtype=dtype_tag(arr.dtype),
            shape=list(arr.shape),
            shard=plan.key,
            offset=offset,
            length=arr.nbytes,
            checksum=known[name] if h is None else CHECKSUM_PREFIX + h.hexdigest(),
            encoding=new_encoding(frames[name]) if frames[name] else None,
        )
        entries.append(entry)
        offset += entry.stored_length
    return ShardEntry(key=plan.key, rank=rank, bytes=offset), entries


def write_shards(
    store: Store,
    content: CheckpointContent,
    tensors: Mapping[str, np.ndarray],
    *,
    nonce: str,
    rank: int = 0,
    options: CheckpointOptions | None = None,
    first_shard: int = 0,
    checksums: Mapping[str, str] | None = None,
) -> RankShards:
    """Phase 1, run by every rank for its own tensors: stream them out as shard files
    (numbered from ``first_shard``: a second call of the same attempt never reuses a key).
    ``checksums``: of these arrays, computed by the caller just before (not hashed twice).
    ``options.compression`` decides whether the shards store encoded frames (``_write_encoded``)."""
    options = options or CheckpointOptions()
    check_content(content, tensors, options.limits)
    arrays = {name: as_le_contiguous(a) for name, a in tensors.items()}
    prefix = checkpoint_prefix(content.run_id, content.kind, content.step)
    plans = _plan_shards(arrays, nonce, rank, options.shard_bytes, first_shard)
    compress = decide(options.compression, store.url, arrays).compress
    write = _write_encoded if compress else _write_shard
    started = time.perf_counter()
    if len(plans) <= 1:  # one shard: no thread to hand it to
        results = [write(store, prefix, p, arrays, rank, checksums) for p in plans]
    else:
        pool = _writers(max(1, options.max_workers), os.getpid())
        jobs = [pool.submit(write, store, prefix, p, arrays, rank, checksums) for p in plans]
        futures.wait(jobs)  # every shard finished (or failed) before anything is reported
        results = [j.result() for j in jobs]
    if not compress:  # what measures the store for ``auto``: a raw save's bytes over its wall time
        record_write(store.url, sum(p.size for p in plans), time.perf_counter() - started)
    return RankShards(rank=rank, shards=[s for s, _ in results], tensors=[e for _, es in results for e in es])
