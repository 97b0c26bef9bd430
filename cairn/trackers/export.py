"""Feeding a tracker sink from a run's committed history, exactly once: the one rule every
sink follows, around its cursor (``cairn.trackers.cursor``).

1. Read the sink's cursor and the run's committed history (``cairn.trackers.points``).
2. When the cursor is new or has a pending range (an earlier export may have written part of
   it and died before confirming), ask the sink what it holds (``TrackerSink.held``): never
   assume it holds nothing, never assume it holds everything.
3. Announce the range (``pending``), write to the sink only the points it does not hold, then
   confirm: the cursor moves to the committed step.

Each sink's ``write`` is itself safe to repeat over what ``held`` reports; a sink that is down
raises ``EffectUnavailableError`` (retryable): its points wait in the store, never lost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from cairn.stores.base import Store
from cairn.trackers.cursor import read_cursor, sink_id, write_cursor
from cairn.trackers.points import CommittedHistory, StepPoints, committed_history

__all__ = ["TrackerSink", "PointBatch", "ExportReport", "export_committed"]


@dataclass(frozen=True)
class PointBatch:
    """Points for one sink write: steps in increasing order, each step's values together."""

    run_id: str
    points: Sequence[StepPoints]
    wall_time: float
    """When the checkpoint that holds them was committed (POSIX seconds)."""
    final: bool = False
    """The run has ended: a sink may mark its run finished."""


class TrackerSink(Protocol):
    """Where points go (TensorBoard event files, an MLflow run, a W&B run)."""

    kind: str

    def destination(self) -> dict[str, str]:
        """What names where this sink writes (its cursor is keyed by it)."""
        ...

    def held(self, run_id: str, names: Sequence[str]) -> Mapping[str, int]:
        """Per metric name, the last step of ``run_id`` the sink holds (0 or absent: none); every
        point of that name up to it is there. Asked only when an export may have been cut short."""
        ...

    def write(self, batch: PointBatch) -> None:
        """Add ``batch`` to the sink; confirmed when it returns."""
        ...


@dataclass(frozen=True)
class ExportReport:
    sink: str
    kind: str
    committed_step: int
    """The committed step of the run (0: nothing committed yet)."""
    confirmed: int
    """The sink's cursor after this export."""
    points: int
    """Values written now (one per metric and step)."""
    reconciled: bool
    """The sink was asked what it held (a cut-short or first export)."""

    def line(self) -> str:
        asked = ", asked the sink what it held" if self.reconciled else ""
        return f"{self.sink}: {self.points} value(s) written, through step {self.confirmed}{asked}"


def export_committed(
    store: Store,
    run_id: str,
    sink: TrackerSink,
    *,
    final: bool = False,
    history: CommittedHistory | None = None,
    progress: Callable[[str], None] | None = None,
) -> ExportReport:
    """Bring ``sink`` up to the run's latest committed step (``history``: already read)."""
    destination = sink.destination()
    name = sink_id(sink.kind, destination)
    cursor = read_cursor(store, run_id, name, sink.kind, destination)
    committed = history if history is not None else committed_history(store, run_id)
    step = committed.step if committed is not None else 0
    if committed is None or (step <= cursor.confirmed and cursor.pending is None and not final):
        return ExportReport(name, sink.kind, step, cursor.confirmed, 0, False)
    ask = not cursor.known or cursor.pending is not None
    held = dict(sink.held(run_id, committed.names())) if ask else {}
    if progress is not None:
        progress("held")
    points = committed.points(after=cursor.confirmed, held=held)
    if points:  # announced first: a write cut short leaves a pending range, and the next export asks
        cursor = write_cursor(store, run_id, cursor, confirmed=cursor.confirmed, pending=(cursor.confirmed, step))
    if points or final:
        sink.write(PointBatch(run_id, points, committed.wall_time, final))
    if progress is not None:
        progress("written")
    if points or cursor.pending is not None or step > cursor.confirmed:
        cursor = write_cursor(store, run_id, cursor, confirmed=step, pending=None)
    return ExportReport(name, sink.kind, step, cursor.confirmed, sum(len(p.values) for p in points), ask)
