"""The run input's checkpoint and retention policies (``TrainingRunInput.checkpoint``,
``TrainingRunInput.retention``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from activities.effect_models import Model
from cairn.checkpoint_interval import AutoInterval

__all__ = ["CheckpointPolicy", "RetentionSpec"]

_Model = Model


class CheckpointPolicy(_Model):
    """When and how a run commits its checkpoints (every segment also commits at its end)."""

    every: Annotated[int, Field(gt=0)] | Literal["auto"] = 10
    """Commit a full-state checkpoint every K steps (absolute step numbers, so every attempt
    of a segment commits under the same idempotency keys); ``"auto"``: K chosen before each
    segment from the save cost and failure rate the run measured (``cairn.checkpoint_interval``)."""
    mode: Literal["sync", "async"] = "sync"
    """``sync``: training waits for each save; ``async``: the state is snapshotted and persisted in the background."""
    auto: AutoInterval = AutoInterval()
    """How ``every: "auto"`` chooses, and its bounds."""
    incremental: bool | None = None
    """Reference the unchanged blocks the run already holds durably instead of rewriting them (gangs too);
    null: as the worker's ``CAIRN_INCREMENTAL`` says."""
    compression: Literal["off", "zstd", "auto"] | None = None
    """Store checkpoint bytes raw (``off``), compressed (``zstd``: byte-plane shuffle + zstd, lossless),
    or compressed only where that makes saves faster on this store (``auto``); null: as the worker's
    ``CAIRN_COMPRESSION`` says (``off`` when unset). Restores read any checkpoint whatever this says."""


class RetentionSpec(_Model):
    """Which committed checkpoints a run keeps; a retention pass deletes the rest, never the latest."""

    keep_last: Annotated[int, Field(ge=1)] = 3
    """The newest committed checkpoints kept."""
    keep_every: Annotated[int, Field(ge=1)] | None = None
    """Also keep every checkpoint whose step is a multiple of this; null: none besides pins."""
    grace_seconds: Annotated[float, Field(ge=0)] = 3600.0
    """Nothing younger than this is deleted (a save may still be writing it); at least the segment timeout lets
    passes run beside the segments."""
    every_seconds: Annotated[float, Field(ge=0)] | None = None
    """At most one retention pass per this many seconds, and never two at once, when passes
    run beside the segments (``grace_seconds`` >= the segment timeout): a pass can delete
    nothing younger than the grace period anyway. null: ``min(60, grace_seconds)``."""
