"""How the ``cairn run`` commands talk to Temporal: a command's connection and its refusals as
typed errors, queries to a run, its running segment as the server saw it, and its result."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest, DescribeTaskQueueResponse
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.inputs import OWN_QUEUE_MARK
from activities.views import RunProgress, RunSummary
from cairn.errors import TemporalRefusedError, TemporalUnavailableError
from workers.cli.output import emit
from workers.client import connect
from workers.reports.timeline import SEGMENT_ACTIVITIES
from workflows.training_run import TrainingRun

__all__ = [
    "attempts_text",
    "closed_word",
    "LIVE_POLL_SECONDS",
    "QueuePollers",
    "pollers_of",
    "queue_pollers",
    "run_queues",
    "durable_text",
    "failure_message",
    "heartbeat_progress",
    "live_step",
    "query_run",
    "run_progress",
    "segment_view",
    "show_result",
    "start_input",
    "summary_text",
    "temporal_command",
]

QUERY_TIMEOUT = timedelta(seconds=5)


_REFUSALS = {
    RPCStatusCode.NOT_FOUND,
    RPCStatusCode.ALREADY_EXISTS,
    RPCStatusCode.INVALID_ARGUMENT,
    RPCStatusCode.FAILED_PRECONDITION,
    RPCStatusCode.PERMISSION_DENIED,
    RPCStatusCode.UNAUTHENTICATED,
}
"""Temporal's answers that a retry would get again: reported as ``TemporalRefusedError``."""


def temporal_command(
    fn: Callable[[argparse.Namespace, Client], Any], prepare: Callable[[argparse.Namespace], None] | None = None
) -> Callable[[argparse.Namespace], int]:
    """A command that talks to Temporal; ``prepare`` checks local input before connecting."""

    def handler(args: argparse.Namespace) -> int:
        if prepare is not None:
            prepare(args)

        async def go() -> int:
            try:
                client = await connect(args.address, args.namespace)
            except RuntimeError as exc:  # the SDK's connection failure
                raise TemporalUnavailableError(f"cannot connect to Temporal: {exc}") from None
            try:
                code: int = await fn(args, client)
                return code
            except RPCError as exc:
                if exc.status in _REFUSALS:
                    raise TemporalRefusedError(f"Temporal refused: {exc.message}") from None
                raise TemporalUnavailableError(f"Temporal did not answer: {exc.message}") from None

        return asyncio.run(go())

    return handler


def attempts_text(attempts: list[int], segments: int, retried: int) -> str:
    recent = f", recent attempts {attempts}" if attempts else ""
    return f"{segments} segment(s), {retried} retried{recent}"


def durable_text(checkpoint: str | None, durable: str | None) -> str:
    """The durable cursor beside the run's checkpoint: the same one, or behind it (a node-local
    tier's upload pending; a retry on another host resumes from the durable one)."""
    if durable is None:
        return "- (none uploaded yet)" if checkpoint else "-"
    return "the same (uploaded)" if durable == checkpoint else f"{durable} (upload of the newer one pending)"


def summary_text(s: RunSummary) -> str:
    lines = [
        f"run {s.run_id}: {s.steps}/{s.total_steps} steps{' (stopped early)' if s.stopped_early else ''}",
        f"checkpoint   {s.checkpoint or '- (none committed)'}",
        f"fingerprint  {s.fingerprint or '-'}",
        f"durable      {durable_text(s.checkpoint, s.durable_checkpoint)}",
        f"segments     {attempts_text(s.attempts, s.segments, s.retried_segments)}; "
        f"recomputed {s.recomputed_steps} step(s); continued-as-new {s.continued_as_new}x",
    ]
    if s.world_size > 1:
        lines.append(f"world size   {s.world_size} rank(s) at the end")
    if s.loss is not None:
        lines.append(f"loss         {s.loss:.6f}")
    if s.val_loss is not None:
        accuracy = "" if s.val_accuracy is None else f", accuracy {s.val_accuracy:.4f}"
        lines.append(f"validation   loss {s.val_loss:.6f}{accuracy}")
    if s.reproducibility:
        lines.append(f"contract     {s.reproducibility}")
    for name, receipt in s.effects.items():
        lines.append(f"effect       {name}: {receipt}")
    return "\n".join(lines)


def closed_word(status: WorkflowExecutionStatus | None) -> str:
    return (
        {
            WorkflowExecutionStatus.FAILED: "failed",
            WorkflowExecutionStatus.CANCELED: "cancelled",
            WorkflowExecutionStatus.TERMINATED: "terminated",
            WorkflowExecutionStatus.TIMED_OUT: "timed out",
        }.get(status, "did not complete")
        if status
        else "did not complete"
    )


def failure_message(exc: BaseException) -> str:
    """The innermost readable message of a workflow failure (the activity's typed error)."""
    cause: BaseException | None = exc
    message = str(exc)
    while cause is not None:
        text = getattr(cause, "message", None) or str(cause)
        kind = getattr(cause, "type", None)
        if text:
            message = f"{kind}: {text}" if kind else text
        cause = cause.__cause__ or getattr(cause, "cause", None)
    return message


async def show_result(args: argparse.Namespace, client: Client, workflow_id: str) -> int:
    handle = client.get_workflow_handle_for(TrainingRun.run, workflow_id)
    try:
        summary = await handle.result()
    except WorkflowFailureError as exc:
        desc = await handle.describe()
        word = closed_word(desc.status)
        message = failure_message(exc)
        emit(args, {"workflow_id": workflow_id, "status": word, "error": message}, f"run {word}: {message}")
        return 1
    emit(args, {"workflow_id": workflow_id, "status": "completed", **summary.model_dump()}, summary_text(summary))
    return 0


LIVE_POLL_SECONDS = 75.0
"""A worker long-polls for up to a minute and polls again at once, so one that is polling now was
seen by the server within this; Temporal keeps listing a poller for minutes after it stopped."""


@dataclass(frozen=True)
class QueuePollers:
    """Who polls one task queue, from the server's description of it."""

    queue: str
    kind: str
    """``workflow`` (workflow tasks) or ``activity``."""
    live: int
    """Pollers seen within ``LIVE_POLL_SECONDS``: workers polling now."""
    last_seen_s: float | None
    """Seconds since the server last saw any poller of it (None: none listed at all)."""


def pollers_of(response: DescribeTaskQueueResponse, queue: str, kind: str, now: float) -> QueuePollers:
    """``QueuePollers`` from a describe answer at wall time ``now`` (seconds since the epoch)."""
    ages = [max(0.0, now - (p.last_access_time.seconds + p.last_access_time.nanos / 1e9)) for p in response.pollers]
    live = sum(1 for age in ages if age <= LIVE_POLL_SECONDS)
    return QueuePollers(queue, kind, live, min(ages) if ages else None)


async def queue_pollers(client: Client, queue: str, kind: str) -> QueuePollers:
    kinds = {"workflow": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, "activity": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY}
    request = DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kinds[kind]
    )
    resp = await client.workflow_service.describe_task_queue(request)
    return pollers_of(resp, queue, kind, time.time())


async def run_queues(client: Client, workflow_id: str, run_queue: str) -> list[tuple[str, str]]:
    """The (queue, kind) pairs a running run needs polled: its own queue for workflow tasks and
    bookkeeping, and the queue its segments were last sent to (its numerics profile's queue, in
    the shared form: a warm worker's own queue falls back to it), from the run's history."""
    needed = [(run_queue, "workflow"), (run_queue, "activity")]
    training: str | None = None
    async for event in client.get_workflow_handle(workflow_id).fetch_history_events():
        if event.HasField("activity_task_scheduled_event_attributes"):
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name in SEGMENT_ACTIVITIES:
                training = attrs.task_queue.name.split(OWN_QUEUE_MARK)[0]
    if training is not None and training != run_queue:
        needed.append((training, "activity"))
    return needed


async def query_run(handle: Any, query: Any) -> Any:
    """A query to the run; a run that cannot answer (its input never decoded: it failed before
    its first line) is a one-line ``TemporalRefusedError``, not the SDK's traceback."""
    try:
        return await handle.query(query, rpc_timeout=QUERY_TIMEOUT)
    except WorkflowQueryFailedError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "Expected workflow input" in reason:  # the SDK's words for a run whose input never decoded
            reason = "its input never decoded, so it failed before its first step"
        raise TemporalRefusedError(
            f"workflow {handle.id!r} cannot answer queries ({reason}); `cairn run result {handle.id}` "
            "says how it ended",
            field="workflow_id",
        ) from None


async def run_progress(client: Client, workflow_id: str) -> RunProgress:
    handle = client.get_workflow_handle_for(TrainingRun.run, workflow_id)
    progress: RunProgress = await query_run(handle, TrainingRun.progress)
    return progress


def segment_view(desc: WorkflowExecutionDescription) -> dict[str, Any] | None:
    """The running segment as the server saw it last: attempt, heartbeat, last failure. The
    attempt is the segment's own as its heartbeat says it (a segment moved off a warm worker's
    queue, or a gang retried whole, starts again as a new activity: its server attempt is 1),
    or the server's if that is higher (no heartbeat yet from this attempt)."""
    for pending in desc.raw_description.pending_activities:
        if pending.activity_type.name not in SEGMENT_ACTIVITIES:
            continue
        view: dict[str, Any] = {"attempt": pending.attempt, "state": pending.state}
        for payload in pending.heartbeat_details.payloads:
            try:
                value = json.loads(payload.data)
            except ValueError:
                continue
            if isinstance(value, dict):
                view.update({k: value.get(k) for k in ("step", "checkpoint", "loss")})
                own = value.get("attempt")
                if isinstance(own, int) and not isinstance(own, bool) and own > view["attempt"]:
                    view["attempt"] = own
        if pending.HasField("last_heartbeat_time"):
            view["last_heartbeat"] = pending.last_heartbeat_time.ToDatetime().isoformat(timespec="seconds") + "Z"
        if pending.HasField("last_failure"):
            view["last_failure"] = pending.last_failure.message
        return view
    return None


def heartbeat_progress(desc: Any) -> tuple[int, float | None] | None:
    """The furthest step a running segment's last heartbeat reported, with the loss that same
    heartbeat carried (the loss *of* that step: the activity updates both together). A gang's
    nodes heartbeat each; the furthest wins. None: no segment has heartbeat a step yet."""
    best: tuple[int, float | None] | None = None
    for pending in desc.raw_description.pending_activities:
        if pending.activity_type.name not in SEGMENT_ACTIVITIES:
            continue
        for payload in pending.heartbeat_details.payloads:
            try:
                value = json.loads(payload.data)
            except ValueError:
                continue
            step = value.get("step") if isinstance(value, dict) else None
            if not isinstance(step, int) or isinstance(step, bool) or (best is not None and step < best[0]):
                continue
            loss = value.get("loss")
            best = (step, float(loss) if isinstance(loss, int | float) and not isinstance(loss, bool) else None)
    return best


async def start_input(client: Client, workflow_id: str) -> dict[str, Any]:
    """The input the workflow id's latest execution was started with, as Temporal recorded it
    (its first history event; no worker needed). {} when it is not a JSON object."""
    handle = client.get_workflow_handle(workflow_id)
    async for event in handle.fetch_history_events():
        payloads = event.workflow_execution_started_event_attributes.input.payloads
        try:
            value = json.loads(payloads[0].data) if payloads else {}
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def live_step(desc: Any) -> int | None:
    """The running segment's step, from its last heartbeat (finer than the workflow's view)."""
    steps = []
    for pending in desc.raw_description.pending_activities:
        for payload in pending.heartbeat_details.payloads:
            try:
                value = json.loads(payload.data)
            except ValueError:
                continue
            if isinstance(value, dict) and isinstance(value.get("step"), int):
                steps.append(value["step"])
    return max(steps) if steps else None
