"""The digits CNN (PyTorch adapter) trained durably on Temporal, epoch by epoch: a worker SIGKILLed
mid-segment, and the result bit-identical to an in-process reference. A trainer a worker cannot
import fails the run at once."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError

from activities.inputs import TrainingRunInput
from activities.views import RunSummary
from cairn.checkpoint import CheckpointRef
from cairn.checkpoint.compare import compare_states
from cairn.session import TrainingSession
from cairn.stores import LocalStore, MemoryStore
from cairn.training import load_training
from tests.conftest import digits_config
from tests.integration.conftest import (
    TemporalServer,
    kill_after_commit,
    start_worker_process,
    torch_run_input,
    wait_progress,
)
from workers.stack.servers import ServerProcess
from workers.worker import serving
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration


def train_reference(inp: TrainingRunInput, steps: int) -> TrainingSession:
    """The uninterrupted run, in this process."""
    reference = TrainingSession.fresh("reference", MemoryStore(f"ref-{uuid.uuid4().hex}"), inp.config)
    reference.run(steps)
    return reference


@pytest.mark.drill
async def test_torch_run_by_epochs_survives_sigkill_bit_identical(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    inp = torch_run_input(tmp_path)
    store = LocalStore(inp.store)
    first = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-a.log")
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await kill_after_commit(first, store, inp.run_id, 20)  # mid-way through the first epoch
        second = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-b.log")
        # The reference trains in a thread meanwhile: the run waits out a heartbeat timeout now.
        reference_run = asyncio.create_task(asyncio.to_thread(train_reference, inp, 78))
        progress = await wait_progress(handle, lambda p: p["val_loss"] is not None, timeout=120)
        assert progress["steps_per_epoch"] == 39 and progress["epoch"] >= 1.0
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=180))
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert summary.steps == summary.total_steps == 78  # 2 epochs x 39 updates
    assert summary.segments == 2 and summary.attempts[0] >= 2  # one segment per epoch; the first was retried
    assert summary.recomputed_steps <= inp.checkpoint.every
    assert summary.val_accuracy is not None and summary.val_accuracy > 0.5
    assert summary.reproducibility == "bit-exact"
    assert summary.checkpoint is not None
    ref = CheckpointRef.parse(summary.checkpoint)
    state, manifest = load_training(LocalStore(ref.store_url), ref)
    reference = await reference_run
    assert compare_states(state, reference.state) == []
    assert reference.last_commit is not None and manifest.fingerprint == reference.last_commit.manifest.fingerprint
    assert state.history["val_step"] == [39.0, 78.0]


async def test_a_trainer_the_worker_cannot_import_fails_the_run_at_once(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    config = digits_config().to_json()
    config["trainer"]["factory"] = "team_models.vision:ResNet"
    inp = torch_run_input(tmp_path, config=config)
    started = time.monotonic()
    async with serving(client, task_queue):
        with pytest.raises(WorkflowFailureError) as info:
            await asyncio.wait_for(
                client.execute_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue), timeout=60
            )
    assert time.monotonic() - started < 30  # no retry loop
    cause = info.value.cause
    while getattr(cause, "cause", None) is not None:
        cause = cause.cause  # type: ignore[union-attr]
    assert "module 'team_models' is not installed" in str(cause)
