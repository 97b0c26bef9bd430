"""What a run's store says about it: the loss/lr history and the committed checkpoints.

``run_record(store, run_id)`` reads the latest committed training checkpoint (validated, as any
import) for the full per-step history, and every committed checkpoint's manifest for its step,
size and commit time. ``cairn report`` draws it; ``cairn run report`` adds what Temporal knows
(segments, attempts, failures, restores: ``TimelineEvent``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from cairn.checkpoint import CheckpointKind, list_checkpoints, load_training, read_manifest
from cairn.errors import ConfigError
from cairn.stores.base import Store

__all__ = ["CommitPoint", "TimelineEvent", "RunRecord", "run_record"]


@dataclass(frozen=True)
class CommitPoint:
    step: int
    at: datetime | None
    bytes: int
    checkpoint: str


@dataclass(frozen=True)
class TimelineEvent:
    """Something that happened to a run at a time: a segment's start/end, a failure, a restore."""

    kind: str
    """segment-start | segment-end | failure | restore | interrupted"""
    at: datetime
    step: int | None = None
    detail: str = ""


@dataclass
class RunRecord:
    run_id: str
    store: str
    loss: list[float]
    lr: list[float]
    commits: list[CommitPoint]
    latest: str
    events: list[TimelineEvent] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return len(self.loss)


def _parse_time(text: str) -> datetime | None:
    try:
        return datetime.fromisoformat(text) if text else None
    except ValueError:
        return None


def run_record(store: Store, run_id: str) -> RunRecord:
    """The run's history and commits; ``ConfigError`` if the store holds no checkpoint of it."""
    refs = list_checkpoints(store, run_id, CheckpointKind.TRAINING)
    if not refs:
        raise ConfigError("run", expected=f"a run with committed checkpoints in {store.url}", found=run_id)
    state, _ = load_training(store, refs[-1])
    commits = []
    for ref in refs:
        manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING)
        commits.append(CommitPoint(ref.step, _parse_time(manifest.writer.created_at), manifest.total_bytes, str(ref)))
    return RunRecord(
        run_id=run_id,
        store=store.url,
        loss=list(state.history["loss"]),
        lr=list(state.history["lr"]),
        commits=commits,
        latest=str(refs[-1]),
    )
