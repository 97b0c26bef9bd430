"""Experiment trackers on a real dev server: a run with TensorBoard and MLflow trackers whose
worker is SIGKILLed mid-segment, so the retry recomputes steps its tracker export never saw
committed; afterwards TensorBoard's event files (read by its EventAccumulator) and MLflow's metric
history hold each committed step exactly once."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.views import RunSummary
from cairn.stores import LocalStore
from tests.integration.conftest import TemporalServer, kill_after_commit, run_input, start_worker_process
from tests.unit.trackers.conftest import mlflow_steps, once, tensorboard_steps
from workers.stack.servers import ServerProcess
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
