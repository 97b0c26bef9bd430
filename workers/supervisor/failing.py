"""Failing the attempts a dead worker process left running, through Temporal's async-completion
API: each is failed by its task token with a ``WorkerCrashed`` error, so Temporal retries it now
instead of when its heartbeat timeout expires. An attempt taken from the dead worker's own queue
(a warm segment: only that process polled it) is failed non-retryable, with its last heartbeat
(how far it got, its attempt) as the error's details: the workflow offers it to every worker at
once (``workflows.segments.crashed_on_own_queue``), instead of a retry waiting on a queue nobody
polls. The workflow's sticky queue is reset first, so the workflow task that reacts does not wait
on the dead process's sticky queue either.

The server decides what a fail can still change: an attempt whose outcome it already holds
(completed, failed, timed out, or superseded by a later attempt) refuses it with NOT_FOUND,
which is counted, not reported as a problem.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.edge import WORKER_CRASHED
from activities.inputs import OWN_QUEUE_MARK
from workers.supervisor.channel import ActivityReport

__all__ = ["WORKER_CRASHED", "FailOutcome", "fail_attempts"]

FAIL_TIMEOUT = timedelta(seconds=5)
log = logging.getLogger("cairn.supervisor")


@dataclass
class FailOutcome:
    failed: list[ActivityReport] = field(default_factory=list)
    already_finished: list[ActivityReport] = field(default_factory=list)
    not_reached: list[ActivityReport] = field(default_factory=list)
    """Attempts the server could not be told about: their heartbeat timeout catches them."""

    def summary(self) -> str:
        """One clause per kind of answer, e.g. ``failed train_segment of run-1 (attempt 2) as WorkerCrashed``."""

        def names(attempts: list[ActivityReport]) -> str:
            return ", ".join(a.describe() for a in attempts)

        parts = []
        if self.failed:
            parts.append(f"failed {names(self.failed)} as {WORKER_CRASHED}")
        if self.already_finished:
            parts.append(f"{names(self.already_finished)} had already finished (the server refused the fail)")
        if self.not_reached:
            parts.append(f"could not fail {names(self.not_reached)} (left to the heartbeat timeout)")
        return "; ".join(parts) or "no activity was running"


async def fail_attempts(client: Client | None, attempts: Sequence[ActivityReport], cause: str) -> FailOutcome:
    """Fail every attempt in ``attempts`` (concurrently); ``cause`` says how the process died."""
    outcome = FailOutcome()
    if client is None:
        outcome.not_reached.extend(attempts)
        return outcome
    results = await asyncio.gather(*(_fail_one(client, a, cause) for a in attempts))
    for attempt, result in zip(attempts, results, strict=True):
        if result == "failed":
            outcome.failed.append(attempt)
        elif result == "finished":
            outcome.already_finished.append(attempt)
        else:
            outcome.not_reached.append(attempt)
    return outcome


async def _fail_one(client: Client, attempt: ActivityReport, cause: str) -> Literal["failed", "finished", "error"]:
    own = OWN_QUEUE_MARK in attempt.task_queue
    details = await _last_heartbeat(client, attempt) if own else None
    await _reset_sticky(client, attempt)
    error = ApplicationError(
        f"the worker process running this attempt died ({cause}); its supervisor failed the attempt so that "
        + ("every worker is offered it now" if own else "it is retried now"),
        *([details] if details is not None else []),
        type=WORKER_CRASHED,
        non_retryable=own,
    )
    handle = client.get_async_activity_handle(task_token=attempt.task_token)
    try:
        await asyncio.wait_for(handle.fail(error, rpc_timeout=FAIL_TIMEOUT), timeout=2 * FAIL_TIMEOUT.total_seconds())
    except TimeoutError:
        log.warning("could not fail %s: no answer from Temporal (its heartbeat timeout will)", attempt.describe())
        return "error"
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            log.debug("%s had already finished: %s", attempt.describe(), exc.message)
            return "finished"
        log.warning("could not fail %s: %s (its heartbeat timeout will)", attempt.describe(), exc.message)
        return "error"
    return "failed"


async def _last_heartbeat(client: Client, attempt: ActivityReport) -> dict[str, Any] | None:
    """The last heartbeat the server holds of this attempt's activity (its step and attempt), if any."""
    if not attempt.workflow_id or not attempt.workflow_run_id:
        return None
    try:
        handle = client.get_workflow_handle(attempt.workflow_id, run_id=attempt.workflow_run_id or None)
        desc = await asyncio.wait_for(handle.describe(), timeout=FAIL_TIMEOUT.total_seconds())
    except (RPCError, TimeoutError) as exc:
        log.debug("no heartbeat of %s: %s", attempt.describe(), exc)
        return None
    for pending in desc.raw_description.pending_activities:
        if pending.activity_type.name != attempt.activity_type or not pending.heartbeat_details.payloads:
            continue
        decoded = await client.data_converter.decode(pending.heartbeat_details.payloads)
        if decoded and isinstance(decoded[0], dict):
            return {**decoded[0], "attempt": decoded[0].get("attempt", attempt.attempt)}
    return None


async def _reset_sticky(client: Client, attempt: ActivityReport) -> None:
    """Send the workflow's next task to its normal queue: the dead process may have held its sticky one."""
    if not attempt.workflow_id or not attempt.workflow_run_id:
        return
    request = ResetStickyTaskQueueRequest(
        namespace=client.namespace,
        execution=WorkflowExecution(workflow_id=attempt.workflow_id, run_id=attempt.workflow_run_id),
    )
    try:
        await client.workflow_service.reset_sticky_task_queue(request, timeout=FAIL_TIMEOUT)
    except RPCError as exc:  # a workflow that has closed: nothing to reset
        log.debug("could not reset the sticky queue of %s: %s", attempt.describe(), exc.message)
