"""The commit protocol: a checkpoint exists once, and only once, its manifest is committed.

Order (see ``cairn.stores.base``): every rank's shards are durable first (``write_shards``),
and for a blocked (v3) save its index object (``cairn.checkpoint.index``); then one manifest
listing all of them (v3: all the rank indexes) is written by create-if-absent (``put_if_absent``:
``link(2)`` on disk, ``If-None-Match: *`` on S3). That write is the commit: readers never see a
checkpoint without it, and ``latest`` only moves to committed steps.

The idempotency key is the checkpoint prefix ``RUN/KIND/STEP``. A writer that finds the key
already committed compares fingerprints (``_converge``): equal is success without rewriting,
different is ``CheckpointConflictError`` (the run is not deterministic, or two runs share an
id). A single-process save compares in the committed layout (``write_checkpoint``): a retry or
a racing writer may differ in the incremental setting, so in the format (v1 or v3). The commit
is read back after writing, so the check holds even on a store that ignored the condition. A
losing writer deletes its own nonce-named shards; nobody else refers to them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np

from cairn.checkpoint.blocks import check_parts, parts_json, parts_of, split_blocks
from cairn.checkpoint.content import CheckpointContent, check_content, index_of
from cairn.checkpoint.index import attempt_keys, check_index_refs, index_summary, summary_of, write_rank_index
from cairn.checkpoint.latest import advance_latest
from cairn.checkpoint.layout import checkpoint_prefix, manifest_key
from cairn.checkpoint.manifest import (
    BLOCKED_FORMAT_VERSION,
    FORMAT_VERSION,
    INDEXED_FORMAT_VERSION,
    IndexRef,
    Manifest,
    PartSpec,
    WriterInfo,
)
from cairn.checkpoint.options import CheckpointOptions, resolve_options
from cairn.checkpoint.reader import load_manifest_object, read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.reuse import remember_blocks, write_rank_blocks
from cairn.checkpoint.shards import RankShards, new_save_nonce, write_shards
from cairn.checkpoint.tensors import as_le_contiguous, dtype_tag, tensor_checksum
from cairn.errors import (
    CairnError,
    CheckpointConflictError,
    CheckpointError,
    CheckpointNotFoundError,
    SizeLimitError,
    TensorSpecError,
)
from cairn.stores.base import Store

__all__ = ["CommitResult", "commit_manifest", "commit_indexed", "write_checkpoint"]


@dataclass(frozen=True)
class CommitResult:
    ref: CheckpointRef
    manifest: Manifest
    created: bool
    """False when an identical checkpoint was already committed under the same key."""
    seconds: float = 0.0
    """Wall time of the save (shards and commit), for metrics and reports."""


Relayout = Callable[[Manifest], str | None]
"""Given the manifest another writer committed under the key: this state's fingerprint in its
layout, or None when that layout is the one this writer used (its fingerprint stands)."""


def commit_manifest(
    store: Store,
    content: CheckpointContent,
    ranks: list[RankShards],
    *,
    nonce: str,
    options: CheckpointOptions | None = None,
    parts: dict[str, PartSpec] | None = None,
    relayout: Relayout | None = None,
) -> CommitResult:
    """Phase 2, run once (by the coordinator) after every rank's shards are durable:
    commit one manifest listing all of them, by create-if-absent. This is the commit.
    ``parts``: the blocked layout (format v2, which lists every block in the manifest: blocked
    saves write v3 now, ``commit_indexed``) the ranks wrote (``cairn.checkpoint.blocks``).
    ``relayout``: when another writer committed the key in another layout, this state's
    fingerprint in that layout (``_converge``)."""
    options = resolve_options(options)
    if parts is not None:  # v2 parts name no dtype (the blocks do)
        parts = {name: spec.model_copy(update={"dtype": None}) for name, spec in parts.items()}
    ref = CheckpointRef(store.url, content.run_id, content.kind, content.step)
    entries = sorted((e for r in ranks for e in r.tensors), key=lambda e: e.name)
    names = [e.name for e in entries]
    if len(set(names)) != len(names):
        raise TensorSpecError("two ranks wrote the same tensor", field="tensors", found=sorted(names))
    shards = [s for r in sorted(ranks, key=lambda r: r.rank) for s in r.shards]
    fingerprint = content.fingerprint(index_of(entries), parts_json(parts))
    manifest = Manifest(
        **content.manifest_fields(),
        format_version=FORMAT_VERSION if parts is None else BLOCKED_FORMAT_VERSION,
        parts=parts,
        tensors=entries,
        shards=shards,
        total_bytes=sum(e.length for e in entries),
        fingerprint=fingerprint,
        writer=WriterInfo(
            nonce=nonce, ranks=max(1, len(ranks)), created_at=datetime.now(UTC).isoformat(timespec="milliseconds")
        ),
    )
    prefix = checkpoint_prefix(content.run_id, content.kind, content.step)
    orphans = [f"{prefix}/{s.key}" for s in shards]
    return _commit(store, ref, manifest, lambda: orphans, options, relayout)


def commit_indexed(
    store: Store,
    content: CheckpointContent,
    refs: list[IndexRef],
    *,
    nonce: str,
    parts: dict[str, PartSpec],
    options: CheckpointOptions | None = None,
    relayout: Relayout | None = None,
) -> CommitResult:
    """Phase 2 of a v3 save, run once (by the coordinator) after every rank's shards and index
    object are durable: commit the root manifest — the parts and every rank's ``IndexRef``, no
    block entries — by create-if-absent. This is the commit. The root is O(ranks + tensors).
    ``relayout``: as for ``commit_manifest``."""
    options = resolve_options(options)
    ref = CheckpointRef(store.url, content.run_id, content.kind, content.step)
    refs = sorted(refs, key=lambda r: r.rank)
    manifest = Manifest(
        **content.manifest_fields(),
        format_version=INDEXED_FORMAT_VERSION,
        parts=parts,
        indexes=refs,
        tensors=[],
        shards=[],
        total_bytes=sum(r.total_bytes for r in refs),
        fingerprint=content.fingerprint([], parts_json(parts), index_summary(refs)),
        writer=WriterInfo(
            nonce=nonce, ranks=max(1, len(refs)), created_at=datetime.now(UTC).isoformat(timespec="milliseconds")
        ),
    )
    return _commit(store, ref, manifest, _attempt_orphans(store, content, nonce), options, relayout)


def _attempt_orphans(store: Store, content: CheckpointContent, nonce: str) -> Callable[[], list[str]]:
    """This attempt's objects, listed only when they are to be deleted (ranks' shards and indexes)."""
    return lambda: list(attempt_keys(store, content.run_id, content.kind, content.step, nonce))


def _commit(
    store: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    orphans: Callable[[], list[str]],
    options: CheckpointOptions,
    relayout: Relayout | None = None,
) -> CommitResult:
    """Sign, check, and create the manifest if absent (else converge on the one committed)."""
    if options.signer is not None:
        manifest = manifest.model_copy(update={"signature": options.signer.sign(manifest.signed_payload())})
    try:
        check_parts(manifest)  # ranks that disagreed on their blocks: every reader would refuse it
        if manifest.indexes is not None:
            check_index_refs(manifest, options.limits)
        raw = manifest.to_json_bytes()
        bound = options.limits.max_manifest_bytes
        if len(raw) > bound:  # a reader would refuse it: do not commit it
            raise SizeLimitError(field="manifest", expected=f"<= {bound} bytes", found=len(raw))
    except CairnError:
        store.delete(orphans())
        raise
    mkey = manifest_key(ref.run_id, ref.kind, ref.step)
    if store.put_if_absent(mkey, raw):
        # Trust, then verify: if a store ever ignored the condition and another writer's
        # manifest replaced ours, the fingerprint comparison below still catches it.
        committed = load_manifest_object(store, ref, options.limits)
        if committed.writer.nonce == manifest.writer.nonce:
            advance_latest(store, ref, manifest.fingerprint)
            return CommitResult(ref=ref, manifest=manifest, created=True)
        return _converge(store, ref, manifest.fingerprint, orphan_keys=[], options=options, relayout=relayout)
    # Not created by this call — or created by it, with the answer lost and the retried request
    # refused: then the committed manifest is ours, and its shards must not be deleted.
    committed = load_manifest_object(store, ref, options.limits)
    if committed.writer.nonce == manifest.writer.nonce:
        advance_latest(store, ref, manifest.fingerprint)
        return CommitResult(ref=ref, manifest=manifest, created=True)
    return _converge(store, ref, manifest.fingerprint, orphan_keys=orphans(), options=options, relayout=relayout)


def write_checkpoint(
    store: Store,
    content: CheckpointContent,
    tensors: Mapping[str, np.ndarray],
    *,
    options: CheckpointOptions | None = None,
    block_bytes: int | None = None,
    incremental: bool = False,
) -> CommitResult:
    """Single-writer save: shards, then the manifest, under the (run, kind, step) key.
    ``block_bytes``: write the blocked layout (format v3: one rank index) a distributed save of
    the same state writes, so both have the same fingerprint. ``incremental`` (with
    ``block_bytes``): reference the blocks this process knows the run holds durably instead of
    rewriting them (``cairn.checkpoint.reuse``); the fingerprint is the same."""
    started = time.perf_counter()
    options = resolve_options(options)
    ref = CheckpointRef(store.url, content.run_id, content.kind, content.step)
    mkey = manifest_key(content.run_id, content.kind, content.step)
    if store.exists(mkey):
        # A retry (or a stale writer) of a committed step: compare, don't rewrite — in the
        # committed layout when it holds these tensors (a retry may differ in incremental).
        committed = _committed_there(store, ref, options, orphan_keys=[])
        fingerprint = _fingerprint_in(committed, content, tensors, block_bytes, options)
        result = _converge(store, ref, fingerprint, orphan_keys=[], options=options)
    elif block_bytes is None:
        nonce = new_save_nonce()
        rank0 = write_shards(store, content, tensors, nonce=nonce, options=options)
        relayout = _relayout(content, tensors, block_bytes, options, parts=None)
        result = commit_manifest(store, content, [rank0], nonce=nonce, options=options, relayout=relayout)
    else:
        nonce = new_save_nonce()
        parts = parts_of(tensors, block_bytes)
        write = write_rank_blocks if incremental else write_shards
        rank0 = write(store, content, split_blocks(tensors, parts), nonce=nonce, options=options)
        index_ref = write_rank_index(store, content, rank0, nonce=nonce)
        relayout = _relayout(content, tensors, block_bytes, options, parts=parts)
        result = commit_indexed(
            store, content, [index_ref], nonce=nonce, options=options, parts=parts, relayout=relayout
        )
        if incremental and result.created:
            kind, step = content.kind.value, content.step
            entries, shards = rank0.tensors, [*rank0.shards, *rank0.linked]
            remember_blocks(store, content.run_id, kind, step, entries, shards, indexed=True, nonce=nonce)
    return replace(result, seconds=time.perf_counter() - started)


def _fingerprint_in(
    committed: Manifest,
    content: CheckpointContent,
    tensors: Mapping[str, np.ndarray],
    block_bytes: int | None,
    options: CheckpointOptions,
) -> str:
    """The fingerprint of this state in ``committed``'s layout when it holds these tensors (v3
    at its block sizes, else v1), or at ``block_bytes`` for a v3 checkpoint of other tensors."""
    parts = _same_layout(committed, tensors)
    if parts is None and committed.parts is not None and block_bytes is not None:
        parts = parts_of(tensors, block_bytes)
    blocks = tensors if parts is None else split_blocks(tensors, parts)
    check_content(content, blocks, options.limits)  # (write_shards checks it on the other path)
    arrays = {name: as_le_contiguous(a) for name, a in blocks.items()}
    index = [(n, dtype_tag(a.dtype), list(a.shape), tensor_checksum(a)) for n, a in sorted(arrays.items())]
    if parts is None:
        return content.fingerprint(index)
    return content.fingerprint([], parts_json(parts), summary_of(index))


def _relayout(
    content: CheckpointContent,
    tensors: Mapping[str, np.ndarray],
    block_bytes: int | None,
    options: CheckpointOptions,
    *,
    parts: dict[str, PartSpec] | None,
) -> Relayout:
    """For a racing writer's commit in another layout (v1 vs v3, as the incremental setting
    decides; ``parts``: this writer's v3 blocks, None for v1): this state's fingerprint in the
    committed layout, as a retry computes it."""

    def relayout(committed: Manifest) -> str | None:
        if (committed.parts if committed.indexes is not None else None) == parts:
            return None  # the layout this writer used (v1, or v3 at these blocks): its fingerprint stands
        return _fingerprint_in(committed, content, tensors, block_bytes, options)

    return relayout


def _same_layout(committed: Manifest, tensors: Mapping[str, np.ndarray]) -> dict[str, PartSpec] | None:
    """The committed v3 checkpoint's parts when they are exactly these tensors' (names, shapes,
    dtypes) at its block sizes; None for a v1 checkpoint or any other."""
    parts = committed.parts if committed.indexes is not None else None
    if parts is None or set(parts) != set(tensors):
        return None
    for name, spec in parts.items():
        arr = tensors[name]
        if spec.shape != list(arr.shape) or spec.dtype != dtype_tag(arr.dtype):
            return None
    return parts


def _committed_there(store: Store, ref: CheckpointRef, options: CheckpointOptions, orphan_keys: list[str]) -> Manifest:
    """The manifest committed at ``ref``, checked as every reader checks it (signature included):
    an object there that Cairn did not commit is a ``CheckpointConflictError`` (this attempt's
    ``orphan_keys`` deleted first), never taken for a state."""
    try:
        return read_manifest(store, ref, expect_kind=None, options=options, expand_index=False)
    except CheckpointNotFoundError:
        raise
    except CheckpointError as exc:
        store.delete(orphan_keys)
        raise CheckpointConflictError(
            f"{ref}: this step's manifest key holds an object Cairn did not commit ({exc.type_name}: {exc}); "
            "`cairn ckpt list` shows it: remove it by hand",
            field="manifest",
        ) from exc


def _converge(
    store: Store,
    ref: CheckpointRef,
    fingerprint: str,
    *,
    orphan_keys: list[str],
    options: CheckpointOptions,
    relayout: Relayout | None = None,
) -> CommitResult:
    """Another writer committed this key first: identical content is success, else conflict.
    The committed manifest is checked as every reader checks it (signature included): an object
    there that Cairn did not commit is a conflict, never taken for this state.
    ``relayout``: this state's fingerprint in the committed manifest's layout, when that is
    not the one ``fingerprint`` was computed in."""
    existing = _committed_there(store, ref, options, orphan_keys)
    store.delete(orphan_keys)  # only this attempt's nonce-named shards: nobody else refers to them
    if existing.fingerprint != fingerprint and relayout is not None:
        fingerprint = relayout(existing) or fingerprint
    if existing.fingerprint != fingerprint:
        raise CheckpointConflictError(
            "a different checkpoint is already committed under this idempotency key "
            f"({ref.run_id}/{ref.kind}/{ref.step}): the run is not deterministic, or two runs share an id",
            field="fingerprint",
            expected=existing.fingerprint,
            found=fingerprint,
        )
    advance_latest(store, ref, existing.fingerprint)
    return CommitResult(ref=ref, manifest=existing, created=False)
