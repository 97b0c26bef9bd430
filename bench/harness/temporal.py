"""Reading a run off the Temporal server: who polls a queue, a workflow's whole history across
continue-as-new, and the pending ``train_segment`` activity (its attempt, its worker's pid, its
heartbeat, the failure its retry carries)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from temporalio.api.enums.v1 import EventType, TaskQueueType, TimeoutType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest


async def _activity_pollers(client: Any, task_queue: str) -> Any:
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY,
        )
    )
    return resp.pollers


async def wait_worker_polling(client: Any, task_queue: str, timeout: float = 60) -> None:
    """Until a worker polls ``task_queue`` (so that a timed run does not include its start)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await _activity_pollers(client, task_queue):
            return
        await asyncio.sleep(0.2)
    raise TimeoutError(f"no worker polls {task_queue} after {timeout}s")


async def pollers(client: Any, queue: str) -> set[int]:
    """Pids of the processes that polled ``queue`` for activities recently."""
    return {
        int(p.identity.split("@", 1)[0])
        for p in await _activity_pollers(client, queue)
        if p.identity.split("@", 1)[0].isdigit()
    }


async def run_history(client: Any, workflow_id: str, first_run_id: str) -> list[list[Any]]:
    """The events of every run of a workflow, following continue-as-new from ``first_run_id``."""
    runs: list[list[Any]] = []
    run_id: str | None = first_run_id
    while run_id:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        events = [e async for e in handle.fetch_history_events()]
        runs.append(events)
        last = events[-1]
        run_id = None
        if last.HasField("workflow_execution_continued_as_new_event_attributes"):
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return runs


def segment_view(desc: Any) -> dict[str, Any] | None:
    """The pending train_segment: attempt, state, worker pid, start time, heartbeat details."""
    for p in desc.raw_description.pending_activities:
        if p.activity_type.name != "train_segment":
            continue
        details: dict[str, Any] = {}
        for payload in p.heartbeat_details.payloads:
            try:
                value = json.loads(payload.data)
            except ValueError:
                continue
            if isinstance(value, dict):
                details = value
        pid = None
        identity = p.last_worker_identity
        if "@" in identity and identity.split("@", 1)[0].isdigit():
            pid = int(identity.split("@", 1)[0])
        return {
            "attempt": p.attempt,
            "state": p.state,
            "started": p.last_started_time.ToMicroseconds() / 1e6 if p.HasField("last_started_time") else None,
            "pid": pid,
            "details": details,
        }
    return None


def pending_segment(desc: Any) -> dict[str, Any] | None:
    """The pending train_segment as ``segment_view`` sees it, plus which activity it is (the
    workflow run and the activity id: a segment lost on its warm worker's own queue is re-offered
    to the run's queue as a new activity, Temporal attempt 1, its attempt count carried in the
    heartbeat's ``attempt``) and whether the current attempt has heartbeated yet."""
    view = segment_view(desc)
    if view is None:
        return None
    for p in desc.raw_description.pending_activities:
        if p.activity_type.name == "train_segment":
            view["key"] = (desc.run_id or "", p.activity_id)
            beat = p.last_heartbeat_time.ToMicroseconds() / 1e6 if p.HasField("last_heartbeat_time") else None
            view["beat_now"] = beat is not None and view["started"] is not None and beat >= view["started"]
            logical = view["details"].get("attempt")
            view["logical"] = logical if view["beat_now"] and isinstance(logical, int) else None
            break
    return view


def failure_kind(desc: Any) -> str:
    """What the pending train_segment's last failure was: a heartbeat timeout or an error type."""
    for p in desc.raw_description.pending_activities:
        if p.activity_type.name == "train_segment" and p.HasField("last_failure"):
            f = p.last_failure
            if f.HasField("timeout_failure_info"):
                return "heartbeat timeout"
            if f.HasField("application_failure_info"):
                return str(f.application_failure_info.type)
            return str(f.message[:40])
    return "?"


def kill_events(runs: list[list[Any]], since: float, until: float) -> list[list[Any]]:
    """[seconds after the kill, event type, what] of the workflow's history events in a window
    (a failed or timed-out segment attempt, the workflow tasks, a segment scheduled: on which queue)."""
    out: list[list[Any]] = []
    for events in runs:
        for e in events:
            t = e.event_time.ToMicroseconds() / 1e6
            if not since <= t <= until:
                continue
            what = ""
            if e.HasField("activity_task_scheduled_event_attributes"):
                a = e.activity_task_scheduled_event_attributes
                what = f"{a.activity_type.name} on {a.task_queue.name}"
            elif e.HasField("activity_task_timed_out_event_attributes"):
                f = e.activity_task_timed_out_event_attributes.failure
                info = f.timeout_failure_info if f.HasField("timeout_failure_info") else None
                if info is None and f.HasField("cause") and f.cause.HasField("timeout_failure_info"):
                    info = f.cause.timeout_failure_info
                what = TimeoutType.Name(info.timeout_type) if info is not None else f.message[:60]
            elif e.HasField("activity_task_failed_event_attributes"):
                f = e.activity_task_failed_event_attributes.failure
                what = f.application_failure_info.type if f.HasField("application_failure_info") else f.message[:60]
            out.append([round(t - since, 4), EventType.Name(e.event_type).removeprefix("EVENT_TYPE_"), what])
    return out
