"""What a run's store says about it: the per-step history and the committed checkpoints; and
what Temporal's history adds (segment attempts, failures, restores), for reports.

``run_record(store, run_id)`` reads the latest committed training checkpoint (validated, as any
import) for the full history: every step's loss and lr from step 0, whatever retention deleted
since, and every evaluation (``val_step``, ``val_loss``, other ``val_*`` metrics). Every kept
checkpoint's manifest gives its step, size and commit time. ``cairn report`` draws it;
``cairn run report`` adds what Temporal knows (``TimelineEvent``, ``SegmentAttempt``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from cairn.checkpoint import CheckpointKind, list_checkpoints, read_manifest
from cairn.config import TrainConfig
from cairn.errors import ConfigError
from cairn.stores.base import Store
from cairn.training import load_training

__all__ = ["CommitPoint", "TimelineEvent", "SegmentAttempt", "RunRecord", "run_record"]


@dataclass(frozen=True)
class CommitPoint:
    step: int
    at: datetime | None
    bytes: int
    checkpoint: str


@dataclass(frozen=True)
class TimelineEvent:
    """Something that happened to a run at a time: a segment's end, a failure, a restore.

    A failure's ``at`` is the lost attempt's last sign of life (its last heartbeat the server
    received, or the failure it reported) and its ``step`` the step that heartbeat reported;
    ``detected_at`` is when the server failed the attempt (a heartbeat timeout later)."""

    kind: str
    """segment-end | failure | restore | interrupted"""
    at: datetime
    step: int | None = None
    detail: str = ""
    detected_at: datetime | None = None


@dataclass(frozen=True)
class SegmentAttempt:
    """One attempt of a training segment (one gang attempt for a gang), from Temporal's history:
    from ``started_at`` at ``from_step`` to ``ended_at`` at ``end_step``. A lost attempt ends at
    its last sign of life (``ended_at``; ``end_step`` from its last heartbeat), and the server
    noticed at ``detected_at``."""

    attempt: int
    started_at: datetime | None
    from_step: int | None
    ended_at: datetime | None
    end_step: int | None
    outcome: str
    """completed | lost (heartbeat timeout) | failed (reported an error) | interrupted"""
    detected_at: datetime | None = None
    world_size: int | None = None

    @property
    def seconds(self) -> float | None:
        if self.started_at is None or self.ended_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds()

    @property
    def steps(self) -> int | None:
        if self.from_step is None or self.end_step is None:
            return None
        return max(0, self.end_step - self.from_step)


@dataclass
class RunRecord:
    run_id: str
    store: str
    loss: list[float]
    lr: list[float]
    commits: list[CommitPoint]
    latest: str
    events: list[TimelineEvent] = field(default_factory=list)
    val_step: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    metrics: dict[str, list[float]] = field(default_factory=dict)
    """Other evaluation metrics by name (``val_accuracy`` ...), one value per ``val_step``."""
    batch_size: int | None = None
    """Samples per step (the global batch), for samples per second."""
    attempts: list[SegmentAttempt] = field(default_factory=list)
    heartbeat_timeout_seconds: float | None = None
    intervals: list[tuple[int, int]] = field(default_factory=list)
    """(step, steps between checkpoints): the run's checkpoint interval from each step on."""
    interval_choices: list[dict[str, Any]] = field(default_factory=list)
    """``checkpoint.every: "auto"``: what each choice was computed from (``IntervalChoice``)."""

    @property
    def steps(self) -> int:
        return len(self.loss)


def _parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def run_record(store: Store, run_id: str, run_config: TrainConfig | None = None) -> RunRecord:
    """The run's history and commits; ``ConfigError`` if the store holds no checkpoint of it.
    ``run_config`` is the run's own config (its trainer is trusted: ``cairn.trainers.loading``)."""
    refs = list_checkpoints(store, run_id, CheckpointKind.TRAINING)
    if not refs:
        raise ConfigError("run", expected=f"a run with committed checkpoints in {store.url}", found=run_id)
    state, _ = load_training(store, refs[-1], run_config=run_config)
    commits = []
    for ref in refs:
        manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING, expand_index=False)
        commits.append(CommitPoint(ref.step, _parse_time(manifest.writer.created_at), manifest.total_bytes, str(ref)))
    history = state.history
    val_step = [float(s) for s in history.get("val_step", [])]
    metrics = {
        k: [float(v) for v in values]
        for k, values in sorted(history.items())
        if k.startswith("val_") and k not in ("val_step", "val_loss") and len(values) == len(val_step)
    }
    return RunRecord(
        run_id=run_id,
        store=store.url,
        loss=[float(v) for v in history["loss"]],
        lr=[float(v) for v in history["lr"]],
        commits=commits,
        latest=str(refs[-1]),
        val_step=val_step,
        val_loss=[float(v) for v in history.get("val_loss", [])][: len(val_step)],
        metrics=metrics,
        batch_size=int(state.config.batch_size),
    )
