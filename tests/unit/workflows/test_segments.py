"""Pure segment policy (``workflows.segments``): when a boundary starts a retention pass, and
what a segment lost on its warm worker's own queue carries when it is offered to every worker."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, RetryState, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

from activities.inputs import RunCarry, TrainingRunInput
from workflows import segments


def run_input(**retention: Any) -> TrainingRunInput:
    body: dict[str, Any] = {
        "run_id": "r",
        "config": {"seed": 1},
        "total_steps": 10,
        "store": "/tmp/x",
        "retention": retention or None,
    }
    return TrainingRunInput.model_validate(body)


def test_no_retention_never_collects() -> None:
    assert not segments.collect_due(run_input(), in_flight=False, since_last=None)


def test_a_pass_in_flight_is_never_joined_by_another() -> None:
    inp = run_input(keep_last=3, grace_seconds=3600)
    assert not segments.collect_due(inp, in_flight=True, since_last=None)
    assert not segments.collect_due(inp, in_flight=True, since_last=10_000.0)


@pytest.mark.parametrize(
    ("spec", "since", "due"),
    [
        ({"grace_seconds": 3600}, None, True),  # the first boundary of a run
        ({"grace_seconds": 3600}, 59.9, False),  # default pacing: min(60, grace)
        ({"grace_seconds": 3600}, 60.0, True),
        ({"grace_seconds": 5}, 4.0, False),  # a short grace paces by the grace
        ({"grace_seconds": 5}, 5.0, True),
        ({"grace_seconds": 3600, "every_seconds": 0}, 0.0, True),  # every boundary, as before
        ({"grace_seconds": 3600, "every_seconds": 600}, 599.0, False),
    ],
)
def test_paced_by_every_seconds(spec: dict[str, Any], since: float | None, due: bool) -> None:
    assert segments.collect_due(run_input(keep_last=3, **spec), in_flight=False, since_last=since) is due


def test_every_seconds_is_validated() -> None:
    with pytest.raises(ValueError, match="every_seconds"):
        run_input(keep_last=3, every_seconds=-1)


def test_auto_interval_stays_well_inside_the_segment_timeout() -> None:
    """A slow save and a short timeout: the interval (and the stretched segment) stay under
    half the timeout, so no attempt is killed by its own timeout before it reports."""
    from cairn.checkpoint_interval import IntervalState

    body: dict[str, Any] = {
        "run_id": "r",
        "config": {"seed": 1},
        "total_steps": 10**6,
        "store": "/tmp/x",
        "segment_timeout_seconds": 600,
        "checkpoint": {"every": "auto", "auto": {"max_seconds": None}},
    }
    inp = TrainingRunInput.model_validate(body)
    carry = RunCarry(interval=IntervalState())
    assert carry.interval is not None
    carry.interval.observe(inp.checkpoint.auto, saves=1, blocked_seconds=10.0, steps=1000, train_seconds=30.0)
    every, seconds = segments.checkpoint_every(inp, carry)
    assert every * 0.03 <= 300.0 and seconds is not None and seconds < 600 * 0.6
    assert carry.interval.choices[-1].bound == "max_seconds"


def activity_error(cause: BaseException, retry_state: RetryState) -> ActivityError:
    err = ActivityError(
        "activity failed",
        scheduled_event_id=5,
        started_event_id=6,
        identity="123@host",
        activity_type="train_segment",
        activity_id="7",
        retry_state=retry_state,
    )
    err.__cause__ = cause
    return err


def test_a_warm_segment_that_stopped_heartbeating_is_offered_to_everyone_with_its_reach() -> None:
    """Its holder froze (or died) on its own queue: the heartbeat timeout comes back to the workflow
    (``WARM_RETRY``: no retry on a queue only that worker polls), with the reach and attempt of its
    last heartbeat; the next attempt counts on from there."""
    timeout = ActivityTimeoutError(
        "activity Heartbeat timeout",
        type=TimeoutType.HEARTBEAT,
        last_heartbeat_details=[{"step": 37, "reached": 37, "attempt": 3}],
    )
    err = activity_error(timeout, RetryState.MAXIMUM_ATTEMPTS_REACHED)
    assert segments.lost_on_own_queue(err, reached=30, prior=2) == (37, 3)
    # It never heartbeated: it still counts, and the earlier reach is kept.
    silent = ActivityTimeoutError("timeout", type=TimeoutType.HEARTBEAT, last_heartbeat_details=[])
    assert segments.lost_on_own_queue(activity_error(silent, RetryState.MAXIMUM_ATTEMPTS_REACHED), 30, 2) == (30, 3)


def test_a_warm_segments_retryable_error_is_offered_to_everyone() -> None:
    storage = ApplicationError("S3 throttled", type="StorageError")
    assert segments.lost_on_own_queue(activity_error(storage, RetryState.MAXIMUM_ATTEMPTS_REACHED), None, 0) == (
        None,
        1,
    )


@pytest.mark.parametrize(
    ("cause", "state"),
    [
        (ApplicationError("bad", type="CheckpointCorruptError", non_retryable=True), RetryState.NON_RETRYABLE_FAILURE),
        (CancelledError("cancelled"), RetryState.CANCEL_REQUESTED),
    ],
    ids=["non-retryable", "cancelled"],
)
def test_a_final_failure_or_an_interruption_is_not_lost(cause: BaseException, state: RetryState) -> None:
    assert segments.lost_on_own_queue(activity_error(cause, state), 10, 0) is None


def test_warm_segments_are_not_retried_on_their_own_queue() -> None:
    assert segments.WARM_RETRY.maximum_attempts == 1
