"""The TrainingRun workflow: deterministic orchestration of a durable training run.

It drives training as a sequence of ``train_segment`` activities and holds only references
(store URL, checkpoint reference, fingerprint) — never arrays. Every segment resumes from the
run's last committed checkpoint, so a lost worker costs at most the steps since that commit.

Control: query ``progress``; signals ``pause``, ``resume``, ``stop`` (graceful: checkpoint now,
then finish) and ``checkpoint_now``. Pause, stop and checkpoint-now interrupt the running
segment by cancelling it; the activity commits a checkpoint at its current step before it
reports back. Cancelling the workflow does the same before the run ends. After
``segments_per_run`` segments (or when the server suggests it) the run continues-as-new, so
history stays bounded however long the run is.

Failing fast: an input that does not validate fails the run at once (a non-retryable
``ConfigError``); so does any non-retryable activity error (a corrupt checkpoint, another store,
another workflow on the run id). Every activity finishes in seconds or heartbeats, so a worker
killed inside any of them is noticed within ``heartbeat_timeout_seconds``.

This module owns the orchestration; its pure decisions live beside it: ``workflows.segments``
(planning, retries, timeouts, warm routing), ``workflows.gang_policy`` (gang retries, elastic
world size) and ``workflows.run_state`` (the carry, progress and summary).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, CancelledError, RetryState
from temporalio.workflow import ContinueAsNewError

with workflow.unsafe.imports_passed_through():  # the workflow's pure policy modules too: imported once, not per run
    from activities.effects import publish_checkpoint, record_decision, release_capacity, reserve_capacity
    from activities.inputs import (
        CollectInput,
        DecisionInput,
        EffectInput,
        EffectReceipt,
        LatestCheckpointInput,
        LatestCheckpointResult,
        OpenRunInput,
        OpenRunResult,
        RunCarry,
        RunInfo,
        TrainingRunInput,
        TrainSegmentInput,
        TrainSegmentResult,
    )
    from activities.tracker_models import TrackInput, TrackResult
    from activities.trackers import export_trackers
    from activities.training import collect_checkpoints, latest_checkpoint, open_run, train_segment
    from activities.views import RunProgress, RunSummary
    from workflows import run_state, segments
    from workflows.gang_segments import GangSegments

__all__ = ["TrainingRun"]


SIGNALS_DURING_OPEN = "keep-pause-and-stop-signalled-while-opening"
"""The patch marker under which a pause or stop signalled before ``open_run`` returned is kept."""
WARM_ROUTING = "offer-the-next-segment-to-the-warm-worker"
"""The patch marker under which a segment is first offered to the worker holding the run."""
COLLECT_BESIDE = "collect-checkpoints-beside-the-next-segment"
"""The patch marker under which retention runs beside the next segment, not before it."""
COLLECT_PACED = "collect-checkpoints-paced-beside-the-segments"
"""The patch marker under which a boundary does not wait for the last pass (``segments.collect_due``)."""
WARM_NOT_RETRIED = "a-warm-segment-is-not-retried-on-its-own-queue"
"""The patch marker under which a segment lost on the warm worker's own queue is offered to every
worker at once (``segments.WARM_RETRY``), not retried on that queue first."""
EXPORT_TRACKERS = "export-trackers-beside-the-segments"
"""The patch marker under which a run's trackers are fed beside its segments and at its end."""
REPLAY_AFTER_ROLLBACK = "after-a-rollback-each-segment-resumes-from-the-previous-commit"
"""The patch marker under which the segments after a rollback resume from their predecessor's
commit until the run is back where it was (``run_state.replay_resume``), not from the run's
pre-rollback latest commit (past their target: it failed the run)."""
AWAIT_LEFT_EXPORT = "await-the-cancelled-tracker-export-before-continue-as-new"
"""The patch marker under which an export beside the segments is started to be waited for when
cancelled, and continue-as-new waits for it (the next run's first export never meets it)."""


def _ended_by_cancel(err: ActivityError) -> bool:
    """The activity ended because it was cancelled: it stopped (``CancelledError``), or its last
    attempt timed out or failed after the cancel was requested (it is not retried then)."""
    return isinstance(err.cause, CancelledError) or err.retry_state == RetryState.CANCEL_REQUESTED


@workflow.defn(name="TrainingRun")
class TrainingRun(GangSegments):
    def __init__(self) -> None:
        self._inp: TrainingRunInput | None = None
        self._carry = RunCarry()
        self._phase = "starting"
        self._checkpoint_now = False
        self._rollback_to: int | None = None
        self._collect_started: datetime | None = None  # the last retention pass beside the segments
        self._tracking: workflow.ActivityHandle[TrackResult] | None = None  # the export beside the segments
        self._tracking_awaited = False  # it was started under AWAIT_LEFT_EXPORT

    # -- control ------------------------------------------------------------------------------
    @workflow.query
    def progress(self) -> RunProgress:
        return run_state.progress(self._inp, self._carry, self._phase)

    @workflow.query
    def info(self) -> RunInfo:
        return run_state.info(self._inp)

    @workflow.signal
    def rollback(self, step: int) -> None:
        """Restore training to the committed checkpoint at ``step`` and continue from there.
        External effects are not undone: the journal records that."""
        self._rollback_to = step

    @workflow.signal
    def pause(self) -> None:
        """Checkpoint the running segment and wait for ``resume``."""
        self._carry.paused = True

    @workflow.signal
    def resume(self) -> None:
        self._carry.paused = False

    @workflow.signal
    def stop(self) -> None:
        """Graceful stop: checkpoint now, then finish with the current state."""
        self._carry.stop_requested = True

    @workflow.signal
    def checkpoint_now(self) -> None:
        """Commit a checkpoint at the current step, then carry on."""
        self._checkpoint_now = True

    def _interrupt_requested(self) -> bool:
        return self._carry.paused or self._carry.stop_requested or self._checkpoint_now or self._rollback_to is not None

    # -- the run --------------------------------------------------------------------------------
    @workflow.run
    async def run(self, inp: TrainingRunInput) -> RunSummary:
        self._inp = inp
        if inp.carry is not None:
            self._carry = inp.carry.model_copy(deep=True)
        else:
            await self._open_run(inp)
        if inp.effects is not None and self._carry.reservation is None:
            self._carry.reservation = await self._effect(reserve_capacity, "reserve", inp)
            self._carry.effects["reserve"] = self._carry.reservation.receipt
        try:
            await self._train(inp)
        except ContinueAsNewError:
            raise  # the reservation travels in the carry; nothing to compensate
        except asyncio.CancelledError:
            # Cancelled: the running segment already checkpointed; compensate, then stop.
            self._phase = "cancelled"
            await self._release(inp, reason="cancelled")
            raise
        except ActivityError as err:
            if not isinstance(err.cause, CancelledError):
                self._phase = "failed"
                await self._release(inp, reason="failed")
                raise
            # The workflow was cancelled while a bookkeeping activity ran (it was cancelled with
            # it): the same as above, and the run ends CANCELED, not failed.
            self._phase = "cancelled"
            await self._release(inp, reason="cancelled")
            raise asyncio.CancelledError() from err
        except Exception:
            self._phase = "failed"
            await self._release(inp, reason="failed")
            raise
        if inp.effects is not None and self._carry.step >= segments.run_total(inp, self._carry):
            receipt = await self._effect(publish_checkpoint, "publish", inp)
            self._carry.effects["publish"] = receipt.receipt
        await self._release(inp, reason="completed")
        self._phase = "finished"
        return run_state.summary(inp, self._carry)

    async def _train(self, inp: TrainingRunInput) -> None:
        segments_this_run = 0
        collecting: workflow.ActivityHandle[int] | None = None
        while (
            self._carry.step < segments.run_total(inp, self._carry) or self._rollback_to is not None
        ) and not self._carry.stop_requested:
            if self._carry.paused:
                self._phase = "paused"
                await workflow.wait_condition(lambda: not self._carry.paused or self._carry.stop_requested)
                continue
            if self._rollback_to is not None:  # retention first: it may delete the rollback's target
                collecting = await self._collected(collecting)
                await self._apply_rollback(inp)
                continue
            if segments_this_run >= inp.segments_per_run or workflow.info().is_continue_as_new_suggested():
                collecting = await self._collected(collecting)
                await self._leave_tracking()
                self._continue_as_new(inp)
            self._phase = "training"
            await self._run_segment(inp)
            segments_this_run += 1
            if inp.retention is not None:  # it never deletes the latest commit nor a save in flight
                collecting = await self._collect(inp, collecting)
            await self._track(inp)
        await self._collected(collecting)
        if self._carry.checkpoint is None:  # total_steps == 0: the origin is the result
            await self._run_segment(inp, target=0)
        await self._track(inp, final=True)

    def _tracking_on(self, inp: TrainingRunInput) -> bool:
        return bool(inp.trackers) and workflow.patched(EXPORT_TRACKERS)

    async def _track(self, inp: TrainingRunInput, final: bool = False) -> None:
        """Feed the trackers what is committed: beside the next segment, one export at a time
        (a boundary never waits for one; the next export catches up), and at the end, awaited.
        An export that failed for good fails the run here; a sink that is down only delays."""
        if not self._tracking_on(inp):
            return
        running = self._tracking
        if running is not None and (final or running.done()):
            self._tracking = None
            await running
        elif running is not None:
            return
        track = TrackInput(
            run_id=inp.run_id, store=inp.store, store_id=self._carry.store_id, trackers=inp.trackers, final=final
        )
        if final:
            await workflow.start_activity(export_trackers, track, **segments.bookkeeping(inp))
            return
        options = segments.bookkeeping(inp)
        self._tracking_awaited = workflow.patched(AWAIT_LEFT_EXPORT)
        if self._tracking_awaited:  # cancelled, it resolves once the export has stopped
            options["cancellation_type"] = workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED
        self._tracking = workflow.start_activity(export_trackers, track, **options)

    async def _leave_tracking(self) -> None:
        """Before continue-as-new: an export still running is cancelled, and the run waits until
        it has stopped (it stops before its next sink write): the next run's first export takes
        over from the sinks' cursors and never meets it. An export that failed for good fails the
        run here, as in ``_track``. (Histories from before ``AWAIT_LEFT_EXPORT``: not awaited.)"""
        running, self._tracking = self._tracking, None
        if running is None:
            return
        if not self._tracking_awaited:
            if not running.done():
                running.cancel()
            return
        running.cancel()
        try:
            await running
        except ActivityError as err:
            if not _ended_by_cancel(err):
                raise

    async def _collect(
        self, inp: TrainingRunInput, collecting: workflow.ActivityHandle[int] | None
    ) -> workflow.ActivityHandle[int] | None:
        """Retention after a segment: beside the next one, paced (``segments.collect_due``: the
        boundary never waits for it), or between segments when its grace is short."""
        paced = segments.collect_beside(inp) and workflow.patched(COLLECT_PACED)
        if paced:
            if collecting is not None and collecting.done():
                await collecting  # a pass that failed fails the run here, as between segments
            last = self._collect_started
            since = None if last is None else (workflow.now() - last).total_seconds()
            if not segments.collect_due(inp, collecting is not None and not collecting.done(), since):
                return collecting
            self._collect_started = workflow.now()
        else:
            collecting = await self._collected(collecting)
        beside = paced or (segments.collect_beside(inp) and workflow.patched(COLLECT_BESIDE))
        assert inp.retention is not None
        gc = workflow.start_activity(
            collect_checkpoints,
            CollectInput(run_id=inp.run_id, store=inp.store, store_id=self._carry.store_id, retention=inp.retention),
            **segments.bookkeeping(inp),
        )
        return gc if beside else await self._collected(gc)

    @staticmethod
    async def _collected(collecting: workflow.ActivityHandle[int] | None) -> None:  # the pass beside the last segment
        _ = collecting is not None and await collecting

    async def _effect(self, fn: object, activity_id: str, inp: TrainingRunInput, **extra: object) -> EffectReceipt:
        """Run an effect activity under a fixed activity id: its idempotency key is
        (workflow id, activity id), the same for every attempt and across continue-as-new."""
        assert inp.effects is not None
        receipt: EffectReceipt = await workflow.execute_activity(
            fn,  # type: ignore[arg-type]
            EffectInput(
                run_id=inp.run_id,
                store=inp.store,
                store_id=self._carry.store_id,
                effects=inp.effects,
                checkpoint=self._carry.checkpoint,
                fingerprint=self._carry.fingerprint,
                reservation_id=self._carry.reservation.receipt if self._carry.reservation else None,
                **extra,  # type: ignore[arg-type]
            ),
            activity_id=activity_id,
            start_to_close_timeout=timedelta(seconds=inp.effects.timeout_seconds),
            retry_policy=segments.SHORT_RETRY,
        )
        return receipt

    async def _release(self, inp: TrainingRunInput, reason: str) -> None:
        if inp.effects is None or self._carry.reservation is None or "release" in self._carry.effects:
            return
        receipt = await self._effect(release_capacity, "release", inp, reason=reason)
        self._carry.effects["release"] = receipt.receipt

    async def _apply_rollback(self, inp: TrainingRunInput) -> None:
        wanted = self._rollback_to
        self._rollback_to = None
        assert wanted is not None
        found: LatestCheckpointResult = await workflow.execute_activity(
            latest_checkpoint,
            LatestCheckpointInput(
                run_id=inp.run_id,
                store=inp.store,
                store_id=self._carry.store_id,
                at_or_before=min(wanted, self._carry.step),
            ),
            **segments.bookkeeping(inp),
        )
        detail = run_state.rollback_detail(self._carry, wanted, found)
        await workflow.execute_activity(
            record_decision,
            DecisionInput(
                run_id=inp.run_id, store=inp.store, store_id=self._carry.store_id, decision="rollback", detail=detail
            ),
            activity_id=f"rollback-{self._carry.rollbacks}",
            **segments.bookkeeping(inp),
        )
        run_state.roll_back(self._carry, found)

    async def _open_run(self, inp: TrainingRunInput) -> None:
        """Claim the run id for this workflow, record the store's identity, and adopt the last
        durable cursor: a run id that already has committed checkpoints continues from the
        latest one (e.g. a workflow restarted after it was terminated), never from scratch."""
        latest: OpenRunResult = await workflow.execute_activity(
            open_run,
            OpenRunInput(
                run_id=inp.run_id,
                store=inp.store,
                workflow_id=workflow.info().workflow_id,
                config=inp.config,
                numerics=inp.numerics,
            ),
            activity_id="open-run",
            **segments.bookkeeping(inp),
        )
        requested = self._carry
        self._carry = run_state.opened(latest)
        if workflow.patched(SIGNALS_DURING_OPEN):  # histories recorded before it: the requests were dropped
            self._carry.paused, self._carry.stop_requested = requested.paused, requested.stop_requested
        run_state.adopt_length(self._carry, inp, latest)

    def _continue_as_new(self, inp: TrainingRunInput) -> None:
        carry = self._carry.model_copy(update={"continued_as_new": self._carry.continued_as_new + 1})
        workflow.continue_as_new(inp.model_copy(update={"carry": carry}))

    def _training_queue(self) -> str:
        return segments.training_queue(workflow.info().task_queue, self._carry.numerics_id)

    async def _run_segment(self, inp: TrainingRunInput, target: int | None = None) -> None:
        if target is None:
            target = min(segments.segment_end(inp, self._carry), segments.run_total(inp, self._carry))
        if inp.gang:
            await self._run_gang_segment(inp, target)
            return
        self._checkpoint_now = False
        resume_from, self._carry.resume_from = self._carry.resume_from, None
        resume_from = resume_from or self._replay_resume()
        warm = self._carry.warm_queue if resume_from is None and workflow.patched(WARM_ROUTING) else None
        self._carry.warm_queue = None  # offered once: a segment it does not take goes to everyone
        (reached, prior), self._carry.lost = self._carry.lost or (None, 0), None
        reoffer = warm is not None and workflow.patched(WARM_NOT_RETRIED)
        handle = workflow.start_activity(
            train_segment,
            TrainSegmentInput(
                **segments.segment_fields(inp, self._carry, target, resume_from),
                async_save=inp.checkpoint.mode == "async",
                reached_before=reached,
                prior_attempts=prior,
                final=target >= segments.run_total(inp, self._carry),
            ),
            task_queue=warm or self._training_queue(),
            schedule_to_start_timeout=segments.WARM_PICKUP if warm else None,
            start_to_close_timeout=timedelta(seconds=inp.segment_timeout_seconds),
            heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_seconds),
            retry_policy=segments.WARM_RETRY if reoffer else segments.SEGMENT_RETRY,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        lost = (reached, prior) if reoffer else None
        try:
            await workflow.wait_condition(lambda: handle.done() or self._interrupt_requested())
        except asyncio.CancelledError:
            # The workflow is being cancelled: let the segment checkpoint before we stop.
            handle.cancel()
            await self._settle(inp, handle, lost)
            raise
        if not handle.done():
            self._phase = "stopping" if self._carry.stop_requested else "training"
            handle.cancel()
        await self._settle(inp, handle, lost)

    def _replay_resume(self) -> str | None:
        """While a rollback replays: the previous segment's commit (``run_state.replay_resume``)."""
        if self._carry.replay_until is None or not workflow.patched(REPLAY_AFTER_ROLLBACK):
            return None
        return run_state.replay_resume(self._carry)

    async def _settle(
        self,
        inp: TrainingRunInput,
        handle: workflow.ActivityHandle[TrainSegmentResult],
        lost: tuple[int | None, int] | None = None,
    ) -> None:
        """Record the segment's outcome; after an interruption, read the last durable cursor.
        ``lost``: the segment was offered to the warm worker's own queue under ``WARM_RETRY``,
        with this reach and these prior attempts."""
        try:
            result = await handle
        except ActivityError as err:
            if segments.picked_up_late(err):  # the warm worker did not take it: re-offered to every worker
                self._carry.lost = segments.lost_attempt(err)
                return
            crashed = segments.crashed_on_own_queue(err)
            if crashed is not None:  # the warm worker's process died: offered to every worker at once
                self._carry.lost = crashed
                return
            gone = None if lost is None else segments.lost_on_own_queue(err, *lost)
            if gone is not None:  # it stopped heartbeating (or failed retryably) there: offered to every worker
                self._carry.lost = gone
                return
            if not segments.interrupted(err):
                raise
            await self._record_interruption(inp, err.cause)
            return
        run_state.record_result(self._carry, result, inp)

    async def _record_interruption(self, inp: TrainingRunInput, cause: BaseException | None) -> None:
        """Interrupted (pause/stop/checkpoint-now/cancel): it committed before reporting.
        After a rollback "latest" may be a checkpoint from before the rollback; training is
        deterministic, so it holds the very state the replay would have reached."""
        latest: LatestCheckpointResult = await workflow.execute_activity(
            latest_checkpoint,
            LatestCheckpointInput(run_id=inp.run_id, store=inp.store, store_id=self._carry.store_id),
            **segments.bookkeeping(inp),
        )
        run_state.record_interruption(self._carry, latest, cause)
