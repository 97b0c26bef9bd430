"""Coordinated save and load: every rank writes its own blocks, one commit, any world size back.

Save (``coordinated_save``): rank 0 draws the attempt's nonce and broadcasts it; every rank
streams its own blocks out as its own shard files (``write_shards``, concurrently across
ranks), then its own index object (``cairn.checkpoint.index``); an all-gather of the ranks'
index refs (a few hundred bytes each, whatever the number of blocks) is the barrier — it
completes only when every rank's shards and index are durable, or reports which rank failed;
then rank 0 alone commits the root manifest (``commit_indexed``, create-if-absent, format v3)
and broadcasts the outcome. With ``options.incremental`` each rank references the blocks it
knows the run holds durably instead of rewriting them (``cairn.checkpoint.reuse``: the blocks
it last committed, or read and verified in a restore). A rank that dies before the
commit leaves nonce-named shards and no manifest: no checkpoint exists, and the retry (a new
nonce) converges on the same idempotency key (run, kind, step). Retention collects the orphans.

Load (``read_blocks``): every rank reads the root manifest and checks it against the run's
trainer (all metadata rules), reads only the rank indexes that cover the blocks it owns at the
*new* world size, then exactly those blocks — ranged
reads of those byte ranges only, each block checksummed and value-checked — into its own
buffers. The outcome of every rank is agreed before anyone uses what it read.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cairn.checkpoint.commit import commit_indexed
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.index import expand, write_rank_index
from cairn.checkpoint.manifest import IndexRef, Manifest, PartSpec
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.reader import read_tensors
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.reuse import remember_blocks, write_rank_blocks
from cairn.checkpoint.shards import new_save_nonce, write_shards
from cairn.distributed.comm import Comm
from cairn.errors import CairnError, StorageError, error_named
from cairn.faults import maybe_crash
from cairn.stores.base import Store

__all__ = ["SaveOutcome", "coordinated_save", "agree", "failure_of", "read_blocks"]


@dataclass(frozen=True)
class SaveOutcome:
    ref: str
    fingerprint: str
    created: bool
    total_bytes: int
    seconds: float


def failure_of(exc: BaseException) -> list[str]:
    if isinstance(exc, CairnError):
        return [exc.type_name, str(exc)]
    return [StorageError.__name__, f"{type(exc).__name__}: {exc}"]


def agree(comm: Comm, failure: list[str] | None, what: str) -> None:
    """Every rank learns whether any rank failed ``what``; all raise the first failure (typed),
    so no rank goes on with a state its peers refused."""
    reports = comm.all_gather_json(failure)
    for rank, report in enumerate(reports):
        if report is not None:
            type_name, message = report
            prefix = "" if comm.world == 1 else f"rank {rank} of {comm.world}: {what}: "
            raise error_named(type_name, prefix + message)


def coordinated_save(
    comm: Comm,
    store: Store,
    content: CheckpointContent,
    mine: Mapping[str, np.ndarray],
    parts: dict[str, PartSpec],
    options: CheckpointOptions,
) -> SaveOutcome:
    """Phase 1 on every rank (its own blocks), the barrier, phase 2 on rank 0; see the module."""
    started = time.perf_counter()
    nonce = comm.broadcast_json(new_save_nonce() if comm.rank == 0 else None)
    report: dict[str, Any]
    write = write_rank_blocks if options.incremental else write_shards
    shards = None
    try:
        shards = write(store, content, mine, nonce=nonce, rank=comm.rank, options=options)
        report = {"index": write_rank_index(store, content, shards, nonce=nonce).model_dump(mode="json")}
    except Exception as exc:  # reported to every rank below, then raised everywhere
        report = {"error": failure_of(exc)}
    maybe_crash("rank-mid-save", tag=f"{comm.rank}@{content.step}")
    reports = comm.all_gather_json(report)  # the barrier: every rank's shards and index are durable
    for rank, r in enumerate(reports):  # every rank sees the same reports: all raise alike
        if "error" in r:
            raise error_named(r["error"][0], f"rank {rank} of {comm.world}: save: {r['error'][1]}")
    outcome: dict[str, Any] | None = None
    failure: list[str] | None = None
    if comm.rank == 0:
        try:
            refs = [IndexRef.model_validate(r["index"]) for r in reports]
            result = commit_indexed(store, content, refs, nonce=nonce, options=options, parts=parts)
            outcome = {
                "ref": str(result.ref),
                "fingerprint": result.manifest.fingerprint,
                "created": result.created,
                "total_bytes": result.manifest.total_bytes,
            }
        except Exception as exc:
            failure = failure_of(exc)
    agree(comm, failure, "commit")
    done = comm.broadcast_json(outcome)
    if options.incremental and done["created"] and shards is not None:  # this rank's blocks, for its next save
        kind, step, entries = content.kind.value, content.step, shards.tensors
        held = [*shards.shards, *shards.linked]
        remember_blocks(store, content.run_id, kind, step, entries, held, indexed=True, nonce=nonce, rank=comm.rank)
    return SaveOutcome(seconds=time.perf_counter() - started, **done)


def read_blocks(
    comm: Comm,
    store: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    targets: Mapping[str, np.ndarray],
    *,
    value_check: Any,
    options: CheckpointOptions,
) -> None:
    """Fill ``targets`` (block entry name -> this rank's buffer for it) by ranged reads, every
    block checked; then agree with every rank that all reads passed."""
    failure: list[str] | None = None
    try:
        if manifest.indexes is not None and not manifest.tensors:  # a v3 root: only the indexes this rank needs
            manifest = expand(store, ref, manifest, set(targets), workers=2 * options.max_workers)
        read_tensors(
            store,
            ref,
            manifest,
            max_workers=options.max_workers,
            value_check=value_check,
            only=set(targets),
            out=dict(targets),
        )
    except Exception as exc:
        failure = failure_of(exc)
    agree(comm, failure, f"restore of {ref}")
    if options.incremental:  # the blocks this rank read and verified (not its indexes' others), for its next save
        indexed, kind, nonce = manifest.indexes is not None, ref.kind.value, manifest.writer.nonce
        read = [t for t in manifest.tensors if t.name in targets]
        remember_blocks(
            store, ref.run_id, kind, ref.step, read, manifest.shards, indexed=indexed, nonce=nonce, rank=comm.rank
        )
