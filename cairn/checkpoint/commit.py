"""The commit protocol: a checkpoint exists once, and only once, its manifest is committed.

Order (see ``cairn.stores.base``): every rank's shards are durable first (``write_shards``);
then one manifest listing all of them is written by create-if-absent (``put_if_absent``:
``link(2)`` on disk, ``If-None-Match: *`` on S3). That write is the commit: readers never see a
checkpoint without it, and ``latest`` only moves to committed steps.

The idempotency key is the checkpoint prefix ``RUN/KIND/STEP``. A writer that finds the key
already committed compares fingerprints (``_converge``): equal is success without rewriting,
different is ``CheckpointConflictError`` (the run is not deterministic, or two runs share an
id). The commit is read back after writing, so the check holds even on a store that ignored
the condition. A losing writer deletes its own nonce-named shards; nobody else refers to them.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import numpy as np

from cairn.checkpoint.blocks import check_parts, parts_json, parts_of, split_blocks
from cairn.checkpoint.content import CheckpointContent, check_content, index_of
from cairn.checkpoint.layout import checkpoint_prefix, manifest_key
from cairn.checkpoint.manifest import BLOCKED_FORMAT_VERSION, FORMAT_VERSION, Manifest, PartSpec, WriterInfo
from cairn.checkpoint.options import CheckpointOptions, resolve_options
from cairn.checkpoint.reader import parse_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.shards import RankShards, new_save_nonce, write_shards
from cairn.checkpoint.tensors import as_le_contiguous, dtype_tag, tensor_checksum
from cairn.errors import CairnError, CheckpointConflictError, SizeLimitError, TensorSpecError
from cairn.stores.base import Store

__all__ = ["CommitResult", "commit_manifest", "write_checkpoint"]


@dataclass(frozen=True)
class CommitResult:
    ref: CheckpointRef
    manifest: Manifest
    created: bool
    """False when an identical checkpoint was already committed under the same key."""
    seconds: float = 0.0
    """Wall time of the save (shards and commit), for metrics and reports."""


def commit_manifest(
    store: Store,
    content: CheckpointContent,
    ranks: list[RankShards],
    *,
    nonce: str,
    options: CheckpointOptions | None = None,
    parts: dict[str, PartSpec] | None = None,
) -> CommitResult:
    """Phase 2, run once (by the coordinator) after every rank's shards are durable:
    commit one manifest listing all of them, by create-if-absent. This is the commit.
    ``parts``: the blocked layout (format v2) the ranks wrote (``cairn.checkpoint.blocks``)."""
    options = resolve_options(options)
    mkey = manifest_key(content.run_id, content.kind, content.step)
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
    if options.signer is not None:
        manifest = manifest.model_copy(update={"signature": options.signer.sign(manifest.signed_payload())})
    prefix = checkpoint_prefix(content.run_id, content.kind, content.step)
    orphans = [f"{prefix}/{s.key}" for s in shards]
    if parts is not None:  # ranks that disagreed on their blocks: every reader would refuse it
        try:
            check_parts(manifest)
        except CairnError:
            store.delete(orphans)
            raise
    raw = manifest.to_json_bytes()
    bound = options.limits.max_manifest_bytes
    if len(raw) > bound:  # a reader would refuse it: do not commit it
        store.delete(orphans)
        raise SizeLimitError(field="manifest", expected=f"<= {bound} bytes", found=len(raw))
    if store.put_if_absent(mkey, raw):
        # Trust, then verify: if a store ever ignored the condition and another writer's
        # manifest replaced ours, the fingerprint comparison below still catches it.
        committed = parse_manifest(store.read(mkey), str(ref), limits=options.limits)
        if committed.writer.nonce == nonce:
            return CommitResult(ref=ref, manifest=manifest, created=True)
        return _converge(store, ref, fingerprint, orphan_keys=[], options=options)
    return _converge(store, ref, fingerprint, orphan_keys=orphans, options=options)


def write_checkpoint(
    store: Store,
    content: CheckpointContent,
    tensors: Mapping[str, np.ndarray],
    *,
    options: CheckpointOptions | None = None,
    block_bytes: int | None = None,
) -> CommitResult:
    """Single-writer save: shards, then the manifest, under the (run, kind, step) key.
    ``block_bytes``: write the blocked layout (format v2) a distributed save of the same state
    writes, so both have the same fingerprint."""
    started = time.perf_counter()
    options = resolve_options(options)
    ref = CheckpointRef(store.url, content.run_id, content.kind, content.step)
    parts = None
    if block_bytes is not None:
        parts = parts_of(tensors, block_bytes)
        tensors = split_blocks(tensors, parts)
    if store.exists(manifest_key(content.run_id, content.kind, content.step)):
        # A retry (or a stale writer) of a committed step: compare, don't rewrite.
        check_content(content, tensors, options.limits)  # (write_shards checks it on the other path)
        arrays = {name: as_le_contiguous(a) for name, a in tensors.items()}
        index = [(n, dtype_tag(a.dtype), list(a.shape), tensor_checksum(a)) for n, a in sorted(arrays.items())]
        fingerprint = content.fingerprint(index, parts_json(parts))
        result = _converge(store, ref, fingerprint, orphan_keys=[], options=options)
    else:
        nonce = new_save_nonce()
        rank0 = write_shards(store, content, tensors, nonce=nonce, options=options)
        result = commit_manifest(store, content, [rank0], nonce=nonce, options=options, parts=parts)
    return replace(result, seconds=time.perf_counter() - started)


def _converge(
    store: Store, ref: CheckpointRef, fingerprint: str, *, orphan_keys: list[str], options: CheckpointOptions
) -> CommitResult:
    """Another writer committed this key first: identical content is success, else conflict."""
    mkey = manifest_key(ref.run_id, ref.kind, ref.step)
    existing = parse_manifest(store.read(mkey), str(ref), limits=options.limits)
    store.delete(orphan_keys)  # only this attempt's nonce-named shards: nobody else refers to them
    if existing.fingerprint != fingerprint:
        raise CheckpointConflictError(
            "a different checkpoint is already committed under this idempotency key "
            f"({ref.run_id}/{ref.kind}/{ref.step}): the run is not deterministic, or two runs share an id",
            field="fingerprint",
            expected=existing.fingerprint,
            found=fingerprint,
        )
    return CommitResult(ref=ref, manifest=existing, created=False)
