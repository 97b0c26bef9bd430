"""The read path: parse and check a manifest (``cairn.checkpoint.manifest_read``, re-exported
here), then verify or load its tensors.

Every check runs from the manifest alone before anything is allocated (``Limits``: manifest
bytes, tensor count, total bytes, dimensions per tensor, each dimension <= ``MAX_DIM`` and each
tensor's bytes <= ``max_total_bytes`` — Python integers, so nothing overflows), then the bytes
are streamed through their checksums. Nothing on this path unpickles: arrays are allocated from
(dtype, shape) and filled by ranged reads. ``verify_tensors`` checks a checkpoint of any size
in one reusable buffer; ``read_tensors`` allocates each tensor once, to hand it over.

When a signing key is configured (``CheckpointOptions.signer``), every manifest read verifies
its signature.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Executor, Future, ThreadPoolExecutor

import numpy as np
from blake3 import blake3

from cairn.checkpoint.blocks import base_name, block_name, plan_blocks
from cairn.checkpoint.codec import FRAME_BYTES, FrameSpan, decode_frame, frame_spans
from cairn.checkpoint.layout import shard_object_key
from cairn.checkpoint.manifest import Manifest, TensorEntry
from cairn.checkpoint.manifest_read import (
    load_manifest_object,
    manifest_bytes,
    parse_manifest,
    read_manifest,
    verify_manifest,
)
from cairn.checkpoint.placement import Read, fresh, schedule, slabs_of, span_bytes
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.tensors import (
    CHECK_CHUNK,
    byte_view,
    dtype_from_tag,
    require_checksum,
)
from cairn.errors import (
    IntegrityError,
    ObjectNotFoundError,
    TensorSpecError,
)
from cairn.stores.base import Store

__all__ = [
    "ValueCheck",
    "check_shards_present",
    "parse_manifest",
    "manifest_bytes",
    "load_manifest_object",
    "read_manifest",
    "verify_manifest",
    "verify_tensors",
    "read_tensors",
    "read_logical",
    "stream_logical",
]

ValueCheck = Callable[[str, np.ndarray], None]
"""``value_check(name, chunk)``: raise to refuse a tensor from a 1-D chunk of its values."""


def _at(ref: CheckpointRef, manifest: Manifest, shard: str) -> str:
    """The store key of a shard the manifest names (a v3 index's linked shards: their own)."""
    return shard_object_key(ref.run_id, ref.kind.value, ref.step, shard, indexed=manifest.indexes is not None)


def check_shards_present(store: Store, ref: CheckpointRef, manifest: Manifest, pool: Executor | None = None) -> None:
    """Every listed shard exists with its declared size, so no ranged read can fall short
    (the sizes asked for concurrently on ``pool``: one round trip, not one per shard, on S3)."""

    def size_of(key: str) -> int | None:
        try:
            return store.size(_at(ref, manifest, key))
        except ObjectNotFoundError:
            return None

    keys = [shard.key for shard in manifest.shards]
    sizes = list(pool.map(size_of, keys)) if pool is not None and len(keys) > 1 else [size_of(k) for k in keys]
    for shard, size in zip(manifest.shards, sizes, strict=True):
        if size is None:
            raise IntegrityError("shard listed in the manifest is missing", field=f"shards[{shard.key}]")
        if size != shard.bytes:
            raise IntegrityError(field=f"shards[{shard.key}].bytes", expected=shard.bytes, found=size)


def verify_tensors(
    store: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    *,
    value_check: ValueCheck | None = None,
    chunk_bytes: int = 8 << 20,
) -> None:
    """Check every tensor's checksum (and, with ``value_check``, its values) without ever
    holding a whole tensor: each is streamed through one reusable buffer of ``chunk_bytes``.

    ``manifest`` is one ``read_manifest`` returned (its layout is checked). Memory stays at one
    buffer whatever the checkpoint declares, so a forged multi-GiB checkpoint fails on its
    first missing shard or bad checksum with a typed error, never ``MemoryError``. Chunks hold
    whole elements (their length is a multiple of the itemsize), so ``value_check(name,
    chunk)`` sees a 1-D array of the tensor's dtype, as with ``read_tensors``. Tensors are
    checked in shard order, sequentially.
    """
    check_shards_present(store, ref, manifest)
    buffer = np.empty(max(chunk_bytes, 8) // 8 * 8, dtype=np.uint8)  # whole elements of any dtype
    view = byte_view(buffer)
    for entry in sorted(manifest.tensors, key=lambda t: (t.shard, t.offset, t.name)):
        dtype = dtype_from_tag(entry.dtype)
        if entry.encoding is not None:
            h = blake3()
            for chunk in _decoded(store, ref, manifest, entry):
                h.update(byte_view(chunk))
                if value_check is not None:
                    value_check(base_name(entry.name) if manifest.parts else entry.name, chunk.view(dtype))
            require_checksum(entry.name, entry.checksum, h)
            continue
        step = buffer.size // dtype.itemsize * dtype.itemsize
        h = blake3()
        for start in range(0, entry.length, step):
            size = min(step, entry.length - start)
            store.read_into(_at(ref, manifest, entry.shard), entry.offset + start, view[:size])
            h.update(view[:size])
            if value_check is not None:
                value_check(base_name(entry.name) if manifest.parts else entry.name, buffer[:size].view(dtype))
        require_checksum(entry.name, entry.checksum, h)


def _decoded(store: Store, ref: CheckpointRef, manifest: Manifest, entry: TensorEntry) -> Iterator[np.ndarray]:
    """An encoded entry's logical bytes, frame by frame (each frame's stored checksum and header
    checked before it is decoded), through two buffers of one frame each, reused: use each
    chunk before asking for the next."""
    assert entry.encoding is not None
    size = entry.encoding.frame_bytes
    logical = np.empty(min(size, entry.length), dtype=np.uint8)
    stored = np.empty(max((f.bytes for f in entry.encoding.frames), default=0), dtype=np.uint8)
    for k, (start, end, s_start, s_end) in enumerate(frame_spans(entry)):
        src = byte_view(stored)[: s_end - s_start]
        store.read_into(_at(ref, manifest, entry.shard), entry.offset + s_start, src)
        decode_frame(src, byte_view(logical)[: end - start], entry.encoding.frames[k], _frame_field(entry, k))
        yield logical[: end - start]


def _frame_field(entry: TensorEntry, k: int) -> str:
    return f"tensors[{entry.name}].encoding.frames[{k}]"


@functools.lru_cache(maxsize=8)
def _pools(workers: int, pid: int) -> tuple[ThreadPoolExecutor, ThreadPoolExecutor]:
    """Readers and checkers of restores, kept for the process (keyed by pid: a forked child
    gets its own): starting threads on every restore costs milliseconds each while other
    threads hold the GIL. Checkers wait only for reads, and reads wait for nothing, so
    restores running at the same time share them without deadlock."""
    return (
        ThreadPoolExecutor(max_workers=2 * workers, thread_name_prefix="cairn-read"),
        ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cairn-check"),
    )


def _frame_groups(entry: TensorEntry, group_bytes: int) -> list[list[FrameSpan]]:
    """An encoded entry's frames, in runs read with one request each: consecutive frames of at
    most ``group_bytes`` stored bytes together (a frame larger than that alone)."""
    groups: list[list[FrameSpan]] = []
    for span in frame_spans(entry):
        if groups and span[3] - groups[-1][0][2] <= group_bytes:
            groups[-1].append(span)
        else:
            groups.append([span])
    return groups


def _pieces(entry: TensorEntry, piece_bytes: int, groups: list[list[FrameSpan]] | None = None) -> list[tuple[int, int]]:
    """Byte ranges ``[start, end)`` of one tensor, each a whole number of its elements (an
    encoded entry: its ``groups`` of frames, logically)."""
    if groups is not None:
        return [(group[0][0], group[-1][1]) for group in groups]
    itemsize = dtype_from_tag(entry.dtype).itemsize
    step = max(itemsize, piece_bytes // itemsize * itemsize)
    return [(start, min(entry.length, start + step)) for start in range(0, entry.length, step)]


def read_tensors(
    store: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    *,
    max_workers: int = 4,
    value_check: ValueCheck | None = None,
    only: set[str] | None = None,
    out: dict[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Allocate each tensor from its declared dtype/shape, fill it by ranged reads, verify its
    checksum and (optionally) its values.

    Reading and checking overlap: every tensor is read in pieces (``store.read_piece_bytes``;
    small tensors stored back to back together, into one allocation) by a pool of readers, the
    tensor with the most bytes left to read first, while one checker per tensor hashes and
    ``value_check``s each piece as soon as it has landed, in order, in cache-sized chunks.
    Reads, BLAKE3 and numpy all release the GIL, so the checks run on the other cores while
    the bytes stream in; every byte is still hashed and every value checked before anything
    is returned. Every tensor is allocated whole: to check a checkpoint without holding it,
    use ``verify_tensors``.

    ``only`` reads just these entries (a rank's blocks); ``out`` gives, per entry, the
    C-contiguous array of its dtype and size to fill instead of allocating one (a view into a
    logical tensor, or into a rank's flat shard).
    """
    readers, checkers = _pools(max(1, max_workers), os.getpid())
    wanted = [e for e in manifest.tensors if only is None or e.name in only]
    if only is None:
        check_shards_present(store, ref, manifest, readers)
    else:  # a rank's read: only the shards it reads from
        needed = {e.shard for e in wanted}
        subset = manifest.model_copy(update={"shards": [s for s in manifest.shards if s.key in needed]})
        check_shards_present(store, ref, subset, readers)
    arrays: dict[str, np.ndarray] = {}
    for e in wanted:
        target = None if out is None else out.get(e.name)
        dtype = dtype_from_tag(e.dtype)
        if target is None:
            continue
        if target.dtype != dtype or target.size != math.prod(e.shape) or not target.flags.c_contiguous:
            raise TensorSpecError(
                field=f"tensors[{e.name}]", expected=f"{e.dtype} x {e.shape}", found=f"{target.dtype} x {target.shape}"
            )
        arrays[e.name] = target
    piece_bytes = store.read_piece_bytes
    slabs = slabs_of([e for e in wanted if e.name not in arrays], piece_bytes)
    for run, raw in slabs:
        for e in run:
            at = e.offset - run[0].offset
            if raw is None:  # a run holding an unaligned tensor: each copied out (``read_slab``)
                arrays[e.name] = np.empty(e.shape, dtype=dtype_from_tag(e.dtype))
            else:
                arrays[e.name] = raw[at : at + e.length].view(dtype_from_tag(e.dtype)).reshape(e.shape)
    for e in wanted:
        if e.name not in arrays:
            arrays[e.name] = fresh(e.shape, dtype_from_tag(e.dtype), e.offset if e.encoding is None else None)
    check_name = base_name if manifest.parts else (lambda n: n)
    # Encoded entries are read in runs of frames of up to a piece (one request on S3), one
    # frame of each reader in memory at a time: a compressed restore holds little beyond the state.
    holding = threading.BoundedSemaphore(max(1, max_workers))
    groups = {e.name: _frame_groups(e, max(piece_bytes, FRAME_BYTES)) for e in wanted if e.encoding is not None}
    pieces = {e.name: _pieces(e, piece_bytes, groups.get(e.name)) for e in wanted}
    in_slab = {e.name for run, _ in slabs for e in run}

    def read_slab(run: list[TensorEntry], raw: np.ndarray | None) -> None:
        if raw is not None:
            store.read_into(_at(ref, manifest, run[0].shard), run[0].offset, byte_view(raw))
            return
        # A run holding an unaligned tensor (at most ``UNALIGNED_RUN_BYTES``): read into a buffer
        # of this reader's own (at most ``max_workers`` at once: ``holding``), every tensor
        # copied out into its aligned array before the read counts as landed.
        with holding:
            buffer = np.empty(span_bytes(run), dtype=np.uint8)
            store.read_into(_at(ref, manifest, run[0].shard), run[0].offset, byte_view(buffer))
            for e in run:
                at = e.offset - run[0].offset
                arrays[e.name].reshape(-1).view(np.uint8)[:] = buffer[at : at + e.length]

    def read_piece(entry: TensorEntry, k: int) -> None:
        start, end = pieces[entry.name][k]
        view = byte_view(arrays[entry.name])[start:end]
        if entry.encoding is None:
            store.read_into(_at(ref, manifest, entry.shard), entry.offset + start, view)
            return
        # Encoded frames: the group's stored bytes as consecutive spans (one request on S3),
        # one frame at a time through a buffer of this reader's own (at most ``max_workers``
        # such buffers at once: ``holding``), each frame checked, then decoded straight into
        # the destination.
        group = groups[entry.name][k]
        first = group[0][0]
        sizes = [s_end - s_start for _, _, s_start, s_end in group]
        with holding:
            buffer = byte_view(np.empty(max(sizes), dtype=np.uint8))
            spans = store.read_spans(_at(ref, manifest, entry.shard), entry.offset + group[0][2], sizes, buffer)
            with contextlib.closing(spans):
                for (start, end, _, _), src in zip(group, spans, strict=True):
                    frame = start // entry.encoding.frame_bytes
                    decode_frame(
                        src, view[start - first : end - first], entry.encoding.frames[frame], _frame_field(entry, frame)
                    )

    def check(entry: TensorEntry) -> None:
        flat = arrays[entry.name].reshape(-1)
        itemsize = max(1, flat.itemsize)
        step = max(1, CHECK_CHUNK // itemsize)
        h = blake3()
        for k, (start, end) in enumerate(pieces[entry.name]):
            landed[(entry.name, k)].result()
            for first in range(start // itemsize, end // itemsize, step):
                chunk = flat[first : min(end // itemsize, first + step)]
                h.update(byte_view(chunk))
                if value_check is not None:
                    value_check(check_name(entry.name), chunk)
        require_checksum(entry.name, entry.checksum, h)

    units: list[list[Read]] = [
        [
            (functools.partial(read_piece, e, k), [(e.name, k)], end - start)
            for k, (start, end) in enumerate(pieces[e.name])
        ]
        for e in wanted
        if e.name not in in_slab
    ]
    units += [
        [(functools.partial(read_slab, run, raw), [(e.name, 0) for e in run], span_bytes(run))] for run, raw in slabs
    ]
    order = schedule(units)
    arrival = {name: i for i, (_, keys, _) in reversed(list(enumerate(order))) for name, _ in keys}
    by_arrival = sorted(wanted, key=lambda e: arrival.get(e.name, -1))  # checks start as their bytes land
    landed: dict[tuple[str, int], Future[None]] = {}
    verdicts: list[Future[None]] = []

    try:
        for read, keys, _ in order:
            done = readers.submit(read)
            for key in keys:
                landed[key] = done
        verdicts = [checkers.submit(check, e) for e in by_arrival]
        failures = [f.exception() for f in verdicts]  # wait for all; report in manifest order
    finally:
        # On any failure (or interruption) no read of this restore stays queued or running.
        for f in [*landed.values(), *verdicts]:
            f.cancel()
        futures.wait([*landed.values(), *verdicts])
    by_name = dict(zip((e.name for e in by_arrival), failures, strict=True))
    for entry in wanted:
        failure = by_name[entry.name]
        if failure is not None:
            raise failure
    return {e.name: arrays[e.name] for e in wanted}


def read_logical(
    store: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    *,
    names: set[str] | None = None,
    max_workers: int = 4,
    value_check: ValueCheck | None = None,
) -> dict[str, np.ndarray]:
    """The checkpoint's logical tensors (``names``: only these), any format: a blocked
    tensor is allocated once and its blocks are read straight into their places."""
    if manifest.parts is None:
        return read_tensors(store, ref, manifest, max_workers=max_workers, value_check=value_check, only=names)
    dtype_of = {base_name(t.name): dtype_from_tag(t.dtype) for t in manifest.tensors}
    stored_at = {t.name: t.offset for t in manifest.tensors if t.encoding is None}
    logical = {  # placed as its first block is stored: blocks stored back to back are read from disk
        name: fresh(spec.shape, dtype_of[name], stored_at.get(block_name(name, 0)))
        for name, spec in manifest.parts.items()
        if names is None or name in names
    }
    targets = {
        b.name: logical[b.tensor].reshape(-1)[b.start : b.stop]
        for b in plan_blocks(manifest.parts)
        if b.tensor in logical
    }
    read_tensors(store, ref, manifest, max_workers=max_workers, value_check=value_check, only=set(targets), out=targets)
    return logical


def stream_logical(
    store: Store, ref: CheckpointRef, manifest: Manifest, name: str, buffer: np.ndarray
) -> Iterator[memoryview]:
    """The bytes of logical tensor ``name`` (any format) in order, in chunks read through
    ``buffer`` (reused: use each chunk before asking for the next). Every entry's checksum is
    verified before its last chunk is handed over (an ``IntegrityError`` instead), so a consumer
    that keeps what it wrote only when the stream ends never keeps an unverified byte."""
    entries = {t.name: t for t in manifest.tensors}
    names = [name] if manifest.parts is None else [b.name for b in plan_blocks({name: manifest.parts[name]})]
    view = byte_view(buffer)
    for entry in (entries[n] for n in names):
        itemsize = dtype_from_tag(entry.dtype).itemsize
        step = max(itemsize, len(view) // itemsize * itemsize)
        h = blake3()
        if entry.length == 0:
            require_checksum(entry.name, entry.checksum, h)
        if entry.encoding is not None:  # frame by frame, through buffers of its own (a frame each)
            last = len(entry.encoding.frames) - 1
            for k, decoded in enumerate(_decoded(store, ref, manifest, entry)):
                h.update(byte_view(decoded))
                if k == last:
                    require_checksum(entry.name, entry.checksum, h)
                yield byte_view(decoded)
            continue
        for start in range(0, entry.length, step):
            chunk = view[: min(step, entry.length - start)]
            store.read_into(_at(ref, manifest, entry.shard), entry.offset + start, chunk)
            h.update(chunk)
            if start + len(chunk) == entry.length:
                require_checksum(entry.name, entry.checksum, h)
            yield chunk
