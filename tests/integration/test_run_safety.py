"""A run stays on one store and one writer, never stalls after a crash in a short activity, and
counts the steps it really recomputed — on a real Temporal dev server."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import time
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from activities.views import RunSummary
from cairn.checkpoint import latest_committed
from cairn.runs.ownership import read_owner
from cairn.stores import LocalStore
from cairn.stores.identity import STORE_ID_KEY
from tests.integration.conftest import (
    S3Server,
    TemporalServer,
    assert_matches_reference,
    cli,
    run_input,
    start_worker_process,
    wait_progress,
)
from workers.cli.temporal import live_step
from workers.stack.servers import ServerProcess
from workers.worker import serving
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration


def innermost(exc: BaseException) -> BaseException:
    """The activity's own typed error inside a workflow failure."""
    while getattr(exc, "cause", None) is not None:
        exc = exc.cause  # type: ignore[attr-defined]
    return exc


async def wait_committed(store: LocalStore, run_id: str, step: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while (ref := latest_committed(store, run_id)) is None or ref.step < step:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)


async def test_another_store_behind_the_same_path_fails_the_run(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    """What a second host with its own local directory looks like: the path is the same, the
    store is not. The run fails at once (no retry loop, no silent split of checkpoints)."""
    inp = run_input(tmp_path, total_steps=60, steps_per_segment=20, throttle_seconds_per_step=0.03)
    store = LocalStore(inp.store)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await wait_committed(store, inp.run_id, 5)
        assert store.exists(STORE_ID_KEY)
        shutil.move(inp.store, tmp_path / "first-host-store")  # "another host": same path, empty
        os.makedirs(inp.store)
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), timeout=60)
    cause = innermost(failed.value)
    assert getattr(cause, "type", None) == "StoreIdentityError", cause
    assert "shared" in str(cause) and "s3://" in str(cause)


async def test_second_workflow_on_a_run_id_is_refused_then_may_take_over(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    # 3 s of training: the second workflow's claim lands while the first is surely running
    inp = run_input(tmp_path, total_steps=30, steps_per_segment=30, throttle_seconds_per_step=0.1)
    async with serving(client, task_queue):
        first = await client.start_workflow(TrainingRun.run, inp, id=f"{inp.run_id}-a", task_queue=task_queue)
        await wait_progress(first, lambda p: p["phase"] == "training")
        second = await client.start_workflow(TrainingRun.run, inp, id=f"{inp.run_id}-b", task_queue=task_queue)
        with pytest.raises(WorkflowFailureError) as refused:
            await asyncio.wait_for(second.result(), timeout=30)
        cause = innermost(refused.value)
        assert getattr(cause, "type", None) == "RunOwnershipError" and f"{inp.run_id}-a" in str(cause), cause
        summary = await first.result()  # the owner is undisturbed
        assert summary.steps == 30
        assert_matches_reference(summary, inp.config)
        # Once the owner has closed, another workflow may continue the run (a restart).
        third = await client.start_workflow(
            TrainingRun.run, inp.model_copy(update={"total_steps": 40}), id=f"{inp.run_id}-c", task_queue=task_queue
        )
        resumed = await asyncio.wait_for(third.result(), timeout=60)
    assert resumed.steps == 40
    owner = read_owner(LocalStore(inp.store), inp.run_id)
    assert owner is not None and owner.workflow_id == f"{inp.run_id}-c"


@pytest.mark.drill
@pytest.mark.parametrize("activity", ["open_run", "collect_checkpoints", "latest_checkpoint"])
async def test_kill_inside_a_short_activity_does_not_stall(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path, activity: str
) -> None:
    """SIGKILL inside each short activity: the run is retried after the heartbeat timeout (3 s),
    not after a start-to-close timeout of minutes (a 309 s stall before)."""
    inp = run_input(  # one 1 s segment: room for a checkpoint-now signal to land inside it
        tmp_path, total_steps=20, steps_per_segment=20, checkpoint={"every": 5}, throttle_seconds_per_step=0.05
    )
    env = {
        **os.environ,
        "CAIRN_FAULT": f"in-activity:{activity}",
        "CAIRN_FAULT_ONCE": str(tmp_path / "fault-fired"),
    }
    first = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-a.log", env=env)
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        if activity == "latest_checkpoint":  # runs after an interrupted segment: interrupt one
            await wait_committed(LocalStore(inp.store), inp.run_id, 0)
            await asyncio.sleep(0.2)
            await handle.signal(TrainingRun.checkpoint_now)
        deadline = time.monotonic() + 60
        while not (tmp_path / "fault-fired").exists():
            assert time.monotonic() < deadline, first.log_tail()
            await asyncio.sleep(0.05)
        assert first.proc is not None
        await asyncio.get_running_loop().run_in_executor(None, first.proc.wait, 10)
        killed_at = time.monotonic()
        second = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-b.log")
        summary = await asyncio.wait_for(handle.result(), timeout=60)
        recovered_in = time.monotonic() - killed_at
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert summary.steps == 20
    assert recovered_in < 60, recovered_in  # liveness: a stall would wait out minutes
    assert_matches_reference(summary, inp.config)


@pytest.mark.drill
async def test_recomputed_steps_count_the_steps_really_redone(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    """Kill 0.6 s (about 12 steps) after a commit, between checkpoints: the summary counts the
    steps redone from the server's view of the dead attempt (heartbeats at most 0.2 s apart), not
    0 as with a 1 s heartbeat throttle, and never more than the interval."""
    every = 20
    inp = run_input(
        tmp_path, total_steps=60, steps_per_segment=60, checkpoint={"every": every}, throttle_seconds_per_step=0.05
    )
    store = LocalStore(inp.store)
    first = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-a.log")
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await wait_committed(store, inp.run_id, every)
        await asyncio.sleep(0.6)  # deliberate: the kill lands ~12 steps past the commit at 20, before 40's
        seen = live_step(await handle.describe()) or 0
        os.killpg(first.pid, signal.SIGKILL)
        durable = latest_committed(store, inp.run_id)
        assert durable is not None
        second = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-b.log")
        summary: RunSummary = await asyncio.wait_for(handle.result(), timeout=120)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert durable.step == every, "killed between the checkpoints at 20 and 40"
    assert max(3, seen - durable.step) <= summary.recomputed_steps <= every, (seen, summary)
    assert summary.retried_segments == 1 and summary.attempts[0] >= 2
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    assert_matches_reference(summary, inp.config)


async def test_storage_outage_failure_reads_in_one_line(
    client: Client, task_queue: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During an S3 outage the failure Temporal shows (describe, the Web UI) is the concise typed
    error, not 'Failure exceeds size limit.' with a traceback chain riding along."""
    from workers.stack.servers import free_port

    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", f"http://127.0.0.1:{free_port()}")  # nobody listens
    inp = run_input(tmp_path, store="s3://cairn-outage/runs")
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        deadline = time.monotonic() + 60
        while True:
            pending = list((await handle.describe()).raw_description.pending_activities)
            if pending and pending[0].HasField("last_failure"):
                failure = pending[0].last_failure
                break
            assert time.monotonic() < deadline
            await asyncio.sleep(0.2)
        await handle.terminate("test over")
    assert failure.application_failure_info.type == "StorageError", failure
    assert "exceeds size limit" not in failure.message and "\n" not in failure.message
    assert "could not connect" in failure.message.lower() or "connect" in failure.message.lower(), failure.message
    assert len(failure.message) < 600 and not failure.HasField("cause"), failure
    assert failure.application_failure_info.non_retryable is False  # storage trouble heals: retried


async def test_a_store_that_does_not_exist_fails_the_run_at_once(
    client: Client, task_queue: str, tmp_path: Path, seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mistyped bucket is not storage trouble that heals: the run ends FAILED within seconds
    (StoreNotFoundError, non-retryable) instead of retrying forever; the CLI says so with exit 2."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", seaweedfs.endpoint)
    inp = run_input(tmp_path, store="s3://no-such-bucket-cairn/runs")
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), timeout=30)
    cause = innermost(failed.value)
    assert getattr(cause, "type", None) == "StoreNotFoundError" and "no such bucket" in str(cause), cause
    env = {"AWS_ENDPOINT_URL_S3": seaweedfs.endpoint}
    missing_bucket = await asyncio.to_thread(
        cli, "ckpt", "list", "s3://no-such-bucket-cairn/runs", env=env, check=False
    )
    assert missing_bucket.returncode == 2 and "StoreNotFoundError" in missing_bucket.stderr
    missing_prefix = await asyncio.to_thread(
        cli, "ckpt", "list", f"s3://{seaweedfs.bucket}/no-such-prefix", env=env, check=False
    )
    assert missing_prefix.returncode == 2 and "no-such-prefix" in missing_prefix.stderr


async def test_another_model_on_a_run_id_is_refused_naming_the_field_not_the_length(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    """A run id that already holds checkpoints of another model, started again with a shorter
    run: the refusal names the model field that differs (what the user got wrong), not the
    committed step being past ``total_steps`` (what follows from it)."""
    first = run_input(tmp_path, total_steps=20, steps_per_segment=20, checkpoint={"every": 10})
    config = first.config.model_dump(mode="json")
    config["model"]["hidden"] = 32
    wider = first.model_copy(update={"config": type(first.config).model_validate(config), "total_steps": 10})
    async with serving(client, task_queue):
        await client.execute_workflow(TrainingRun.run, first, id=f"{first.run_id}-a", task_queue=task_queue)
        with pytest.raises(WorkflowFailureError) as refused:
            await client.execute_workflow(TrainingRun.run, wider, id=f"{first.run_id}-b", task_queue=task_queue)
    cause = innermost(refused.value)
    assert getattr(cause, "type", None) == "IncompatibleConfigError", cause
    assert "config.model.hidden" in str(cause) and "expected 32" in str(cause) and "found 16" in str(cause), cause
    assert "total_steps" not in str(cause)
