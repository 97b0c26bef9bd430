"""`cairn worker` as a supervisor and its worker process, on a real Temporal dev server: the
segment of a killed worker process is failed at once and retried (not after its heartbeat
timeout), a lost host (the supervisor killed too) is still caught by the heartbeat timeout, a
frozen host costs what a lost one costs and its thawed zombie changes nothing, and a completion
that reached the server just before the worker process died is never undone."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, PendingActivityState, TimeoutType
from temporalio.client import Client, WorkflowHandle

from activities.edge import STALL_MARGIN_S
from activities.views import RunSummary
from cairn.checkpoint import CheckpointKind, latest_committed, list_checkpoints
from cairn.effects import ReservationClient, published_entries
from cairn.stores import LocalStore
from tests.conftest import REPO
from tests.integration.conftest import (
    ReservationServer,
    TemporalServer,
    assert_matches_reference,
    run_input,
    start_worker_process,
)
from tests.integration.gil_holding_worker import HOLD_ENV
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


async def warm_segment_past(
    handle: WorkflowHandle[Any, Any], store: LocalStore, run_id: str, step: int, workers: list[Any]
) -> Any:
    """The run's segment once it runs warm (on its holder's own queue) with a commit at ``step``
    or later; the workers' logs if that does not happen within 90 s."""
    deadline = time.monotonic() + 90
    while True:
        segment = await running_segment(handle)
        ref = latest_committed(store, run_id)
        if segment is not None and "#w-" in segment.activity_options.task_queue.name and ref and ref.step >= step:
            return segment
        assert time.monotonic() < deadline, [w.log_tail() for w in workers]
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
        segment = await warm_segment_past(handle, store, inp.run_id, 25, workers)  # the second segment
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
        # Left to its heartbeat timeout it would be re-offered only after it (then 1 s more on the dead process's
        # sticky queue, unless it is reset); failed by the supervisor it is offered at once: ~0.1 s.
        assert started - killed < 1.1, f"the segment started elsewhere {started - killed:.2f} s after the kill"
        assert "#w-" not in retry.activity_options.task_queue.name  # on the shared queue: any worker
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
    finally:
        for w in workers:
            w.stop()
    assert summary.steps == 80 and 2 in summary.attempts, summary  # the killed segment counts its attempt
    assert summary.recomputed_steps <= inp.checkpoint.every, summary  # its reach came with the fail
    assert_matches_reference(summary, inp.config)


def group_of(pid: int, gone: int) -> int:
    """``pid``'s process group; ``gone`` when the process no longer exists (the attempt still
    names the worker process its supervisor killed, until the retry starts)."""
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return gone


async def started_elsewhere(handle: WorkflowHandle[Any, Any], frozen: int, timeout: float = 60) -> Any:
    """The segment once an attempt of it runs in a worker process outside process group ``frozen``."""
    deadline = time.monotonic() + timeout
    while True:
        segment = await running_segment(handle)
        if segment is not None and group_of(worker_pid(segment), frozen) != frozen:
            return segment
        assert time.monotonic() < deadline, "the segment did not start elsewhere"
        await asyncio.sleep(0.05)


@pytest.mark.drill
async def test_a_frozen_holder_costs_what_a_dead_one_costs_and_its_zombie_changes_nothing(
    client: Client,
    temporal_server: TemporalServer,
    reservation_service: ReservationServer,
    task_queue: str,
    tmp_path: Path,
) -> None:
    """The holder of a warm segment (supervisor and worker process) is frozen (SIGSTOP of its
    process group: a paused VM, a process stuck in I/O, a swap storm) past the heartbeat timeout.
    Its segment runs on the other worker within the heartbeat timeout + 2 s, as after a host's
    death: the frozen process's open polls are gone (the frontend's keepalive), and a segment lost
    on a worker's own queue is offered to every worker at once. Thawed, the zombie attempt stops
    without writing anything; the run ends bit-identical to an uninterrupted one, each external
    effect made once."""
    inp = run_input(
        tmp_path,
        total_steps=100,
        steps_per_segment=20,
        throttle_seconds_per_step=0.05,
        heartbeat_timeout_seconds=4,
        effects={"service_url": reservation_service.url, "resource": "FILTER-A", "units": 2, "timeout_seconds": 4},
    )
    store = LocalStore(inp.store)
    workers = [supervised_worker(temporal_server.address, task_queue, tmp_path / f"worker-{i}.log") for i in (0, 1)]
    frozen: ServerProcess | None = None
    try:
        deadline = time.monotonic() + 60
        while not all("polling" in w.log_tail() for w in workers):  # the retry must not wait for a start
            assert time.monotonic() < deadline and all(w.alive() for w in workers), [w.log_tail() for w in workers]
            await asyncio.sleep(0.05)
        handle = await client.start_workflow(
            TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue, task_timeout=WORKFLOW_TASK_TIMEOUT
        )
        segment = await warm_segment_past(handle, store, inp.run_id, 25, workers)
        frozen = next(w for w in workers if w.pid == os.getpgid(worker_pid(segment)))
        zombie_log = frozen.log_path
        froze = time.time()
        os.killpg(frozen.pid, signal.SIGSTOP)
        # What the holder committed before it froze (a commit is one atomic publish, so nothing of
        # the zombie's can appear later): its log may report the last of these only after the thaw.
        before_freeze = {r.step for r in list_checkpoints(store, inp.run_id, CheckpointKind.TRAINING)}
        retry = await started_elsewhere(handle, frozen.pid)
        started = retry.last_started_time.ToMicroseconds() / 1e6
        print(f"the segment ran elsewhere {started - froze:.2f} s after the freeze")
        # The target, the heartbeat timeout + 2 s, is measured by bench_recovery_supervised (median
        # +0.9 s); here a second of slack for a loaded CI machine, still short of the second heartbeat
        # timeout a retry swallowed by the frozen process costs (today's code: 19.6 s).
        hb = inp.heartbeat_timeout_seconds
        assert started - froze < hb + 3 < 2 * hb, f"ran elsewhere {started - froze:.2f} s after"
        # Thaw only once the retry committed past the frozen attempt's reach, and the freeze outlasted
        # the heartbeat timeout by more than the zombie's stall margin.
        reach = latest_committed(store, inp.run_id)
        assert reach is not None
        deadline = time.monotonic() + 60
        while (ref := latest_committed(store, inp.run_id)) is None or ref.step < reach.step + 2 * inp.checkpoint.every:
            assert time.monotonic() < deadline, "the retry made no progress"
            await asyncio.sleep(0.05)
        while time.time() - froze < inp.heartbeat_timeout_seconds + STALL_MARGIN_S + 0.5:
            await asyncio.sleep(0.05)
        thawed_at = zombie_log.stat().st_size  # a frozen process writes nothing: what follows is the zombie's
        os.killpg(frozen.pid, signal.SIGCONT)
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
        deadline = time.monotonic() + 30
        while "superseded" not in (after := zombie_log.read_bytes()[thawed_at:].decode(errors="replace")):
            assert time.monotonic() < deadline, after  # the zombie learns it at its next step
            await asyncio.sleep(0.05)
    finally:
        if frozen is not None:
            os.killpg(frozen.pid, signal.SIGCONT)
        for w in workers:
            w.stop()
    # Nothing created (a save that finds its step committed already converges on it: a read). A
    # commit made before the freeze may be logged after the thaw (frozen between publish and log).
    created = {int(m) for m in re.findall(r"committed step (\d+) \((?!identical, already committed)", after)}
    assert created <= before_freeze, (created, sorted(before_freeze), after)
    assert "stopped without committing" in after, after
    steps = [r.step for r in list_checkpoints(store, inp.run_id, CheckpointKind.TRAINING)]
    assert steps and all(s % inp.checkpoint.every == 0 for s in steps), steps  # no zombie commit off the schedule
    assert summary.steps == 100 and summary.recomputed_steps <= inp.checkpoint.every, summary
    assert_matches_reference(summary, inp.config)
    reservations = ReservationClient(reservation_service.url).reservations()
    assert [r["reservation_id"] for r in reservations] == ["reservation-1"], reservations
    assert ReservationClient(reservation_service.url).usage("FILTER-A")["consumed"] == 0  # released once
    assert len(published_entries(store, inp.run_id)) == 1


@pytest.mark.drill
async def test_a_worker_process_stuck_holding_the_interpreter_is_killed_as_hung(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    """The holder's Python side stops (a thread stuck in I/O holding the interpreter lock) while its
    SDK threads still answer the server and poll, so the keepalive cannot help: its supervisor sees
    no sign of life for the heartbeat timeout + 1 s, kills it and fails its attempt, and the
    segment runs on the other worker; the run ends bit-identical."""
    inp = run_input(
        tmp_path, total_steps=120, steps_per_segment=120, throttle_seconds_per_step=0.05, heartbeat_timeout_seconds=3
    )
    marker = tmp_path / "holding"
    env = {HOLD_ENV: f"40:{marker}"}
    argv = [sys.executable, "-m", "tests.integration.gil_holding_worker", "--supervised"]
    argv += ["--address", temporal_server.address, "--task-queue", task_queue]
    workers = [
        ServerProcess("supervisor", argv, tmp_path / f"worker-{i}.log", env=env, cwd=REPO).start() for i in (0, 1)
    ]
    try:
        deadline = time.monotonic() + 60
        while not all("polling" in w.log_tail() for w in workers):
            assert time.monotonic() < deadline and all(w.alive() for w in workers), [w.log_tail() for w in workers]
            await asyncio.sleep(0.05)
        handle = await client.start_workflow(
            TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue, task_timeout=WORKFLOW_TASK_TIMEOUT
        )
        deadline = time.monotonic() + 90
        while not marker.exists() or not marker.read_text().endswith("\n"):
            assert time.monotonic() < deadline, [w.log_tail() for w in workers]
            await asyncio.sleep(0.05)
        pid_text, held_at = marker.read_text().split()
        stuck = next(w for w in workers if w.pid == os.getpgid(int(pid_text)))
        retry = await started_elsewhere(handle, stuck.pid)
        started = retry.last_started_time.ToMicroseconds() / 1e6 - float(held_at)
        print(f"the segment ran elsewhere {started:.2f} s after the worker process stopped")
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
    finally:
        for w in workers:
            w.stop()
    log = stuck.log_path.read_text()
    assert f"worker process {pid_text} showed no sign of life for" in log, log
    assert "(hung) and was killed by SIGKILL;" in log and "starting a new one" in log, log
    # Killed at the heartbeat timeout + 1 s; a retry its SDK threads took meanwhile waits one more.
    assert started < 2 * inp.heartbeat_timeout_seconds + 2, f"ran elsewhere {started:.2f} s after"
    assert summary.steps == 120
    assert_matches_reference(summary, inp.config)
