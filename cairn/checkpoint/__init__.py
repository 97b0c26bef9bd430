"""Checkpoints: formats v1 (manifest + shards) and v3 (blocks, per-rank indexes), the commit
protocol, validated import.

One module per concern: ``layout`` (where things live in a store), ``manifest`` (the data
model), ``content`` (what the fingerprint covers), ``tensors`` (bytes and checksums),
``shards`` (phase 1 of a save), ``commit`` (phase 2: the commit protocol), ``reader`` (the
read path), ``options`` (signer, limits, shard settings), ``training`` (a training state in checkpoint
form), ``manager`` (save/load/list training checkpoints), ``validate`` (training-state rules),
``blocks`` (the blocked layout), ``index`` (format v3's per-rank indexes), ``latest`` (the
latest pointer), ``sparse`` (checkpoints of any declared size without their bytes),
``history`` (a training history's run-level segments), ``retention``, ``async_save``, ``compare``.
"""

from cairn.checkpoint.commit import CommitResult, commit_manifest, write_checkpoint
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.manager import (
    latest_committed,
    list_checkpoints,
    load_training,
    save_training,
)
from cairn.checkpoint.manifest import FORMAT_VERSION, CheckpointKind, Manifest
from cairn.checkpoint.options import CheckpointOptions, Limits
from cairn.checkpoint.reader import read_manifest, read_tensors, verify_tensors
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.shards import RankShards, new_save_nonce, write_shards
from cairn.checkpoint.signing import Signer, signer_from_env
from cairn.checkpoint.training import training_tensors

__all__ = [
    "FORMAT_VERSION",
    "CheckpointContent",
    "CheckpointKind",
    "CheckpointOptions",
    "CheckpointRef",
    "CommitResult",
    "Limits",
    "Manifest",
    "RankShards",
    "Signer",
    "commit_manifest",
    "latest_committed",
    "list_checkpoints",
    "load_training",
    "new_save_nonce",
    "read_manifest",
    "read_tensors",
    "save_training",
    "signer_from_env",
    "training_tensors",
    "verify_tensors",
    "write_checkpoint",
    "write_shards",
]
