"""Checkpoint format v1: the manifest and the checkpoint reference (plain data models).

A checkpoint is a prefix ``{run_id}/{kind}/{step:012d}/`` in a store holding tensor shard
files and ``manifest.json``. The manifest is written last, by create-if-absent, and is the
commit: without it the checkpoint does not exist for readers. Its idempotency key is
(run id, kind, step) — the prefix itself.

The ``fingerprint`` is a sha256 over the checkpoint's *content* (``cairn.checkpoint.content``
says which fields, and computes it). It identifies a state and detects accidental corruption
of the manifest; it is **not** a signature — anyone can recompute it for forged content.
Authenticity comes only from the optional HMAC ``signature`` (``cairn.checkpoint.signing``).
Where things live in a store is ``cairn.checkpoint.layout``.

Format v2 adds one thing: a *blocked* layout (``parts``), written by distributed saves. Each
logical tensor is cut into fixed-size 1-D blocks named ``NAME#IIIII`` (``cairn.checkpoint.blocks``);
the block size comes from the run's config, never from the number of writers, so the same state
saved by 1, 2 or 4 ranks has the same tensor index and the same fingerprint. ``parts`` records
each logical tensor's shape and block size, and is covered by the fingerprint.

Shard keys are relative paths under the checkpoint prefix: '/'-separated segments, none
empty, '.' or '..', no leading '/', no backslash, NUL or newline. Anything else is refused
when the manifest is parsed, before a key reaches a store.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer, model_validator

from cairn.checkpoint.layout import RUN_ID_PATTERN
from cairn.state import Lineage
from cairn.stores.base import key_problem

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUPPORTED_VERSIONS",
    "CheckpointKind",
    "TensorEntry",
    "ShardEntry",
    "WriterInfo",
    "PartSpec",
    "Manifest",
    "BLOCKED_FORMAT_VERSION",
    "shard_key_problem",
]

FORMAT_NAME = "cairn-checkpoint"
FORMAT_VERSION = 1
BLOCKED_FORMAT_VERSION = 2
"""Version of manifests with a blocked layout (``parts``); everything else is written as v1."""
SUPPORTED_VERSIONS = frozenset({1, 2})


def shard_key_problem(key: str) -> str | None:
    """Why ``key`` is not a safe shard key relative to a checkpoint prefix, or None if it is:
    the store's key rules, and no backslash (a path separator elsewhere)."""
    return "contains a backslash" if "\\" in key else key_problem(key)


def _safe_shard_key(key: str) -> str:
    problem = shard_key_problem(key)
    if problem is not None:
        raise ValueError(f"unsafe shard key {key[:80]!r}: {problem}")
    return key


ShardKey = Annotated[str, AfterValidator(_safe_shard_key)]


class CheckpointKind(StrEnum):
    """Separate identities with separate restore rules; a kind never fills another's slot."""

    TRAINING = "training"
    JOURNAL = "journal"
    RECEIPT = "receipt"
    INFERENCE = "inference"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class TensorEntry(_Model):
    name: str = Field(min_length=1, max_length=256)
    dtype: str = Field(description="dtype tag (cairn.checkpoint.tensors.dtype_tag): '<f8', '<f2', 'bfloat16', ...")
    shape: list[int]
    shard: ShardKey = Field(description="shard key relative to the checkpoint prefix")
    offset: int = Field(ge=0)
    length: int = Field(ge=0)
    checksum: str = Field(pattern=r"^blake3:[0-9a-f]{64}$")


class ShardEntry(_Model):
    key: ShardKey = Field(description="relative to the checkpoint prefix")
    rank: int = Field(ge=0)
    bytes: int = Field(ge=0)


class WriterInfo(_Model):
    """Which save attempt wrote the shards. Not part of the fingerprint."""

    nonce: str
    ranks: int = Field(default=1, ge=1)
    created_at: str = ""
    """ISO-8601 wall-clock time of the commit, for humans (never used by training)."""


class PartSpec(_Model):
    """One logical tensor of a blocked (v2) checkpoint: its shape and its block size in elements."""

    shape: list[int]
    block_elems: int = Field(gt=0)


class Manifest(_Model):
    format: Literal["cairn-checkpoint"] = "cairn-checkpoint"
    format_version: int = FORMAT_VERSION
    kind: CheckpointKind
    run_id: str = Field(pattern=RUN_ID_PATTERN.pattern)
    step: int = Field(ge=0)
    cursor: int = Field(ge=0)
    config: dict[str, Any] | None = None
    lineage: Lineage | None = None
    rng: dict[str, Any] | None = None
    meta: dict[str, Any] = Field(default_factory=dict)
    tensors: list[TensorEntry]
    shards: list[ShardEntry]
    total_bytes: int = Field(ge=0)
    fingerprint: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    writer: WriterInfo
    signature: str | None = None
    parts: dict[str, PartSpec] | None = None
    """v2 only: logical tensor name -> shape and block size (``cairn.checkpoint.blocks``)."""

    @model_validator(mode="after")
    def _parts_iff_v2(self) -> Manifest:
        if (self.parts is not None) != (self.format_version == BLOCKED_FORMAT_VERSION):
            raise ValueError(f"parts are given exactly when format_version is {BLOCKED_FORMAT_VERSION}")
        return self

    @model_serializer(mode="wrap")
    def _v1_has_no_parts(self, handler: Any) -> Any:
        body = handler(self)
        if body.get("parts") is None:
            body.pop("parts", None)  # a v1 manifest stays exactly v1 (older readers refuse unknown fields)
        return body

    def to_json_bytes(self) -> bytes:
        return self.model_dump_json(indent=1).encode()

    def signed_payload(self) -> bytes:
        """Canonical bytes an HMAC signs: everything but the signature itself."""
        body = self.model_dump(mode="json", exclude={"signature"})
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
