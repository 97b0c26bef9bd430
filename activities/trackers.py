"""The tracker activity: bring a run's experiment trackers up to its committed history.

``export_trackers`` is a thin adapter: it opens the run's store (checked to be the run's),
builds each sink from its spec and calls ``cairn.trackers.export_committed`` for each, with
heartbeats. Every sink is tried even when one fails; then the first failure is raised, typed
(``activities.edge``): a sink that is down is retried, and its points wait in the store.
"""

from __future__ import annotations

import logging

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

__all__ = ["export_trackers", "sink_for", "TRACKER_ACTIVITIES"]

log = logging.getLogger("cairn.activity")


def sink_for(spec: TrackerSpec) -> TrackerSink:
    """The sink a run input's tracker spec names."""
    if isinstance(spec, TensorBoardSpec):
        return TensorBoardSink(spec.log_dir)
    if isinstance(spec, MLflowSpec):
        return MLflowSink(spec.tracking_uri, spec.experiment, spec.run_name)
    return WandbSink(spec.project, spec.dir, spec.mode, spec.entity)


@activity.defn(name="export_trackers")
def export_trackers(inp: TrackInput) -> TrackResult:
    with run_context(inp.run_id), activity_errors(), Heartbeater(heartbeat_interval(), phase="track") as beat:
        store = open_run_store(inp.store, inp.store_id)
        history = committed_history(store, inp.run_id)  # read once for every sink
        result = TrackResult(committed_step=history.step if history is not None else 0)
        failure: CairnError | None = None
        for spec in inp.trackers:
            try:
                report = export_committed(
                    store, inp.run_id, sink_for(spec), final=inp.final, history=history, progress=lambda _: beat.beat()
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
