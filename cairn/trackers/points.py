"""The points a run's committed history holds, by step: what every tracker sink is fed.

The source is the latest committed training checkpoint of the run: its history (``loss``,
``lr``, any other per-update key a trainer records, and the evaluations ``val_*`` at
``val_step``), read from the run's history segments and checked against their checksums and
digests (``cairn.checkpoint.history``). Never a training hook: a step a killed segment computed
but never committed is not here, and a step recomputed after a retry is here once.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime

from cairn.checkpoint import CheckpointKind, CheckpointRef, latest_committed, read_manifest, read_tensors
from cairn.checkpoint.history import read_history
from cairn.checkpoint.training import check_eval_history, split_history
from cairn.stores.base import Store

__all__ = ["StepPoints", "CommittedHistory", "committed_history", "history_at", "EVAL_STEP"]

EVAL_STEP = "val_step"
"""The history key that says at which step each evaluation (``val_*``) was taken."""
EVAL_PREFIX = "val_"


@dataclass(frozen=True)
class StepPoints:
    """Every value a run committed for one step, by metric name (``loss``, ``lr``, ``val_loss`` ...)."""

    step: int
    values: dict[str, float]


@dataclass(frozen=True)
class CommittedHistory:
    """A run's history as its latest committed checkpoint holds it."""

    run_id: str
    step: int
    """The step of the checkpoint: every point at or below it is committed."""
    checkpoint: str
    wall_time: float
    """When that checkpoint was committed (POSIX seconds): the time trackers show for its points."""
    history: Mapping[str, list[float]] = field(repr=False)

    def names(self) -> list[str]:
        """Every metric name this history can have points of."""
        return sorted(k for k in self.history if k != EVAL_STEP)

    def _series(self) -> Iterator[tuple[str, int, float]]:
        evals = [int(s) for s in self.history.get(EVAL_STEP, [])]
        for name, values in sorted(self.history.items()):
            if name == EVAL_STEP:
                continue
            if name.startswith(EVAL_PREFIX):  # one value per evaluation, at its val_step
                yield from ((name, s, v) for s, v in zip(evals, values, strict=False))
            else:  # one value per update, the last at ``step``
                first = self.step - len(values) + 1
                yield from ((name, first + i, v) for i, v in enumerate(values) if first + i > 0)

    def points(self, after: int, held: Mapping[str, int] | None = None) -> list[StepPoints]:
        """The points of steps past ``after`` (and, per name, past what ``held`` says a sink
        already holds), grouped by step, in step order."""
        held = held or {}
        by_step: dict[int, dict[str, float]] = {}
        for name, step, value in self._series():
            if step > after and step > held.get(name, 0) and step <= self.step:
                by_step.setdefault(step, {})[name] = float(value)
        return [StepPoints(s, dict(sorted(by_step[s].items()))) for s in sorted(by_step)]


def _wall_time(created_at: str) -> float:
    try:
        return datetime.fromisoformat(created_at).timestamp() if created_at else 0.0
    except ValueError:
        return 0.0


def committed_history(store: Store, run_id: str) -> CommittedHistory | None:
    """The history of the run's latest committed training checkpoint (None: nothing committed
    yet). Only the history is read, checked against its checksums, never the model's tensors."""
    ref = latest_committed(store, run_id, CheckpointKind.TRAINING)
    if ref is None:
        return None
    return history_at(store, ref)


def history_at(store: Store, ref: CheckpointRef) -> CommittedHistory:
    """The history a committed training checkpoint holds (segments, or the ``history/KEY``
    tensors of a checkpoint written before history segments)."""
    if (manifest := read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING, expand_index=False)).history:
        history = read_history(store, ref.run_id, manifest.history)
    else:
        full = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING)
        names = {t.name for t in full.tensors if t.name.startswith("history/")}
        _, history = split_history(read_tensors(store, ref, full, only=names))
    check_eval_history(manifest.step, history)
    return CommittedHistory(ref.run_id, manifest.step, str(ref), _wall_time(manifest.writer.created_at), history)
