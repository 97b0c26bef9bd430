"""A standalone copy of a checkpoint in another store: every byte it references is copied.

``copy_checkpoint`` reads the source's manifest (every rank index checked), streams each entry's
bytes — its own shards' and those an incremental checkpoint references in earlier checkpoints
(``cairn.checkpoint.reuse``) alike — through one buffer into the copy's own shards, each
entry's checksum verified before its last chunk goes out, copies the history segments it refers
to, and commits a manifest of the same content and layout (the same fingerprint) whose indexes
link nothing: the copy needs no other checkpoint. A failed copy commits nothing.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from blake3 import blake3

from cairn.checkpoint.codec import decode_frame, frame_spans
from cairn.checkpoint.commit import CommitResult, commit_indexed, commit_manifest
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.history import segment_key
from cairn.checkpoint.index import write_rank_index
from cairn.checkpoint.layout import history_segment_bytes, shard_key, shard_object_key
from cairn.checkpoint.manifest import Manifest, ShardEntry, TensorEntry
from cairn.checkpoint.options import CheckpointOptions, resolve_options
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.shards import RankShards, new_save_nonce
from cairn.checkpoint.tensors import CHECKSUM_PREFIX, byte_view, require_checksum
from cairn.errors import ConfigError, IntegrityError, SizeLimitError
from cairn.stores.base import Store

__all__ = ["copy_checkpoint"]

COPY_CHUNK = 8 << 20


def copy_checkpoint(
    source: Store, ref: CheckpointRef, dest: Store, *, options: CheckpointOptions | None = None
) -> CommitResult:
    """Copy the committed checkpoint ``ref`` of ``source`` into ``dest`` under the same
    (run, kind, step), standalone; the result's fingerprint is the source's."""
    options = resolve_options(options)
    if dest.url == source.url:
        raise ConfigError("destination", expected="a store other than the checkpoint's", found=dest.url)
    manifest = read_manifest(source, ref, expect_kind=None, options=options)
    if manifest.history is not None:
        _copy_history(source, dest, manifest)
    buffer = np.empty(COPY_CHUNK, dtype=np.uint8)  # reused: every store copies a chunk before the next
    nonce = new_save_nonce()
    content = CheckpointContent.of(manifest)
    ranks = _by_rank(manifest)
    written = [
        _copy_rank(source, dest, ref, manifest, rank, entries, nonce, buffer, options) for rank, entries in ranks
    ]
    if manifest.indexes is not None:
        refs = [write_rank_index(dest, content, shards, nonce=nonce) for shards in written]
        result = commit_indexed(dest, content, refs, nonce=nonce, parts=manifest.parts or {}, options=options)
    else:
        result = commit_manifest(dest, content, written, nonce=nonce, options=options, parts=manifest.parts)
    if result.manifest.fingerprint != manifest.fingerprint:
        raise IntegrityError(
            "the copy's fingerprint differs from its source's",
            field="fingerprint",
            expected=manifest.fingerprint,
            found=result.manifest.fingerprint,
        )
    return result


def _by_rank(manifest: Manifest) -> list[tuple[int, list[TensorEntry]]]:
    """The entries each rank index covers (one group for a v1/v2 manifest), by rank."""
    if manifest.indexes is None:
        return [(0, sorted(manifest.tensors, key=lambda t: t.name))]
    covered = {iref.rank: {(t, i) for t, a, b in iref.covers for i in range(a, b)} for iref in manifest.indexes}
    groups: dict[int, list[TensorEntry]] = {rank: [] for rank in covered}
    for t in sorted(manifest.tensors, key=lambda t: t.name):
        tensor, _, index = t.name.rpartition("#")
        rank = next(r for r, blocks in covered.items() if (tensor, int(index)) in blocks)
        groups[rank].append(t)
    return sorted(groups.items())


def _copy_rank(
    source: Store,
    dest: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    rank: int,
    entries: list[TensorEntry],
    nonce: str,
    buffer: np.ndarray,
    options: CheckpointOptions,
) -> RankShards:
    """One rank's entries into shards of about ``options.shard_bytes`` of the copy."""
    plans: list[list[TensorEntry]] = []
    for t in entries:
        if not plans or (plans[-1] and sum(e.stored_length for e in plans[-1]) + t.stored_length > options.shard_bytes):
            plans.append([])
        plans[-1].append(t)
    shards: list[ShardEntry] = []
    out: list[TensorEntry] = []
    for number, plan in enumerate(plans):
        key = shard_key(nonce, rank, number)
        plan.sort(key=lambda t: t.encoding is not None)  # raw entries first, as a save stores them
        size = sum(t.stored_length for t in plan)  # encoded entries are copied as stored
        chunks = _stream(source, ref, manifest, plan, buffer)
        dest.write_object(f"{ref.prefix}/{key}", chunks, size=size)
        offset = 0
        for t in plan:
            out.append(t.model_copy(update={"shard": key, "offset": offset}))
            offset += t.stored_length
        shards.append(ShardEntry(key=key, rank=rank, bytes=size))
    return RankShards(rank=rank, shards=shards, tensors=out)


def _stream(
    source: Store, ref: CheckpointRef, manifest: Manifest, plan: list[TensorEntry], buffer: np.ndarray
) -> Iterator[memoryview]:
    view = byte_view(buffer)
    indexed = manifest.indexes is not None
    for t in plan:
        where = shard_object_key(ref.run_id, ref.kind.value, ref.step, t.shard, indexed=indexed)
        h = blake3()
        if t.length == 0:
            require_checksum(t.name, t.checksum, h)
        if t.encoding is not None:
            yield from _stream_encoded(source, where, t, view)
            continue
        for start in range(0, t.length, len(view)):
            chunk = view[: min(len(view), t.length - start)]
            source.read_into(where, t.offset + start, chunk)
            h.update(chunk)
            if start + len(chunk) == t.length:
                require_checksum(t.name, t.checksum, h)  # before the last chunk leaves
            yield chunk


def _stream_encoded(source: Store, where: str, t: TensorEntry, view: memoryview) -> Iterator[memoryview]:
    """An encoded entry's frames as stored, each checked (its stored checksum, and decoded: the
    entry's logical checksum) before the last leaves: the copy holds what a restore accepts."""
    assert t.encoding is not None
    h = blake3()
    logical = np.empty(min(t.encoding.frame_bytes, t.length), dtype=np.uint8)
    last = len(t.encoding.frames) - 1
    for k, (start, end, s_start, s_end) in enumerate(frame_spans(t)):
        size = s_end - s_start
        stored = view[:size] if size <= len(view) else byte_view(np.empty(size, dtype=np.uint8))
        source.read_into(where, t.offset + s_start, stored)
        decode_frame(
            stored, byte_view(logical)[: end - start], t.encoding.frames[k], f"tensors[{t.name}].encoding.frames[{k}]"
        )
        h.update(byte_view(logical)[: end - start])
        if k == last:
            require_checksum(t.name, t.checksum, h)
        yield stored


def _copy_history(source: Store, dest: Store, manifest: Manifest) -> None:
    """Every history segment the manifest refers to, each checked against its checksum."""
    assert manifest.history is not None
    for name, series in manifest.history.series.items():
        for seg in series.segments:
            key = segment_key(manifest.run_id, name, seg)
            want = history_segment_bytes(seg.start, seg.end)
            try:
                raw = source.read(key, want)  # a larger object is refused by its size, unread
            except SizeLimitError as exc:
                where, size = f"history.series[{name}]", exc.found
                message = "history segment has the wrong size"
                raise IntegrityError(message, field=where, expected=want, found=size) from None
            found = CHECKSUM_PREFIX + blake3(raw).hexdigest()
            if found != seg.checksum or len(raw) != want:
                raise IntegrityError(
                    "history segment bytes do not match their checksum",
                    field=f"history.series[{name}]",
                    expected=seg.checksum,
                    found=found,
                )
            dest.write_object(key, [raw], size=len(raw))
