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

Format v3 keeps v2's blocks and moves their index out of the manifest: each rank commits its
own *index object* (its shards and block entries, ``cairn.checkpoint.index``) and the root
manifest lists the rank indexes (``indexes``: key, size, BLAKE3 checksum, entry count, bytes,
digest, and which block ranges each covers) instead of every block, so it grows with ranks,
not blocks. ``parts`` then records each logical tensor's dtype too. The root is still the one
commit marker, created-if-absent last; a rank restoring its slice reads the root and only the
indexes that cover it. An incremental save's index may reference blocks in shards of earlier
checkpoints of the same run and kind; each ref lists those shards (``linked``).

A training checkpoint's history (loss, lr, evaluations) is either tensors ``history/KEY`` (as
written before) or, in any version, ``history``: run-level segments shared by the run's
checkpoints (``cairn.checkpoint.history``); the fingerprint covers each key's length and the
BLAKE3 of its values, not how they are cut into segments.

Shard keys are relative paths under the checkpoint prefix: '/'-separated segments, none
empty, '.' or '..', no leading '/', no backslash, NUL or newline. Anything else is refused
when the manifest is parsed, before a key reaches a store.
"""

from __future__ import annotations

import json
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_serializer, model_validator

from cairn.checkpoint.layout import HISTORY_NAME_PATTERN, RUN_ID_PATTERN
from cairn.state import Lineage
from cairn.stores.base import key_problem

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUPPORTED_VERSIONS",
    "CheckpointKind",
    "TensorEntry",
    "Encoding",
    "Frame",
    "ShardEntry",
    "WriterInfo",
    "PartSpec",
    "Manifest",
    "BLOCKED_FORMAT_VERSION",
    "INDEXED_FORMAT_VERSION",
    "IndexRef",
    "Cover",
    "shard_key_problem",
    "HistorySegment",
    "HistorySeries",
    "HistoryRef",
]

FORMAT_NAME = "cairn-checkpoint"
FORMAT_VERSION = 1
BLOCKED_FORMAT_VERSION = 2
"""Blocked layout (``parts``) with every block listed in the manifest; read, no longer written."""
INDEXED_FORMAT_VERSION = 3
"""Blocked layout with per-rank index objects (``indexes``): what blocked saves write."""
SUPPORTED_VERSIONS = frozenset({1, 2, 3})


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


class Frame(_Model):
    """One stored frame of an encoded entry: its stored bytes and their BLAKE3."""

    bytes: int = Field(ge=0)
    checksum: str = Field(pattern=r"^blake3:[0-9a-f]{64}$")


class Encoding(_Model):
    """How an entry's bytes are stored when they are not stored raw (``cairn.checkpoint.codec``):
    its logical bytes cut into frames of ``frame_bytes`` (the last may be shorter), each encoded
    by ``codec`` and stored one after another from the entry's offset. Each frame's stored bytes
    have their own checksum; the entry's ``checksum`` stays that of its logical bytes (what the
    fingerprint and the index digest cover), so the same state has one fingerprint whatever
    the codec."""

    codec: Literal["blosc2-zstd"]
    """Byte-plane shuffle by the dtype's width, then zstd, each plane its own stream: a
    Blosc2 chunk (its own header declares its sizes)."""
    frame_bytes: int = Field(gt=0)
    frames: list[Frame] = Field(fail_fast=True)  # a forged list of junk: one error, not millions


class TensorEntry(_Model):
    name: str = Field(min_length=1, max_length=256)
    dtype: str = Field(description="dtype tag (cairn.checkpoint.tensors.dtype_tag): '<f8', '<f2', 'bfloat16', ...")
    shape: list[int]
    shard: ShardKey = Field(description="shard key relative to the checkpoint prefix")
    offset: int = Field(ge=0)
    length: int = Field(ge=0)
    """Logical bytes (dtype x shape); stored bytes are ``stored_length`` (``encoding``)."""
    checksum: str = Field(pattern=r"^blake3:[0-9a-f]{64}$")
    """BLAKE3 of the logical bytes, however they are stored."""
    encoding: Encoding | None = None
    """None: stored raw (``length`` bytes from ``offset``), as every checkpoint before codecs."""

    @property
    def stored_length(self) -> int:
        """Bytes the entry takes in its shard, from ``offset``."""
        return self.length if self.encoding is None else sum(f.bytes for f in self.encoding.frames)

    @model_serializer(mode="wrap")
    def _raw_as_before(self, handler: Any) -> Any:
        body = handler(self)
        if body.get("encoding") is None:
            body.pop("encoding", None)  # a raw entry is exactly as before
        return body


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
    """One logical tensor of a blocked checkpoint: its shape, its block size in elements and
    (format v3, whose root lists no blocks) its dtype tag."""

    shape: list[int]
    block_elems: int = Field(gt=0)
    dtype: str | None = None

    @model_serializer(mode="wrap")
    def _v2_has_no_dtype(self, handler: Any) -> Any:
        body = handler(self)
        if body.get("dtype") is None:
            body.pop("dtype", None)  # a v2 part stays exactly v2 (and so does its fingerprint)
        return body


Cover = tuple[str, int, int]
"""(logical tensor, first block, stop block): a range of blocks one rank's index holds."""


class IndexRef(_Model):
    """One rank's index object, as the v3 root manifest references it."""

    rank: int = Field(ge=0)
    key: ShardKey = Field(description="relative to the checkpoint prefix")
    bytes: int = Field(ge=0)
    checksum: str = Field(pattern=r"^blake3:[0-9a-f]{64}$")
    """Of the index object's bytes: the root (and its signature) vouches for every entry."""
    entries: int = Field(ge=0)
    total_bytes: int = Field(ge=0)
    digest: str = Field(pattern=r"^[0-9a-f]{64}$")
    """This rank's share of the index digest (``cairn.checkpoint.index``)."""
    covers: list[Cover]
    linked: list[ShardKey] = Field(default_factory=list)
    """Shards of other checkpoints of the run (full store keys) whose blocks this rank's index
    references instead of rewriting them (``cairn.checkpoint.reuse``): what retention must keep."""

    @model_serializer(mode="wrap")
    def _unlinked_as_before(self, handler: Any) -> Any:
        body = handler(self)
        if not body.get("linked"):
            body.pop("linked", None)  # a save that references nothing is exactly as before
        return body


class HistorySegment(_Model):
    """One run-level history object: entries ``[start, end)`` of one history key, raw
    little-endian float64, named by its range and checksum (``layout.history_segment_key``)."""

    start: int = Field(ge=0)
    end: int = Field(gt=0)
    checksum: str = Field(pattern=r"^blake3:[0-9a-f]{64}$")


class HistorySeries(_Model):
    """One history key of a checkpoint: its length, the BLAKE3 of all its values (what the
    fingerprint covers, however they are cut) and the segments that tile ``[0, length)``."""

    length: int = Field(ge=0)
    digest: str = Field(pattern=r"^blake3:[0-9a-f]{64}$")
    segments: list[HistorySegment]


HistoryName = Annotated[str, Field(pattern=HISTORY_NAME_PATTERN.pattern)]


class HistoryRef(_Model):
    """A training checkpoint's history, kept in run-level segments (``cairn.checkpoint.history``)."""

    chunk: int = Field(ge=1 << 10, le=1 << 24)
    """Entries per full chunk segment, a constant of the writer (``history.HISTORY_CHUNK``)."""
    series: dict[HistoryName, HistorySeries]


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
    tensors: list[TensorEntry] = Field(fail_fast=True)  # a forged list of junk: one error, not millions
    shards: list[ShardEntry] = Field(fail_fast=True)
    total_bytes: int = Field(ge=0)
    fingerprint: str = Field(pattern=r"^sha256:[0-9a-f]{64}$")
    writer: WriterInfo
    signature: str | None = None
    parts: dict[str, PartSpec] | None = None
    """v2 and v3: logical tensor name -> shape and block size (``cairn.checkpoint.blocks``)."""
    indexes: list[IndexRef] | None = Field(default=None, fail_fast=True)
    """v3 only: the rank index objects, by rank; the root's ``tensors`` and ``shards`` are empty."""
    history: HistoryRef | None = None
    """The history as run-level segments; None: the history is in ``tensors`` (``history/KEY``)."""

    @model_validator(mode="after")
    def _layout_by_version(self) -> Manifest:
        blocked = self.format_version in (BLOCKED_FORMAT_VERSION, INDEXED_FORMAT_VERSION)
        if (self.parts is not None) != blocked:
            raise ValueError(
                f"parts are given exactly when format_version is {BLOCKED_FORMAT_VERSION} or {INDEXED_FORMAT_VERSION}"
            )
        if (self.indexes is not None) != (self.format_version == INDEXED_FORMAT_VERSION):
            raise ValueError(f"indexes are given exactly when format_version is {INDEXED_FORMAT_VERSION}")
        if self.indexes is not None and (self.tensors or self.shards):
            raise ValueError("a v3 root manifest lists its blocks in rank indexes, not in tensors or shards")
        if self.format_version == INDEXED_FORMAT_VERSION and any(p.dtype is None for p in (self.parts or {}).values()):
            raise ValueError("every part of a v3 manifest declares its dtype")
        return self

    @model_serializer(mode="wrap")
    def _v1_has_no_parts(self, handler: Any) -> Any:
        body = handler(self)
        for optional in ("parts", "indexes", "history"):
            if body.get(optional) is None:
                body.pop(optional, None)  # a v1/v2 manifest stays exactly so (older readers refuse unknown fields)
        return body

    def to_json_bytes(self) -> bytes:
        """The manifest as committed: indented for a human reading v1/v2, compact for a v3
        root (a 1,024-rank root is a quarter whitespace when indented)."""
        return self.model_dump_json(indent=None if self.indexes is not None else 1).encode()

    def signed_payload(self) -> bytes:
        """Canonical bytes an HMAC signs: everything but the signature itself."""
        body = self.model_dump(mode="json", exclude={"signature"})
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
