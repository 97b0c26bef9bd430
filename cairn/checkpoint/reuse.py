"""Incremental saves: a block the run already holds durably is referenced, not rewritten.

The process remembers, per (store, run, kind, rank), the blocks of the last checkpoint it
committed or restored there (``remember_blocks``): each block's content — (checksum, dtype tag,
length) — and where its bytes live (a shard's full store key and offset; a block that
checkpoint itself referenced keeps its original location, so references never chain). A save
(``write_rank_blocks``) hashes every block first; a block whose content the memory holds is
written as an entry pointing at those bytes, the rest as this attempt's shards. So the index
lists every block exactly as a full save would (name, dtype, shape, checksum: the fingerprint
is unchanged); only the entry's shard names another checkpoint's. The protocol, in order:

1. hash every block; candidates are those whose content the memory holds (in another step);
2. write an intent per source attempt (``cairn.checkpoint.intents``), *then* check that the
   remembered checkpoint is still committed *by the attempt it was learnt from* (the manifest's
   writer nonce: a step retired and committed again by another attempt is not the same
   checkpoint — GC may be deleting the old attempt's shards as orphans of the new one) and each
   candidate shard has its remembered size; candidates that fail are written instead;
3. write the other blocks as this attempt's shards;
4. check every linked shard again (something deleted behind the writer's back); the blocks of
   a missing one are written now, as further shards of the attempt.

Then the commit (``commit_indexed``). Every block is still checksummed on every read.
"""

from __future__ import annotations

import functools
import os
import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from cairn.checkpoint.content import CheckpointContent, check_content
from cairn.checkpoint.intents import write_intents
from cairn.checkpoint.layout import linked_shard, manifest_key, shard_object_key
from cairn.checkpoint.manifest import Encoding, Manifest, ShardEntry, TensorEntry
from cairn.checkpoint.options import CheckpointOptions, Limits
from cairn.checkpoint.reader import parse_manifest
from cairn.checkpoint.shards import RankShards, write_shards
from cairn.checkpoint.tensors import as_le_contiguous, dtype_tag, tensor_checksum
from cairn.errors import CheckpointError, InvalidObjectError, ObjectNotFoundError
from cairn.stores.base import Store

__all__ = [
    "remember_blocks",
    "forget_blocks",
    "durable_blocks",
    "write_rank_blocks",
    "DurableBlocks",
    "Referenced",
    "referenced_of",
]

MAX_RUNS = 16
"""Runs (and ranks) per store whose last durable blocks this process remembers."""
Content = tuple[str, str, int]
"""(checksum, dtype tag, length): what makes two blocks interchangeable."""
_RANK = re.compile(r"/rank([0-9]+)-[0-9]+\.bin$")


@dataclass(frozen=True)
class DurableBlocks:
    """The blocks of one committed checkpoint, by content."""

    manifest: str
    """The commit marker of the checkpoint they were learnt from: a save references them only
    after checking it still exists, written by ``nonce`` (see the module)."""
    nonce: str
    """The writer nonce of that manifest: the attempt that committed the checkpoint."""
    blocks: dict[Content, tuple[str, int, Encoding | None]]
    """Content -> (full shard key, offset, how its bytes are stored there)."""
    shard_bytes: dict[str, int]


_memory: weakref.WeakKeyDictionary[Store, OrderedDict[tuple[str, str, int], DurableBlocks]] = (
    weakref.WeakKeyDictionary()
)
_lock = threading.Lock()


def remember_blocks(
    store: Store,
    run_id: str,
    kind: str,
    step: int,
    entries: Iterable[TensorEntry],
    shards: Iterable[ShardEntry],
    *,
    indexed: bool,
    nonce: str,
    rank: int = 0,
) -> None:
    """The checkpoint (run, kind, step) is committed by attempt ``nonce`` (its manifest's writer
    nonce) and holds ``entries`` in ``shards`` (as its manifest, or a v3 rank index, names them:
    ``indexed`` for v3): later saves of this rank may reference them. Only shards of the
    standard layout are remembered."""
    sizes = {shard_object_key(run_id, kind, step, s.key, indexed=indexed): s.bytes for s in shards}
    blocks: dict[Content, tuple[str, int, Encoding | None]] = {}
    for t in entries:
        key = shard_object_key(run_id, kind, step, t.shard, indexed=indexed)
        if key in sizes and linked_shard(key, run_id, kind, None) is not None:
            blocks.setdefault((t.checksum, t.dtype, t.length), (key, t.offset, t.encoding))
    used = {key for key, *_ in blocks.values()}
    kept = {k: n for k, n in sizes.items() if k in used}
    durable = DurableBlocks(manifest_key(run_id, kind, step), nonce, blocks, kept)
    with _lock:
        runs = _memory.setdefault(store, OrderedDict())
        runs.pop((run_id, kind, rank), None)
        runs[(run_id, kind, rank)] = durable
        while len(runs) > MAX_RUNS:
            runs.popitem(last=False)


def forget_blocks(store: Store, run_id: str, kind: str, rank: int = 0) -> None:
    with _lock:
        runs = _memory.get(store)
        if runs is not None:
            runs.pop((run_id, kind, rank), None)


def durable_blocks(store: Store, run_id: str, kind: str, rank: int = 0) -> DurableBlocks | None:
    """What this process last committed or restored for (store, run, kind, rank), if anything."""
    with _lock:
        runs = _memory.get(store)
        return None if runs is None else runs.get((run_id, kind, rank))


@functools.lru_cache(maxsize=4)
def _hashers(workers: int, pid: int) -> ThreadPoolExecutor:
    """Block hashers, kept for the process (a forked child gets its own); BLAKE3 releases the GIL."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cairn-reuse")


def _present(store: Store, sizes: Mapping[str, int], pool: ThreadPoolExecutor) -> set[str]:
    """The shards of ``sizes`` that exist with exactly their remembered size (asked concurrently)."""

    def size_of(key: str) -> int | None:
        try:
            return store.size(key)
        except ObjectNotFoundError:
            return None

    keys = sorted(sizes)
    return {k for k, size in zip(keys, pool.map(size_of, keys), strict=True) if size == sizes[k]}


def _committed_by(store: Store, prior: DurableBlocks, limits: Limits) -> bool:
    """``prior``'s checkpoint is committed, by the attempt its blocks were learnt from (one read
    of the manifest: a v3 root is small). Anything else — gone, unreadable, another attempt's
    commit of the step — is not."""
    try:
        raw = store.read(prior.manifest, limits.max_manifest_bytes)
        committed = parse_manifest(raw, prior.manifest, limits=limits)
    except (ObjectNotFoundError, InvalidObjectError, CheckpointError):
        return False
    return committed.writer.nonce == prior.nonce


def _linked_entry(key: str, size: int) -> ShardEntry:
    rank = _RANK.search(key)
    return ShardEntry(key=key, rank=int(rank[1]) if rank else 0, bytes=size)


def write_rank_blocks(
    store: Store,
    content: CheckpointContent,
    blocks: Mapping[str, np.ndarray],
    *,
    nonce: str,
    rank: int = 0,
    options: CheckpointOptions,
) -> RankShards:
    """Phase 1 of an incremental save, for one rank's blocks: reference what the run already
    holds, write the rest (see the module for the order)."""
    run, kind, step = content.run_id, content.kind.value, content.step
    prior = durable_blocks(store, run, kind, rank)
    if prior is None or not prior.blocks:
        return write_shards(store, content, blocks, nonce=nonce, rank=rank, options=options)
    check_content(content, blocks, options.limits)
    arrays = {name: as_le_contiguous(a) for name, a in blocks.items()}
    names = sorted(arrays)
    pool = _hashers(max(1, options.max_workers), os.getpid())
    sums = dict(zip(names, pool.map(lambda n: tensor_checksum(arrays[n]), names), strict=True))
    reuse: dict[str, tuple[str, int, Encoding | None]] = {}
    for name in names:
        where = prior.blocks.get((sums[name], dtype_tag(arrays[name].dtype), arrays[name].nbytes))
        if where is not None and linked_shard(where[0], run, kind, step) is not None:
            reuse[name] = where
    if reuse:
        sources = {linked_shard(key, run, kind, step) for key, *_ in reuse.values()}
        write_intents(store, run, nonce, rank, ((s.kind, s.step, s.rest.split("/")[0]) for s in sources if s))
        committed = _committed_by(store, prior, options.limits)  # after the intents: see cairn.checkpoint.intents
        live = _present(store, {k: prior.shard_bytes[k] for k, *_ in reuse.values()}, pool) if committed else set()
        reuse = {name: where for name, where in reuse.items() if where[0] in live}
    fresh = {n: a for n, a in arrays.items() if n not in reuse}
    written = write_shards(store, content, fresh, nonce=nonce, rank=rank, options=options, checksums=sums)
    live = _present(store, {k: prior.shard_bytes[k] for k, *_ in reuse.values()}, pool)
    lost = {name for name, (key, *_) in reuse.items() if key not in live}
    if lost:  # deleted behind this writer's back: write those blocks too, as further shards
        more = write_shards(
            store,
            content,
            {n: arrays[n] for n in lost},
            nonce=nonce,
            rank=rank,
            options=options,
            first_shard=len(written.shards),
            checksums=sums,
        )
        written = RankShards(rank, [*written.shards, *more.shards], [*written.tensors, *more.tensors])
        reuse = {name: where for name, where in reuse.items() if name not in lost}
    linked = [
        TensorEntry(
            name=name,
            dtype=dtype_tag(arrays[name].dtype),
            shape=list(arrays[name].shape),
            shard=key,
            offset=offset,
            length=arrays[name].nbytes,
            checksum=sums[name],
            encoding=encoding,
        )
        for name, (key, offset, encoding) in sorted(reuse.items())
    ]
    shards = sorted({key for key, *_ in reuse.values()})
    return RankShards(
        rank=rank,
        shards=written.shards,
        tensors=[*written.tensors, *linked],
        linked=[_linked_entry(key, prior.shard_bytes[key]) for key in shards],
    )


@dataclass(frozen=True)
class Referenced:
    """What a checkpoint wrote itself and what it references in other ones (``ckpt show``)."""

    written_bytes: int
    referenced_bytes: int
    shards: int
    """Shards of other checkpoints of the run it references."""
    steps: list[int]
    """The steps of the checkpoints those shards belong to."""


def referenced_of(manifest: Manifest) -> Referenced:
    """``manifest`` with its rank indexes read (``read_manifest``), any format."""
    linked = {k for r in manifest.indexes or [] for k in r.linked}
    referenced = sum(t.length for t in manifest.tensors if t.shard in linked)
    steps = sorted(
        {found.step for k in linked if (found := linked_shard(k, manifest.run_id, manifest.kind.value, None))}
    )
    return Referenced(manifest.total_bytes - referenced, referenced, len(linked), steps)
