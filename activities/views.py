"""What a TrainingRun shows of itself: its ``progress`` query and the summary it returns (plain
JSON, like every model in ``activities.inputs``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from activities.inputs import IntervalChoice, _Model
from cairn.checkpoint import CompressionChoice

__all__ = ["RunProgress", "RunSummary"]


class RunProgress(_Model):
    run_id: str
    phase: Literal["starting", "training", "paused", "stopping", "finished", "cancelled", "failed"]
    step: int
    total: int
    loss: float | None
    checkpoint: str | None
    durable_checkpoint: str | None = None
    durable_step: int = 0
    """The run's durable cursor: ``checkpoint`` may be ahead of it (committed in a worker's
    node-local tier, its upload pending); a retry on another host resumes from this one."""
    attempts: list[int]
    """Attempts of the most recent segments (bounded window)."""
    segments: int = 0
    retried_segments: int = 0
    recomputed_steps: int
    continued_as_new: int
    epoch: float | None = None
    """Epochs done (fractional mid-epoch); None when the trainer did not say how long an epoch is."""
    steps_per_epoch: int | None = None
    val_loss: float | None = None
    val_accuracy: float | None = None
    reproducibility: str | None = None
    world_size: int = 1
    """Ranks the run trains with now (an elastic run may have shrunk it)."""
    checkpoint_every: int | None = None
    """Steps between checkpoints now (``checkpoint.every: "auto"``: the latest choice)."""


class RunSummary(_Model):
    run_id: str
    checkpoint: str | None
    fingerprint: str | None
    durable_checkpoint: str | None = None
    durable_step: int = 0
    steps: int
    total_steps: int
    stopped_early: bool
    attempts: list[int]
    """Attempts of the most recent segments, in order (1 = no retry; a bounded window)."""
    segments: int = 0
    retried_segments: int = 0
    recomputed_steps: int
    continued_as_new: int
    loss: float | None
    effects: dict[str, str] = Field(default_factory=dict)
    """Effect name -> receipt id (reserve, publish, release)."""
    val_loss: float | None = None
    val_accuracy: float | None = None
    reproducibility: str | None = None
    world_size: int = 1
    """Ranks the run ended with (an elastic run may have shrunk it)."""
    checkpoint_every: int | None = None
    checkpoint_interval: list[IntervalChoice] = Field(default_factory=list)
    """``checkpoint.every: "auto"``: the latest choices of the interval (a bounded window,
    oldest first), each with the measurements behind it (``IntervalChoice.why``)."""
    compression: CompressionChoice | None = None
    """``checkpoint.compression``: whether the latest save compressed, and (``auto``) the store's
    bandwidth and the codec's throughput and ratio it decided from (a gang: its node's first rank's)."""
