"""Checkpoints: formats v1 (manifest + shards) and v3 (blocks, per-rank indexes), the commit
protocol, validated import. It knows no trainer: a training state is saved and loaded through
its trainer two layers up (``cairn.training``).

Modules: ``layout`` (where things live in a store), ``manifest`` (the data model), ``content``
(what the fingerprint covers), ``ref`` (a checkpoint's reference), ``tensors`` (tensor specs,
bytes and checksums), ``shards`` (phase 1 of a save), ``commit`` (phase 2: the commit protocol),
``committed`` (what counts as committed; listing), ``latest`` (the latest pointer, the latest committed checkpoint),
``manifest_read`` (a manifest checked before anything is allocated), ``reader`` (the read path),
``placement`` (where a restore's bytes land, and in which order they are read),
``options`` (signer, limits, shard settings), ``signing`` (HMAC over the manifest), ``blocks``
(the blocked layout), ``index`` (format v3's per-rank indexes), ``reuse`` (incremental saves),
``intents`` (a save's notice before it references another checkpoint's shards), ``training`` (a
training state in checkpoint form), ``validate`` (a checkpoint against declared tensor specs and
bounds), ``history`` (a training history's run-level segments), ``exposures`` (final-test
exposures), ``retention`` (keep the last N and the pinned, collect the rest), ``copy`` (a
standalone copy in another store), ``tier`` (a node-local tier in front of the durable store),
``upload`` (a local commit copied to the durable store), ``compare`` (two training states, bit
for bit), ``codec`` (lossless per-entry compression: the frame format and its checks),
``compression`` (whether a save compresses, and what its automatic choice measures).
"""

from cairn.checkpoint.commit import CommitResult, commit_manifest, write_checkpoint
from cairn.checkpoint.committed import Verdict, judge_all, list_checkpoints, manifest_candidates
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.compression import CompressionChoice, last_choice
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.copy import copy_checkpoint
from cairn.checkpoint.exposures import exposure_count, record_test_exposure
from cairn.checkpoint.history import verify_history
from cairn.checkpoint.latest import LatestCursor, latest_committed, latest_cursor
from cairn.checkpoint.layout import RUN_ID_PATTERN
from cairn.checkpoint.manifest import FORMAT_VERSION, CheckpointKind, Manifest
from cairn.checkpoint.options import CheckpointOptions, Limits, checkpoint_overrides
from cairn.checkpoint.reader import read_manifest, read_tensors, verify_tensors
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage, pin, pinned_steps, plan_gc, unpin
from cairn.checkpoint.reuse import referenced_of
from cairn.checkpoint.shards import RankShards, new_save_nonce, write_shards
from cairn.checkpoint.signing import Signer, signer_from_env
from cairn.checkpoint.tier import NodeTier, TieredStore
from cairn.checkpoint.training import training_tensors
from cairn.checkpoint.validate import manifest_config

__all__ = [
    "FORMAT_VERSION",
    "RUN_ID_PATTERN",
    "CheckpointContent",
    "CheckpointKind",
    "CheckpointOptions",
    "CheckpointRef",
    "CommitResult",
    "CompressionChoice",
    "LatestCursor",
    "Limits",
    "Manifest",
    "NodeTier",
    "RankShards",
    "RetentionPolicy",
    "Signer",
    "TieredStore",
    "Verdict",
    "collect_garbage",
    "checkpoint_overrides",
    "commit_manifest",
    "compare_states",
    "copy_checkpoint",
    "exposure_count",
    "judge_all",
    "last_choice",
    "latest_committed",
    "latest_cursor",
    "list_checkpoints",
    "manifest_candidates",
    "manifest_config",
    "new_save_nonce",
    "pin",
    "pinned_steps",
    "plan_gc",
    "read_manifest",
    "read_tensors",
    "record_test_exposure",
    "referenced_of",
    "signer_from_env",
    "training_tensors",
    "unpin",
    "verify_history",
    "verify_tensors",
    "write_checkpoint",
    "write_shards",
]
