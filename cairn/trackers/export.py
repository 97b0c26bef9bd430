"""Feeding a tracker sink from a run's committed history, exactly once: the one rule every
sink follows, around its cursor (``cairn.trackers.cursor``).

1. Read the sink's cursor and the run's committed history (``cairn.trackers.points``).
2. Claim the sink (``cairn.trackers.lease``): one export at a time writes to it; another waits
   until the claim is released or runs out.
3. When the cursor is new or has a pending range (an earlier export may have written part of
   it and died before confirming), ask the sink what it holds (``TrackerSink.held``): never
   assume it holds nothing, never assume it holds everything.
4. Announce the range (``pending``) while checking the claim still holds, write to the sink only
   the points it does not hold, then confirm: the cursor moves to the committed step and the
   claim is released.

Each sink's ``write`` is itself safe to repeat over what ``held`` reports; a sink that is down
raises ``EffectUnavailableError`` (retryable): its points wait in the store, never lost.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from cairn.stores.base import Store
from cairn.trackers.cursor import TrackerCursor, read_cursor, sink_id
from cairn.trackers.lease import LeaseTerms, SinkLease
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
    waited: float = 0.0
    """Seconds this export waited for another export's claim on the sink."""

    def line(self) -> str:
        asked = ", asked the sink what it held" if self.reconciled else ""
        waited = f", after waiting {self.waited:.1f} s for another export" if self.waited else ""
        return f"{self.sink}: {self.points} value(s) written, through step {self.confirmed}{asked}{waited}"


def export_committed(
    store: Store,
    run_id: str,
    sink: TrackerSink,
    *,
    final: bool = False,
    history: CommittedHistory | None = None,
    progress: Callable[[str], None] | None = None,
    stop: Callable[[], str | None] | None = None,
    lease_seconds: float | None = None,
) -> ExportReport:
    """Bring ``sink`` up to the run's latest committed step (``history``: already read).

    ``stop``: None, or why this export must stop before its next write (its activity was
    cancelled or superseded). ``lease_seconds``: how long its claim on the sink holds unless
    renewed (an activity's heartbeat timeout; None: ``cairn.trackers.lease.LEASE_SECONDS``).
    Another export's claim is waited for; a claim lost, or ``stop`` answering, ends the export
    without writing: ``EffectUnavailableError``."""
    destination = sink.destination()
    name = sink_id(sink.kind, destination)
    cursor = read_cursor(store, run_id, name, sink.kind, destination)
    committed = history if history is not None else committed_history(store, run_id)
    step = committed.step if committed is not None else 0

    def needed(found: TrackerCursor) -> bool:
        return final or step > found.confirmed or found.pending is not None

    if committed is None or not needed(cursor):
        return ExportReport(name, sink.kind, step, cursor.confirmed, 0, False)
    lease = SinkLease(
        store, run_id, cursor, LeaseTerms.for_heartbeat_timeout(lease_seconds), stop=stop, progress=progress
    )
    before = lease.acquire(needed)
    if before is None:  # another export brought it up meanwhile
        return ExportReport(name, sink.kind, step, lease.cursor.confirmed, 0, False, lease.waited)
    try:
        return _export(lease, before, sink, committed, final, progress)
    except (Exception, KeyboardInterrupt):
        lease.release()
        raise


def _export(
    lease: SinkLease,
    before: TrackerCursor,
    sink: TrackerSink,
    committed: CommittedHistory,
    final: bool,
    progress: Callable[[str], None] | None,
) -> ExportReport:
    """The export under its claim: ``before`` is the cursor as it stood when claimed."""
    run_id, step = lease.run_id, committed.step
    ask = not before.known or before.pending is not None
    held: dict[str, int] = {}
    if ask:
        with lease.renewing():
            held = dict(sink.held(run_id, committed.names()))
    if progress is not None:
        progress("held")
    points = committed.points(after=before.confirmed, held=held)
    if points or final:  # announced first: a write cut short leaves a pending range, and the next export asks
        lease.check(pending=(before.confirmed, step) if points else before.pending)
        with lease.renewing():
            sink.write(PointBatch(run_id, points, committed.wall_time, final))
    if progress is not None:
        progress("written")
    cursor = lease.confirm(step)
    values = sum(len(p.values) for p in points)
    return ExportReport(lease.cursor.sink, sink.kind, step, cursor.confirmed, values, ask, lease.waited)
