"""Checkpoint format v1: the manifest and the checkpoint reference (plain data models).

A checkpoint is a prefix ``{run_id}/{kind}/{step:012d}/`` in a store holding tensor shard
files and ``manifest.json``. The manifest is written last, by create-if-absent, and is the
commit: without it the checkpoint does not exist for readers. Its idempotency key is
(run id, kind, step) — the prefix itself.

The ``fingerprint`` is a sha256 over the checkpoint's *content* (kind, step, cursor,
config, lineage except parent, RNG, meta, and every tensor's name/dtype/shape/checksum). It
identifies a state and detects accidental corruption of the manifest; it is **not** a
signature — anyone can recompute it for forged content. Authenticity comes only from the
optional HMAC ``signature`` (see ``cairn.checkpoint.signing``). The content is plain finite
JSON: NaN or infinity anywhere in it is refused (``InvariantError``) rather than written.

Shard keys are relative paths under the checkpoint prefix: '/'-separated segments, none
empty, '.' or '..', no leading '/', no backslash, NUL or newline. Anything else is refused
when the manifest is parsed, before a key reaches a store.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from cairn.errors import InvariantError
from cairn.state import Lineage

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "SUPPORTED_VERSIONS",
    "MANIFEST_NAME",
    "CheckpointKind",
    "TensorEntry",
    "ShardEntry",
    "WriterInfo",
    "Manifest",
    "compute_fingerprint",
    "checkpoint_prefix",
    "manifest_key",
    "RUN_ID_PATTERN",
    "CHECKSUM_PREFIX",
    "shard_key_problem",
    "non_finite_path",
]

FORMAT_NAME = "cairn-checkpoint"
FORMAT_VERSION = 1
SUPPORTED_VERSIONS = frozenset({1})
MANIFEST_NAME = "manifest.json"
STEP_DIGITS = 12
CHECKSUM_PREFIX = "blake3:"
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def shard_key_problem(key: str) -> str | None:
    """Why ``key`` is not a safe shard key relative to a checkpoint prefix, or None if it is."""
    if not key:
        return "empty"
    if key.startswith("/"):
        return "absolute (leading '/')"
    for char, name in (("\\", "a backslash"), ("\0", "NUL"), ("\n", "a newline"), ("\r", "a carriage return")):
        if char in key:
            return f"contains {name}"
    if any(part in ("", ".", "..") for part in key.split("/")):
        return "has an empty, '.' or '..' segment"
    return None


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
    dtype: str = Field(description="numpy dtype string, little-endian, e.g. '<f8'")
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

    def to_json_bytes(self) -> bytes:
        return self.model_dump_json(indent=1).encode()

    def signed_payload(self) -> bytes:
        """Canonical bytes an HMAC signs: everything but the signature itself."""
        body = self.model_dump(mode="json", exclude={"signature"})
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def compute_fingerprint(
    *,
    kind: str,
    step: int,
    cursor: int,
    config: dict[str, Any] | None,
    lineage: Lineage | None,
    rng: dict[str, Any] | None,
    meta: dict[str, Any],
    tensors: list[tuple[str, str, list[int], str]],
) -> str:
    """sha256 of the checkpoint's content; independent of shard layout, writer and run id.

    ``tensors`` are (name, dtype, shape, checksum). ``lineage.parent`` is provenance, not
    content, and is left out, so a retried save of the same state converges on one identity,
    and a resumed run's final checkpoint has the same fingerprint as the uninterrupted one.
    """
    body = {
        "format_version": FORMAT_VERSION,
        "kind": str(kind),
        "step": step,
        "cursor": cursor,
        "config": config,
        "lineage": None if lineage is None else lineage.model_dump(mode="json", exclude={"parent"}),
        "rng": rng,
        "meta": meta,
        "tensors": sorted([n, d, list(s), c] for n, d, s, c in tensors),
    }
    try:
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except ValueError:  # NaN or infinity somewhere: it has no JSON form and would not round-trip
        path, value = non_finite_path(body) or ("content", None)
        raise InvariantError(
            "checkpoint content must be finite JSON", field=path, expected="a finite number", found=value
        ) from None
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def non_finite_path(value: Any, path: str = "") -> tuple[str, float] | None:
    """(dotted path, value) of the first NaN or infinity inside a JSON-like value, else None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path or "value", value)
    if isinstance(value, dict):
        items: list[tuple[str, Any]] = [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    for sub_path, sub in items:
        found = non_finite_path(sub, sub_path)
        if found is not None:
            return found
    return None


def checkpoint_prefix(run_id: str, kind: str, step: int) -> str:
    """The idempotency key of a checkpoint, as a store prefix (no trailing slash)."""
    return f"{run_id}/{kind}/{step:0{STEP_DIGITS}d}"


def manifest_key(run_id: str, kind: str, step: int) -> str:
    return f"{checkpoint_prefix(run_id, kind, step)}/{MANIFEST_NAME}"
