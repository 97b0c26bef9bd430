"""How a TrainingRun plans its segments, and the retries and timeouts of its activities.

The run's length in updates, where the next segment ends (``segment.steps`` on, or on an
epoch boundary), what every segment activity is told and which task queue it goes to, and
the retry policies and timeouts the workflow starts its activities with; and which
activity failures are a segment that stopped on request rather than a failure.

Pure decisions for ``workflows.training_run``: no workflow calls, no I/O, no clock.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, RetryState, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.edge import INTERRUPTED, WORKER_CRASHED, as_application_error, heartbeat_reach
    from activities.inputs import DEFAULT_SEGMENT_SECONDS, GANG_SEGMENT_STEPS
    from cairn.checkpoint_interval import IntervalState
    from cairn.errors import ConfigError
    from cairn.numerics import profile_queue

if TYPE_CHECKING:
    from activities.inputs import RunCarry, TrainingRunInput

__all__ = [
    "SEGMENT_RETRY",
    "SHORT_RETRY",
    "BOOKKEEPING_TIMEOUT",
    "bookkeeping",
    "run_total",
    "segment_end",
    "segment_seconds",
    "WARM_PICKUP",
    "WARM_RETRY",
    "picked_up_late",
    "lost_attempt",
    "lost_on_own_queue",
    "crashed_on_own_queue",
    "collect_beside",
    "collect_due",
    "segment_fields",
    "checkpoint_every",
    "training_queue",
    "interrupted",
]

SEGMENT_RETRY = RetryPolicy(
    # The first retry of a lost segment starts at once (a crash is already a heartbeat timeout
    # late); repeated failures (storage trouble) back off to the 1 s below.
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    # A crashed segment is retried at most 1 s after its loss is detected, however often the
    # same segment has crashed: a longer backoff would delay recovery after repeated kills by
    # more than the restore itself takes. A retry costs one restore; storage trouble retries
    # at the same pace.
    maximum_interval=timedelta(seconds=1),
    maximum_attempts=0,  # unlimited: storage trouble heals; corrupt state is non-retryable
)
SHORT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10))
BOOKKEEPING_TIMEOUT = timedelta(minutes=10)
"""Start-to-close bound of listing/GC/journal activities; a dead worker is noticed sooner, by
their heartbeat timeout (they heartbeat from a background thread while they work)."""


def bookkeeping(inp: TrainingRunInput) -> dict[str, object]:
    """Timeouts and retries of the short activities (listing, GC, journal, open)."""
    return {
        "start_to_close_timeout": BOOKKEEPING_TIMEOUT,
        "heartbeat_timeout": timedelta(seconds=inp.heartbeat_timeout_seconds),
        "retry_policy": SHORT_RETRY,
    }


def run_total(inp: TrainingRunInput, carry: RunCarry) -> int:
    """The run's length in updates (``total_epochs`` resolves once the trainer said how
    many updates an epoch is; until then, 0)."""
    if inp.total_steps is not None:
        return inp.total_steps
    return carry.total_steps or 0


def segment_seconds(inp: TrainingRunInput) -> float | None:
    """The time budget of every segment: ``segment.seconds``, or the default when the input
    sizes segments in no other way (in-process runs only; a gang's segments are in steps)."""
    if inp.segment is not None:
        return inp.segment.seconds
    if inp.steps_per_segment is None and not inp.gang:
        return DEFAULT_SEGMENT_SECONDS
    return None


def segment_end(inp: TrainingRunInput, carry: RunCarry) -> int:
    """Where the next segment stops at the latest: ``segment.steps`` on, the end of the
    ``segment.epochs``-th epoch boundary from here (an interrupted epoch is finished first),
    or — for a segment sized in seconds — the run's end (its time budget stops it sooner)."""
    step, spe, seg = carry.step, carry.steps_per_epoch, inp.segment
    if segment_seconds(inp) is not None:
        return run_total(inp, carry)
    if seg is None:
        return step + (inp.steps_per_segment or GANG_SEGMENT_STEPS)
    if seg.steps is not None:
        return step + seg.steps
    assert seg.epochs is not None
    if not spe:
        raise as_application_error(
            ConfigError("segment.epochs: this worker's open_run did not report the epoch length; use segment.steps")
        )
    return (step // spe + seg.epochs) * spe


AUTO_TIMEOUT_SHARE = 0.5
"""``every: "auto"`` never picks an interval longer than this share of the segment timeout, so a
segment stretched to hold one interval still ends well inside its timeout."""


def checkpoint_every(inp: TrainingRunInput, carry: RunCarry) -> tuple[int, float | None]:
    """The next segment's checkpoint interval in steps — ``checkpoint.every``, or for ``"auto"``
    the choice from what the run measured (recorded in the carry when it changes) — and its
    time budget: a default time-sized segment is stretched to hold at least one interval."""
    seconds = segment_seconds(inp)
    if inp.checkpoint.every != "auto":
        return inp.checkpoint.every, seconds
    carry.interval = carry.interval or IntervalState()
    spec, cap = inp.checkpoint.auto, AUTO_TIMEOUT_SHARE * inp.segment_timeout_seconds
    if spec.max_seconds is None or spec.max_seconds > cap:  # a segment must end well inside its timeout
        spec = spec.model_copy(update={"max_seconds": cap})
    choice = carry.interval.choose(spec, carry.step)
    default = inp.segment is None and inp.steps_per_segment is None
    if default and seconds is not None and choice.step_seconds is not None:
        seconds = max(seconds, choice.every * choice.step_seconds * 1.1)
    return choice.every, seconds


def segment_fields(inp: TrainingRunInput, carry: RunCarry, target: int, resume_from: str | None) -> dict[str, Any]:
    """The ``SegmentInput`` fields of the next segment, in-process or as a gang."""
    every, seconds = checkpoint_every(inp, carry)
    return {
        "run_id": inp.run_id,
        "config": inp.config,
        "store": inp.store,
        "store_id": carry.store_id,
        "target_step": target,
        "resume_from": resume_from,
        "checkpoint_every": every,
        "throttle_seconds_per_step": inp.throttle_seconds_per_step,
        "heartbeat_every_seconds": min(0.1, inp.heartbeat_timeout_seconds / 4),
        "numerics_id": carry.numerics_id,
        "max_seconds": seconds,
        "incremental": inp.checkpoint.incremental,
        "compression": inp.checkpoint.compression,
    }


def training_queue(base: str, numerics_id: str | None) -> str:
    """Where training goes: the queue of the workers of the run's numerics profile (a run
    opened by an older worker, with no profile id, stays on the run's own queue ``base``)."""
    return base if numerics_id is None else profile_queue(base, numerics_id)


WARM_PICKUP = timedelta(seconds=1)
"""How long the worker that holds a run's state has to pick its next segment up from its own
queue (it long-polls that queue: milliseconds when alive and free) before the segment goes to
every worker of the run's queue (``picked_up_late``)."""


WARM_RETRY = RetryPolicy(maximum_attempts=1)
"""A segment offered to the warm worker's own queue is not retried there: a retry would go to a
queue only that worker polls, and a worker that stopped heartbeating (dead, frozen, stuck) may
still hold polls on it. Its retryable failure (a heartbeat timeout first of all) comes back to the
workflow, which offers the segment to every worker at once (``lost_on_own_queue``)."""


def picked_up_late(err: ActivityError) -> bool:
    """The segment offered to the warm worker's own queue was not picked up in ``WARM_PICKUP``
    (that worker is gone or busy): not a failure, the segment goes to the shared queue."""
    cause = err.cause
    return isinstance(cause, ActivityTimeoutError) and cause.type == TimeoutType.SCHEDULE_TO_START


def collect_beside(inp: TrainingRunInput) -> bool:
    """Retention may run beside the next segment only when its grace period outlasts any save
    that segment can have in flight (a segment's timeout bounds it); else it runs between."""
    return inp.retention is not None and inp.retention.grace_seconds >= inp.segment_timeout_seconds


DEFAULT_RETENTION_EVERY = 60.0
"""Seconds between retention passes beside the segments, unless the run says (or its grace is shorter)."""


def collect_due(inp: TrainingRunInput, in_flight: bool, since_last: float | None) -> bool:
    """Whether a segment boundary starts a retention pass beside the next segment: not while the
    last one runs (the boundary does not wait for it) and not sooner than ``every_seconds``
    after the last one started (``since_last``; None: none yet in this run)."""
    if inp.retention is None or in_flight:
        return False
    spec = inp.retention
    every = spec.every_seconds if spec.every_seconds is not None else min(DEFAULT_RETENTION_EVERY, spec.grace_seconds)
    return since_last is None or since_last >= every


def crashed_on_own_queue(err: ActivityError) -> tuple[int | None, int] | None:
    """(reached step, attempts) of a segment whose worker process died on the warm worker's own
    queue: its supervisor failed it non-retryable with its last heartbeat, so that it is offered
    to every worker at once (a retry there would wait on a queue only the dead process polled)."""
    cause = err.cause
    if not (isinstance(cause, ApplicationError) and cause.type == WORKER_CRASHED and cause.non_retryable):
        return None
    details = list(cause.details)
    attempt = details[0].get("attempt") if details and isinstance(details[0], dict) else None
    return heartbeat_reach(details), attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 1


def lost_attempt(err: ActivityError) -> tuple[int | None, int] | None:
    """(reached step, attempts) of a warm-queued segment that had started before it timed out
    waiting for a retry there (its last heartbeat says), or None when it never started."""
    details = getattr(err.cause, "last_heartbeat_details", None)
    if not details or not isinstance(details[0], dict):
        return None
    attempt = details[0].get("attempt")
    return heartbeat_reach(details), attempt if isinstance(attempt, int) and not isinstance(attempt, bool) else 1


def lost_on_own_queue(err: ActivityError, reached: int | None, prior: int) -> tuple[int | None, int] | None:
    """(reached step, attempts) of a segment offered under ``WARM_RETRY`` whose attempt failed in
    a way a retry would have followed (a heartbeat or start-to-close timeout, a retryable error),
    or None when its failure is final or an interruption. ``reached`` and ``prior`` are what the
    attempt was given: an attempt that never heartbeated still counts, and keeps the earlier reach."""
    if err.retry_state != RetryState.MAXIMUM_ATTEMPTS_REACHED:
        return None
    beat = lost_attempt(err)
    if beat is None:
        return reached, prior + 1
    reach, attempts = beat
    return max((r for r in (reach, reached) if r is not None), default=None), max(attempts, prior + 1)


def interrupted(err: ActivityError) -> bool:
    """The segment (or a gang's node) was cancelled, or stopped on request after committing
    (``INTERRUPTED``): not a failure."""
    cause = err.cause
    return isinstance(cause, CancelledError) or (isinstance(cause, ApplicationError) and cause.type == INTERRUPTED)
