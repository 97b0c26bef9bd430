"""Checkpoints: format v1 (manifest + shards), the commit protocol, validated import."""

from cairn.checkpoint.format import (
    CheckpointContent,
    CommitResult,
    Limits,
    read_manifest,
    read_tensors,
    verify_tensors,
    write_checkpoint,
)
from cairn.checkpoint.manager import (
    latest_committed,
    list_checkpoints,
    load_training,
    save_training,
    training_tensors,
)
from cairn.checkpoint.manifest import FORMAT_VERSION, CheckpointKind, Manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.signing import Signer, signer_from_env

__all__ = [
    "FORMAT_VERSION",
    "CheckpointContent",
    "CheckpointKind",
    "CheckpointRef",
    "CommitResult",
    "Limits",
    "Manifest",
    "Signer",
    "latest_committed",
    "list_checkpoints",
    "load_training",
    "read_manifest",
    "read_tensors",
    "save_training",
    "signer_from_env",
    "training_tensors",
    "verify_tensors",
    "write_checkpoint",
]
