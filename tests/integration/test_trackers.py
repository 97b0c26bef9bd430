"""Experiment trackers on a real dev server: a run with TensorBoard and MLflow trackers whose
worker is SIGKILLed mid-segment, so the retry recomputes steps its tracker export never saw
committed; afterwards TensorBoard's event files (read by its EventAccumulator) and MLflow's metric
history hold each committed step exactly once. And a run that continues-as-new after every
segment, while the export beside it runs: each run waits for its cancelled export to stop
before it continues, and its history replays."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.worker import Replayer

from activities.converter import DATA_CONVERTER
from activities.views import RunSummary
from cairn.stores import LocalStore
from cairn.trackers import TensorBoardSink, read_cursor, sink_id
from tests.integration.conftest import TemporalServer, kill_after_commit, run_input, start_worker_process
from tests.unit.trackers.conftest import mlflow_steps, once, tensorboard_steps
from workers.stack.servers import ServerProcess
from workers.worker import WORKFLOWS, serving
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration


async def test_a_killed_and_retried_run_holds_each_committed_step_once_in_its_trackers(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    tb, mlruns = tmp_path / "tb", f"file:{tmp_path / 'mlruns'}"
    inp = run_input(
        tmp_path,
        run_id=f"track-{uuid.uuid4().hex[:8]}",
        total_steps=60,
        steps_per_segment=15,
        throttle_seconds_per_step=0.04,
        trackers=[
            {"kind": "tensorboard", "log_dir": str(tb)},
            {"kind": "mlflow", "tracking_uri": mlruns, "experiment": "cairn-it"},
        ],
    )
    first = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-a.log")
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        # Segment 2 is 16..30: killed past the commit at 20, so 21.. are computed, lost, recomputed.
        await kill_after_commit(first, LocalStore(inp.store), inp.run_id, 20, after=0.12)
        second = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-b.log")
        summary = RunSummary.model_validate(await handle.result())
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert summary.steps == 60 and summary.retried_segments >= 1, summary  # the killed segment ran again
    once(tensorboard_steps(tb, inp.run_id), ("loss", "lr"), 60)
    once(mlflow_steps(mlruns, inp.run_id, "cairn-it"), ("loss", "lr"), 60)


ENDED = ("activity_task_completed", "activity_task_failed", "activity_task_timed_out", "activity_task_canceled")


def _ended_before_continuing(events: list[HistoryEvent]) -> bool:
    """Every activity whose cancel was requested ended before the run continued-as-new."""
    cancelled, ended = set(), set()
    for event in events:
        kind = event.WhichOneof("attributes").removesuffix("_event_attributes")
        if kind == "activity_task_cancel_requested":
            cancelled.add(event.activity_task_cancel_requested_event_attributes.scheduled_event_id)
        elif kind in ENDED:
            ended.add(getattr(event, f"{kind}_event_attributes").scheduled_event_id)
        elif kind == "workflow_execution_continued_as_new":
            return cancelled <= ended
    return True


async def test_each_run_waits_for_its_cancelled_export_before_it_continues_as_new(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    tb = tmp_path / "tb"
    inp = run_input(
        tmp_path,
        run_id=f"track-can-{uuid.uuid4().hex[:8]}",
        total_steps=30,
        steps_per_segment=10,
        segments_per_run=1,  # continue-as-new right after each segment, its export just started
        trackers=[{"kind": "tensorboard", "log_dir": str(tb)}],
    )
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        summary = RunSummary.model_validate(await handle.result())
    assert (summary.steps, summary.continued_as_new) == (30, 2), summary
    once(tensorboard_steps(tb, inp.run_id), ("loss", "lr"), 30)
    sink = TensorBoardSink(tb)
    name = sink_id(sink.kind, sink.destination())
    cursor = read_cursor(LocalStore(inp.store), inp.run_id, name, sink.kind, sink.destination())
    assert (cursor.confirmed, cursor.owner, cursor.pending) == (30, "", None)  # released
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)
    async for execution in client.list_workflows(f"WorkflowId = '{inp.run_id}'"):
        history = await client.get_workflow_handle(inp.run_id, run_id=execution.run_id).fetch_history()
        assert _ended_before_continuing(list(history.events)), execution.run_id
        replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
        assert replayed.replay_failure is None, replayed.replay_failure
