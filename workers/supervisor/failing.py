"""Failing the attempts a dead worker process left running, through Temporal's async-completion
API: each is failed by its task token with a retryable ``WorkerCrashed`` error, so Temporal
retries it now instead of when its heartbeat timeout expires.

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
from typing import Literal

from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from workers.supervisor.channel import ActivityReport

__all__ = ["WORKER_CRASHED", "FailOutcome", "fail_attempts"]

WORKER_CRASHED = "WorkerCrashed"
"""Error type of an attempt its supervisor failed because the worker process running it died."""
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
    error = ApplicationError(
        f"the worker process running this attempt died ({cause}); its supervisor failed the attempt so that "
        "it is retried now",
        type=WORKER_CRASHED,
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
