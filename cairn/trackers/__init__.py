"""Experiment trackers fed from a run's committed history, exactly once: TensorBoard event
files, MLflow, Weights & Biases.

Points come from the latest committed checkpoint's history, never from a training hook, so a
step a killed segment recomputed appears once; each sink's progress is a cursor in the run's
store, written after the sink confirmed the points; one export at a time holds a sink (a lease
on its cursor), and an export that may have been cut short asks the sink what it holds before
it writes again (``export``).

Modules: ``points`` (the committed history as points by step), ``cursor`` (a sink's durable
progress), ``lease`` (which export may write to a sink now), ``export`` (the one rule every sink
follows; the ``TrackerSink`` protocol),
``tensorboard_sink``, ``mlflow_sink``, ``wandb_sink`` (one per sink), ``libraries`` (their optional
libraries: the extra ``cairn-train[trackers]``).
"""

from cairn.trackers.cursor import TrackerCursor, read_cursor, sink_id
from cairn.trackers.export import ExportReport, PointBatch, TrackerSink, export_committed
from cairn.trackers.mlflow_sink import MLflowSink, tracking_uri_problem
from cairn.trackers.points import CommittedHistory, StepPoints, committed_history
from cairn.trackers.tensorboard_sink import TensorBoardSink
from cairn.trackers.wandb_sink import WandbSink, offline_steps, wandb_run_id

__all__ = [
    "CommittedHistory",
    "ExportReport",
    "MLflowSink",
    "PointBatch",
    "StepPoints",
    "TensorBoardSink",
    "TrackerCursor",
    "TrackerSink",
    "WandbSink",
    "committed_history",
    "export_committed",
    "offline_steps",
    "read_cursor",
    "sink_id",
    "tracking_uri_problem",
    "wandb_run_id",
]
