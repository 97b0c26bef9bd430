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

from activities.models import RunSummary
from cairn.checkpoint import latest_committed
from cairn.runs import STORE_ID_KEY, read_owner
from cairn.stores import LocalStore
from tests.integration.conftest import (
    TemporalServer,
    assert_matches_reference,
    run_input,
    start_worker_process,
    wait_progress,
)
from workers.run_commands import live_step
from workers.servers import ServerProcess
from workers.worker import build_worker
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
    async with build_worker(client, task_queue):
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
    inp = run_input(tmp_path, total_steps=30, steps_per_segment=30, throttle_seconds_per_step=0.03)
    async with build_worker(client, task_queue):
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
    inp = run_input(tmp_path, total_steps=20, steps_per_segment=10, checkpoint={"every": 5})
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
            await wait_progress(handle, lambda p: p["phase"] == "training" and p["step"] >= 0)
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
    """Kill between checkpoints, after the server has seen the segment a few steps past its last
    commit: the summary counts at least those steps, and never more than the interval."""
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
        deadline = time.monotonic() + 60
        while True:  # the server's view: a heartbeat at least 4 steps past the last commit
            seen = live_step(await handle.describe()) or 0
            committed = latest_committed(store, inp.run_id)
            assert committed is not None
            if seen - committed.step >= 4 and seen % every <= every - 6:
                break
            assert time.monotonic() < deadline, first.log_tail()
            await asyncio.sleep(0.02)
        os.killpg(first.pid, signal.SIGKILL)
        durable = latest_committed(store, inp.run_id)
        assert durable is not None
        second = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-b.log")
        summary: RunSummary = await asyncio.wait_for(handle.result(), timeout=120)
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert seen - durable.step <= summary.recomputed_steps <= every, (seen, durable.step, summary)
    assert summary.retried_segments == 1 and summary.attempts[0] >= 2
    assert (await handle.describe()).status == WorkflowExecutionStatus.COMPLETED
    assert_matches_reference(summary, inp.config)
