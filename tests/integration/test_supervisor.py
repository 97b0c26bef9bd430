"""`cairn worker` as a supervisor and its worker process, on a real Temporal dev server: the
segment of a killed worker process is failed at once and retried (not after its heartbeat
timeout), a lost host (the supervisor killed too) is still caught by the heartbeat timeout, and
a completion that reached the server just before the worker process died is never undone."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState, TimeoutType
from temporalio.client import Client, WorkflowHandle

from activities.views import RunSummary
from cairn.checkpoint import latest_committed
from cairn.stores import LocalStore
from tests.conftest import REPO
from tests.integration.conftest import TemporalServer, assert_matches_reference, run_input, start_worker_process
from workers.client import WORKFLOW_TASK_TIMEOUT
from workers.stack.servers import ServerProcess
from workers.supervisor import CRASH_AFTER_COMPLETION, WORKER_CRASHED
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration


def supervised_worker(address: str, task_queue: str, log: Path, env: dict[str, str] | None = None) -> ServerProcess:
    """`cairn worker` (a supervisor and its worker process) in a process group of its own."""
    argv = [sys.executable, "-m", "workers.cli", "worker", "--address", address, "--task-queue", task_queue]
    return ServerProcess("supervisor", argv, log, env=env, cwd=REPO).start()


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def running_segment(handle: WorkflowHandle[Any, Any]) -> Any | None:
    """The pending train_segment, if an attempt of it is running."""
    for p in (await handle.describe()).raw_description.pending_activities:
        if p.activity_type.name == "train_segment" and p.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
            return p
    return None


async def segment_underway(handle: WorkflowHandle[Any, Any], store: LocalStore, run_id: str, log: ServerProcess) -> Any:
    """The running segment once it has committed a few checkpoints."""
    deadline = time.monotonic() + 90
    while True:
        ref = latest_committed(store, run_id)
        segment = await running_segment(handle)
        if ref is not None and ref.step >= 10 and segment is not None:
            return segment
        assert time.monotonic() < deadline, log.log_tail()
        assert log.alive(), log.log_tail()
        await asyncio.sleep(0.05)


async def retry_started(handle: WorkflowHandle[Any, Any], attempt: int, timeout: float = 90) -> Any:
    """The running segment once an attempt after ``attempt`` started (polled every 50 ms)."""
    deadline = time.monotonic() + timeout
    while True:
        segment = await running_segment(handle)
        if segment is not None and segment.attempt > attempt:
            return segment
        assert time.monotonic() < deadline, "no retry started"
        await asyncio.sleep(0.05)


def worker_pid(segment: Any) -> int:
    """The pid of the worker process running ``segment`` (its identity is PID@HOST)."""
    return int(segment.last_worker_identity.split("@", 1)[0])


async def test_killed_worker_process_is_failed_at_once_and_retried(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    # A 30 s heartbeat timeout: a retry within seconds can only come from the supervisor's fail.
    inp = run_input(
        tmp_path, total_steps=60, steps_per_segment=60, throttle_seconds_per_step=0.05, heartbeat_timeout_seconds=30
    )
    worker = supervised_worker(temporal_server.address, task_queue, tmp_path / "worker.log")
    try:
        handle = await client.start_workflow(
            TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue, task_timeout=WORKFLOW_TASK_TIMEOUT
        )
        segment = await segment_underway(handle, LocalStore(inp.store), inp.run_id, worker)
        victim = worker_pid(segment)
        assert victim != worker.pid and parent_of(victim) == worker.pid  # the supervisor's child
        killed = time.time()
        os.kill(victim, signal.SIGKILL)  # the worker process only: its supervisor lives on
        retry = await retry_started(handle, segment.attempt, timeout=40)
        started = retry.last_started_time.ToMicroseconds() / 1e6
        assert started - killed < 8, f"retry started {started - killed:.1f} s after the kill"
        assert retry.last_failure.application_failure_info.type == WORKER_CRASHED, retry.last_failure
        assert worker_pid(retry) != victim and parent_of(worker_pid(retry)) == worker.pid  # a new child took it
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
        worker.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert worker.proc.wait(timeout=60) == 0  # type: ignore[union-attr]
    finally:
        worker.stop()
    log = (tmp_path / "worker.log").read_text()
    assert f"worker process {victim} killed by SIGKILL; failed train_segment of {inp.run_id}" in log, log
    assert "Traceback" not in log, log
    assert summary.steps == 60 and summary.attempts == [2] and summary.recomputed_steps <= inp.checkpoint.every
    assert_matches_reference(summary, inp.config)


async def test_lost_host_is_caught_by_the_heartbeat_timeout(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    inp = run_input(
        tmp_path, total_steps=120, steps_per_segment=120, throttle_seconds_per_step=0.05, heartbeat_timeout_seconds=3
    )
    worker = supervised_worker(temporal_server.address, task_queue, tmp_path / "worker-a.log")
    standby: ServerProcess | None = None
    try:
        handle = await client.start_workflow(
            TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue, task_timeout=WORKFLOW_TASK_TIMEOUT
        )
        await segment_underway(handle, LocalStore(inp.store), inp.run_id, worker)
        standby = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-b.log")
        deadline = time.monotonic() + 60
        while "polling" not in standby.log_tail():  # the retry must not wait for its start
            assert time.monotonic() < deadline and standby.alive(), standby.log_tail()
            await asyncio.sleep(0.05)
        segment = await running_segment(handle)
        assert segment is not None and parent_of(worker_pid(segment)) == worker.pid, "the segment ended too soon"
        child = worker_pid(segment)
        killed = time.time()
        os.killpg(worker.pid, signal.SIGKILL)  # the whole host: supervisor and worker process at once
        worker.proc.wait(timeout=10)  # type: ignore[union-attr]
        deadline = time.monotonic() + 10
        while alive(child):  # killing the supervisor's group killed its child too
            assert time.monotonic() < deadline, f"worker process {child} survived its group's SIGKILL"
            await asyncio.sleep(0.05)
        retry = await retry_started(handle, segment.attempt)
        started = retry.last_started_time.ToMicroseconds() / 1e6
        assert 2.5 < started - killed < inp.heartbeat_timeout_seconds + 5, started - killed
        timeout = retry.last_failure.timeout_failure_info
        assert timeout.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT, retry.last_failure
        assert worker_pid(retry) == standby.pid
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
    finally:
        worker.stop()
        if standby is not None:
            standby.stop()
    assert summary.steps == 120 and summary.attempts == [2]
    assert_matches_reference(summary, inp.config)


async def test_a_completion_that_reached_the_server_is_never_failed(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    """The worker process dies right after the server took a segment's completion, before it
    told its supervisor: the supervisor's fail of that attempt is refused, nothing is retried."""
    inp = run_input(tmp_path, total_steps=30, steps_per_segment=15, heartbeat_timeout_seconds=30)
    marker = tmp_path / "crashed"
    env = {"CAIRN_FAULT": f"{CRASH_AFTER_COMPLETION}:train_segment", "CAIRN_FAULT_ONCE": str(marker)}
    worker = supervised_worker(temporal_server.address, task_queue, tmp_path / "worker.log", env=env)
    try:
        handle = await client.start_workflow(
            TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue, task_timeout=WORKFLOW_TASK_TIMEOUT
        )
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
        worker.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        assert worker.proc.wait(timeout=60) == 0  # type: ignore[union-attr]
    finally:
        worker.stop()
    log = (tmp_path / "worker.log").read_text()
    assert marker.exists(), log  # it crashed
    assert f"train_segment of {inp.run_id} (attempt 1) had already finished (the server refused the fail)" in log, log
    assert "starting a new one" in log and "Traceback" not in log and "WARNING" not in log, log
    assert summary.attempts == [1, 1] and summary.retried_segments == 0, summary
    assert_matches_reference(summary, inp.config)
    async for event in handle.fetch_history_events():  # not one attempt of anything was failed
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            assert event.activity_task_started_event_attributes.attempt == 1


async def test_a_warm_segments_killed_process_is_offered_to_every_worker_at_once(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    """The holder of a warm run (its segment on the worker's own queue, which only that process
    polls) is killed: its supervisor fails the attempt non-retryable with its last heartbeat, so
    the workflow offers the segment to every worker at once — no retry waiting on the dead
    process's own queue, no workflow task on its sticky queue — and the standby takes it."""
    inp = run_input(
        tmp_path, total_steps=80, steps_per_segment=20, throttle_seconds_per_step=0.05, heartbeat_timeout_seconds=30
    )
    workers = [supervised_worker(temporal_server.address, task_queue, tmp_path / f"worker-{i}.log") for i in (0, 1)]
    try:
        handle = await client.start_workflow(
            TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue, task_timeout=WORKFLOW_TASK_TIMEOUT
        )
        store = LocalStore(inp.store)
        deadline = time.monotonic() + 90
        while True:  # the second segment, warm on its holder's own queue, past its first commit
            segment = await running_segment(handle)
            ref = latest_committed(store, inp.run_id)
            if segment is not None and "#w-" in segment.activity_options.task_queue.name and ref and ref.step >= 25:
                break
            assert time.monotonic() < deadline, [w.log_tail() for w in workers]
            await asyncio.sleep(0.05)
        victim, killed_id = worker_pid(segment), segment.activity_id
        killed = time.time()
        os.kill(victim, signal.SIGKILL)
        while True:
            retry = await running_segment(handle)
            if retry is not None and retry.activity_id != killed_id:
                break
            assert time.time() - killed < 30, "no retry started"
            await asyncio.sleep(0.05)
        started = retry.last_started_time.ToMicroseconds() / 1e6
        # A retry on the dead own queue waits 0.2 s + its 1 s pickup timeout before the workflow re-offers it
        # (then 2 s more on the dead process's sticky queue, unless it is reset); offered at once: ~0.1 s.
        assert started - killed < 1.1, f"the segment started elsewhere {started - killed:.2f} s after the kill"
        assert "#w-" not in retry.activity_options.task_queue.name  # on the shared queue: any worker
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
    finally:
        for w in workers:
            w.stop()
    assert summary.steps == 80 and 2 in summary.attempts, summary  # the killed segment counts its attempt
    assert summary.recomputed_steps <= inp.checkpoint.every, summary  # its reach came with the fail
    assert_matches_reference(summary, inp.config)
