"""How a TrainingRun retries a failed gang segment, and on how many ranks and nodes.

A gang segment is one ``train_gang_node`` activity per node. Any node's failure fails the
gang, which is retried whole — a fresh rendezvous — from the last commit, after a short
backoff. After ``ELASTIC_AFTER_FAILURES`` failed attempts in a row an elastic run
(``min_world_size``) goes on at half its world size; after ``GANG_ATTEMPTS_PER_RUN`` attempts
at one segment the run continues-as-new, so its history stays bounded.

Pure decisions for ``workflows.training_run``: no workflow calls, no I/O, no clock.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

__all__ = [
    "ELASTIC_AFTER_FAILURES",
    "GANG_ATTEMPTS_PER_RUN",
    "NODE_RETRY",
    "rendezvous_id",
    "retry_delay",
    "out_of_attempts",
    "shrunk",
    "non_retryable",
    "furthest_reach",
    "carried_reach",
]

ELASTIC_AFTER_FAILURES = 2
"""Failed gang attempts in a row after which an elastic run (``min_world_size``) halves its world size."""
GANG_ATTEMPTS_PER_RUN = 20
"""Gang attempts at one segment before the run continues-as-new (each costs ~20 history events)."""
NODE_RETRY = RetryPolicy(maximum_attempts=1)
"""A node's activity is never retried alone: the gang is retried whole."""


def rendezvous_id(run_id: str, target: int, attempt: int, workflow_run_id: str) -> str:
    """The c10d rendezvous id of one gang attempt: fresh for every attempt and every run."""
    return f"{run_id}-{target}-{attempt}-{workflow_run_id[:8]}"


def retry_delay(attempt: int) -> timedelta:
    """The pause before the gang's next attempt: 200 ms, doubling, at most 1 s."""
    return timedelta(milliseconds=min(1000, 200 * 2 ** (attempt - 1)))


def out_of_attempts(attempt: int) -> bool:
    """This run made as many gang attempts at the segment as it may: continue as new."""
    return attempt >= GANG_ATTEMPTS_PER_RUN


def shrunk(world: int, nodes: list[str], failures: int, min_world_size: int | None) -> tuple[int, list[str]] | None:
    """The world size and nodes an elastic run goes on with after ``failures`` failed attempts
    in a row: half the ranks, on the first half of its nodes; None to keep the gang as it is.

    Any world size dividing the microbatches gives the same bits, so the run goes on from its
    last commit unchanged.
    """
    if min_world_size is not None and failures >= ELASTIC_AFTER_FAILURES and world // 2 >= min_world_size:
        return world // 2, nodes[: max(1, len(nodes) // 2)] if len(nodes) > 1 else list(nodes)
    return None


def non_retryable(failures: list[ActivityError]) -> ActivityError | None:
    """The first failure that must fail the run (retrying the gang would fail the same way)."""
    for err in failures:
        if isinstance(err.cause, ApplicationError) and err.cause.non_retryable:
            return err
    return None


def furthest_reach(failures: list[ActivityError]) -> int:
    """How far the failed attempt got: the furthest step its nodes reported, in their failure
    or their last heartbeat (-1: unknown)."""
    reached = -1
    for err in failures:
        cause = err.cause
        details: object = None
        if isinstance(cause, ApplicationError) and cause.details:
            details = cause.details[0]
        elif isinstance(cause, ActivityTimeoutError) and cause.last_heartbeat_details:
            details = cause.last_heartbeat_details[0]
        if isinstance(details, dict) and isinstance(details.get("reached"), int):
            reached = max(reached, details["reached"])
    return reached


def carried_reach(reached: int | None, attempt_reach: int) -> int | None:
    """The furthest step any attempt at this segment reached, told to the next attempt (for
    its recomputed steps)."""
    return max(reached or 0, attempt_reach) if attempt_reach >= 0 else reached
