"""Training activities: thin adapters from Temporal to ``cairn``.

``train_segment`` resumes from the run's last durable cursor — the latest committed
checkpoint in the store, never the segment's start or anything in memory — trains up to the
segment's target step, committing checkpoints under absolute-step idempotency keys, and
heartbeats its progress. A retried attempt (on this or another worker) does the same, so it
converges on the same committed checkpoints; a stale attempt that is still running commits
identical bytes (or is caught by the fingerprint check if the run were non-deterministic).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, CancelledError

from activities import faults
from activities.models import (
    CollectInput,
    LatestCheckpointInput,
    LatestCheckpointResult,
    TrainSegmentInput,
    TrainSegmentResult,
)
from cairn.checkpoint import CheckpointKind, CheckpointRef, latest_committed, list_checkpoints, read_manifest
from cairn.checkpoint.format import CommitResult
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage
from cairn.errors import CairnError, StorageError
from cairn.session import TrainingSession
from cairn.state import TrainState
from cairn.stores import open_store

__all__ = ["train_segment", "latest_checkpoint", "collect_checkpoints", "TRAINING_ACTIVITIES", "as_application_error"]


def as_application_error(exc: CairnError) -> ApplicationError:
    """Corrupt or incompatible state never heals on retry; storage trouble may."""
    return ApplicationError(str(exc), type=exc.type_name, non_retryable=not exc.retryable)


@contextmanager
def activity_errors() -> Iterator[None]:
    try:
        yield
    except CairnError as exc:
        raise as_application_error(exc) from exc


class _Heartbeater:
    """Heartbeats (step, last committed checkpoint) at most every ``interval`` seconds,
    and at once whenever a checkpoint commits."""

    def __init__(self, interval: float, resumed: int, attempt: int) -> None:
        self.interval = interval
        self.last = 0.0
        self.details: dict[str, Any] = {"step": resumed, "checkpoint": None, "attempt": attempt, "loss": None}

    def beat(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.interval:
            self.last = now
            activity.heartbeat(dict(self.details))


def _previous_reach(info: activity.Info) -> int | None:
    """The step a previous attempt had reached, from its last heartbeat."""
    details = info.heartbeat_details
    if not details:
        return None
    first = details[0]
    if isinstance(first, dict) and isinstance(first.get("step"), int):
        return int(first["step"])
    return None


@activity.defn(name="train_segment")
def train_segment(inp: TrainSegmentInput) -> TrainSegmentResult:
    info = activity.info()
    # Cancellation (pause, stop, checkpoint-now, workflow cancel) and worker shutdown must not
    # interrupt a step or a commit halfway: defer the SDK's in-thread exception, poll instead,
    # commit a checkpoint at the current step, then report.
    with activity.shield_thread_cancel_exception(), activity_errors():
        result, why = _train_segment(inp, info)
    if why == "worker-shutdown":
        raise ApplicationError(
            f"worker shutting down at step {result.step} (checkpoint {result.checkpoint} committed)",
            type="WorkerShutdown",
        )
    if why == "cancelled":
        raise CancelledError(f"segment cancelled at step {result.step} after committing {result.checkpoint}")
    return result


def _train_segment(inp: TrainSegmentInput, info: activity.Info) -> tuple[TrainSegmentResult, str]:
    store = open_store(inp.store)
    if inp.resume_from is not None:  # a rollback: this older checkpoint, not the latest
        session = TrainingSession.fresh(inp.run_id, store, inp.config)
        session.restore(CheckpointRef.parse(inp.resume_from))
    else:
        session = TrainingSession.resume_latest(inp.run_id, store, inp.config)
    resumed = session.state.step
    reached_before = _previous_reach(info)
    recomputed = max(0, (reached_before or 0) - resumed) if info.attempt > 1 else 0
    if resumed > inp.target_step:
        raise ApplicationError(
            f"latest committed step {resumed} is past this segment's target {inp.target_step}",
            type="InvariantError",
            non_retryable=True,
        )
    beats = _Heartbeater(inp.heartbeat_every_seconds, resumed, info.attempt)
    if resumed == 0:
        session.checkpoint()  # step 0 is a checkpoint too: the run's origin is durable
    beats.details["checkpoint"] = str(session.durable_ref) if session.durable_ref else None
    beats.beat(force=True)
    interrupted = ""

    def on_step(state: TrainState) -> bool:
        nonlocal interrupted
        beats.details["step"] = state.step
        beats.details["loss"] = state.history["loss"][-1]
        faults.maybe_crash("mid-segment", step=state.step)
        if inp.throttle_seconds_per_step:
            time.sleep(inp.throttle_seconds_per_step)
        beats.beat()
        if activity.is_cancelled():
            interrupted = "cancelled"
        elif activity.is_worker_shutdown():
            interrupted = "worker-shutdown"
        return bool(interrupted)

    def on_checkpoint(result: CommitResult) -> None:
        beats.details["checkpoint"] = str(result.ref)
        beats.beat(force=True)

    last = session.run(
        inp.target_step - resumed,
        checkpoint_every=inp.checkpoint_every,
        async_save=inp.async_save,
        on_step=on_step,
        on_checkpoint=on_checkpoint,
    )
    assert last is not None
    beats.beat(force=True)
    state = session.state
    result = TrainSegmentResult(
        step=state.step,
        cursor=state.cursor,
        checkpoint=str(last.ref),
        fingerprint=last.manifest.fingerprint,
        loss=state.history["loss"][-1] if state.history["loss"] else None,
        attempt=info.attempt,
        resumed_from_step=resumed,
        recomputed_steps=recomputed,
        stopped_early=bool(interrupted),
    )
    return result, interrupted


@activity.defn(name="latest_checkpoint")
def latest_checkpoint(inp: LatestCheckpointInput) -> LatestCheckpointResult:
    """The run's last durable cursor (after an interrupted segment)."""
    with activity_errors():
        store = open_store(inp.store)
        if inp.at_or_before is None:
            ref = latest_committed(store, inp.run_id)
        else:
            refs = [
                r for r in list_checkpoints(store, inp.run_id, CheckpointKind.TRAINING) if r.step <= inp.at_or_before
            ]
            ref = refs[-1] if refs else None
        if ref is None:
            return LatestCheckpointResult(checkpoint=None, step=0, fingerprint=None)
        manifest = read_manifest(store, ref, expect_kind=None)
        return LatestCheckpointResult(checkpoint=str(ref), step=ref.step, fingerprint=manifest.fingerprint)


@activity.defn(name="collect_checkpoints")
def collect_checkpoints(inp: CollectInput) -> int:
    """Apply retention; returns how many checkpoints were deleted."""
    with activity_errors():
        spec = inp.retention
        policy = RetentionPolicy(keep_last=spec.keep_last, keep_every=spec.keep_every, grace_seconds=spec.grace_seconds)
        return len(collect_garbage(open_store(inp.store), inp.run_id, policy).delete)


TRAINING_ACTIVITIES = [train_segment, latest_checkpoint, collect_checkpoints]
