"""The tracker activity: bring a run's experiment trackers up to its committed history.

``export_trackers`` is a thin adapter: it opens the run's store (checked to be the run's),
builds each sink from its spec and calls ``cairn.trackers.export_committed`` for each, with
heartbeats. Every sink is tried even when one fails; then the first failure is raised, typed
(``activities.edge``): a sink that is down is retried, and its points wait in the store.

Each export holds its sink on a lease as long as the heartbeat timeout, and stops before its
next sink write once this attempt is cancelled, superseded (``Heartbeater.superseded``: the
server retried it elsewhere) or its worker is shutting down (``stop_reason``). Cancellation is
deferred to the end, so it never cuts a write or a cursor entry halfway.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from temporalio import activity

from activities.edge import Heartbeater, activity_errors, heartbeat_interval, open_run_store
from activities.log_context import run_context
from activities.tracker_models import MLflowSpec, TensorBoardSpec, TrackerSpec, TrackInput, TrackResult
from cairn.errors import CairnError
from cairn.trackers import (
    MLflowSink,
    TensorBoardSink,
    TrackerSink,
    WandbSink,
    committed_history,
    export_committed,
)

__all__ = ["export_trackers", "sink_for", "stop_reason", "TRACKER_ACTIVITIES"]

log = logging.getLogger("cairn.activity")


def sink_for(spec: TrackerSpec) -> TrackerSink:
    """The sink a run input's tracker spec names."""
    if isinstance(spec, TensorBoardSpec):
        return TensorBoardSink(spec.log_dir)
    if isinstance(spec, MLflowSpec):
        return MLflowSink(spec.tracking_uri, spec.experiment, spec.run_name)
    return WandbSink(spec.project, spec.dir, spec.mode, spec.entity)


def stop_reason(beat: Heartbeater) -> Callable[[], str | None]:
    """Why this attempt must stop before its next sink write (None: it may go on). Asked on the
    activity's own thread."""

    def why() -> str | None:
        beat.notice_cancellation()
        if (gone := beat.superseded()) is not None:
            return f"superseded ({gone})"
        if activity.is_cancelled():
            return "cancelled"
        if activity.is_worker_shutdown():
            return "the worker is shutting down"
        return None

    return why


@activity.defn(name="export_trackers")
def export_trackers(inp: TrackInput) -> TrackResult:
    timeout = activity.info().heartbeat_timeout
    lease = timeout.total_seconds() if timeout is not None else None
    with (
        run_context(inp.run_id),
        activity.shield_thread_cancel_exception(),  # cancelled: raised at the end, not mid-write
        activity_errors(),
        Heartbeater(heartbeat_interval(), phase="track") as beat,
    ):
        store = open_run_store(inp.store, inp.store_id)
        history = committed_history(store, inp.run_id)  # read once for every sink
        result = TrackResult(committed_step=history.step if history is not None else 0)
        failure: CairnError | None = None
        stop = stop_reason(beat)
        for spec in inp.trackers:
            try:
                report = export_committed(
                    store,
                    inp.run_id,
                    sink_for(spec),
                    final=inp.final,
                    history=history,
                    progress=lambda _: beat.beat(),
                    stop=stop,
                    lease_seconds=lease,
                )
            except CairnError as exc:  # the others still get their points
                log.warning("run %s: tracker %s: %s: %s", inp.run_id, spec.kind, exc.type_name, exc)
                failure = failure or exc
                continue
            log.info("run %s: %s", inp.run_id, report.line())
            result.confirmed[report.sink] = report.confirmed
            result.points += report.points
        if failure is not None:
            raise failure
        return result


TRACKER_ACTIVITIES = [export_trackers]
