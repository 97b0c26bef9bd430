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

Failing fast: an input that does not validate fails the run at once (the data converter turns
it into a non-retryable ``ConfigError``); so does any non-retryable activity error (a corrupt
checkpoint, another store than the run's, another workflow on the same run id). Every
activity either finishes in seconds or heartbeats, so a worker killed inside any of them is
noticed within ``heartbeat_timeout_seconds``, not after a long start-to-close timeout.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError
from temporalio.exceptions import TimeoutError as ActivityTimeoutError
from temporalio.workflow import ContinueAsNewError

with workflow.unsafe.imports_passed_through():
    from activities.effects import publish_checkpoint, record_decision, release_capacity, reserve_capacity
    from activities.gang import gang_endpoint, train_gang_node
    from activities.models import (
        CollectInput,
        DecisionInput,
        EffectInput,
        EffectReceipt,
        GangEndpointInput,
        GangNodeInput,
        LatestCheckpointInput,
        LatestCheckpointResult,
        OpenRunInput,
        OpenRunResult,
        RunCarry,
        RunInfo,
        RunProgress,
        RunSummary,
        TrainingRunInput,
        TrainSegmentInput,
        TrainSegmentResult,
        node_queue,
    )
    from activities.training import INTERRUPTED, collect_checkpoints, latest_checkpoint, open_run, train_segment
    from cairn.numerics import profile_queue

__all__ = ["TrainingRun"]

SEGMENT_RETRY = RetryPolicy(
    # The first retry of a lost segment starts at once (a crash is already a heartbeat timeout
    # late); repeated failures (storage trouble) back off to the 1 s below.
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    # A crashed segment is retried at most 1 s after its loss is detected, however often the
    # same segment has crashed (a growing backoff made recovery after repeated kills take 10 s
    # and more; at 2 s, the restore on top missed "resumed within 2 s of detection"). A retry
    # costs one restore; storage trouble retries at the same pace.
    maximum_interval=timedelta(seconds=1),
    maximum_attempts=0,  # unlimited: storage trouble heals; corrupt state is non-retryable
)
SHORT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=10))
ELASTIC_AFTER_FAILURES = 2
"""Failed gang attempts in a row after which an elastic run (``min_world_size``) halves its world size."""
GANG_ATTEMPTS_PER_RUN = 20
"""Gang attempts at one segment before the run continues-as-new (each costs ~20 history events)."""
BOOKKEEPING_TIMEOUT = timedelta(minutes=10)
"""Start-to-close bound of listing/GC/journal activities; a dead worker is noticed sooner, by
their heartbeat timeout (they heartbeat from a background thread while they work)."""


@workflow.defn(name="TrainingRun")
class TrainingRun:
    def __init__(self) -> None:
        self._inp: TrainingRunInput | None = None
        self._carry = RunCarry()
        self._phase = "starting"
        self._checkpoint_now = False
        self._rollback_to: int | None = None

    # -- control ------------------------------------------------------------------------------
    @workflow.query
    def progress(self) -> RunProgress:
        inp = self._inp
        return RunProgress(
            run_id=inp.run_id if inp else "",
            phase=self._phase,  # type: ignore[arg-type]
            step=self._carry.step,
            total=self._total(inp) if inp else 0,
            loss=self._carry.loss,
            checkpoint=self._carry.checkpoint,
            attempts=list(self._carry.attempts),
            segments=self._carry.segments,
            retried_segments=self._carry.retried_segments,
            recomputed_steps=self._carry.recomputed_steps,
            continued_as_new=self._carry.continued_as_new,
            epoch=self._carry.step / spe if (spe := self._carry.steps_per_epoch) else None,
            steps_per_epoch=self._carry.steps_per_epoch,
            val_loss=self._carry.val_loss,
            val_accuracy=self._carry.val_accuracy,
            reproducibility=self._carry.reproducibility,
            world_size=self._carry.world_size or (inp.world_size if inp else 1),
        )

    def _total(self, inp: TrainingRunInput) -> int:
        """The run's length in updates (``total_epochs`` resolves once the trainer said how
        many updates an epoch is; until then, 0)."""
        if inp.total_steps is not None:
            return inp.total_steps
        return self._carry.total_steps or 0

    @workflow.query
    def info(self) -> RunInfo:
        inp = self._inp
        if inp is None:
            return RunInfo(run_id="", store="")
        registry = inp.effects.registry if inp.effects else None
        return RunInfo(run_id=inp.run_id, store=inp.store, registry=registry)

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
        if inp.effects is not None and self._carry.step >= self._total(inp):
            receipt = await self._effect(publish_checkpoint, "publish", inp)
            self._carry.effects["publish"] = receipt.receipt
        await self._release(inp, reason="completed")
        self._phase = "finished"
        return self._summary(inp)

    async def _train(self, inp: TrainingRunInput) -> None:
        segments_this_run = 0
        while (self._carry.step < self._total(inp) or self._rollback_to is not None) and not self._carry.stop_requested:
            if self._carry.paused:
                self._phase = "paused"
                await workflow.wait_condition(lambda: not self._carry.paused or self._carry.stop_requested)
                continue
            if self._rollback_to is not None:
                await self._apply_rollback(inp)
                continue
            if segments_this_run >= inp.segments_per_run or workflow.info().is_continue_as_new_suggested():
                self._continue_as_new(inp)
            self._phase = "training"
            await self._run_segment(inp)
            segments_this_run += 1
            if inp.retention is not None:
                await workflow.execute_activity(
                    collect_checkpoints,
                    CollectInput(
                        run_id=inp.run_id, store=inp.store, store_id=self._carry.store_id, retention=inp.retention
                    ),
                    **self._bookkeeping(inp),
                )
        if self._carry.checkpoint is None:  # total_steps == 0: the origin is the result
            await self._run_segment(inp, target=0)

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
            retry_policy=SHORT_RETRY,
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
            **self._bookkeeping(inp),
        )
        detail: dict[str, object] = {"from_step": self._carry.step, "requested_step": wanted}
        if found.checkpoint is None:
            detail["refused"] = f"no committed checkpoint at or before step {wanted} (retention may have removed it)"
        else:
            detail.update(to_step=found.step, checkpoint=found.checkpoint)
            if self._carry.reservation is not None:
                detail["reservation"] = self._carry.reservation.receipt
                detail["note"] = (
                    f"training state restored to step {found.step}; reservation "
                    f"{self._carry.reservation.receipt} is NOT returned: restoring a checkpoint never undoes "
                    "an external effect"
                )
        await workflow.execute_activity(
            record_decision,
            DecisionInput(
                run_id=inp.run_id, store=inp.store, store_id=self._carry.store_id, decision="rollback", detail=detail
            ),
            activity_id=f"rollback-{self._carry.rollbacks}",
            **self._bookkeeping(inp),
        )
        self._carry.rollbacks += 1
        if found.checkpoint is not None:
            self._carry.step = found.step
            self._carry.checkpoint = found.checkpoint
            self._carry.fingerprint = found.fingerprint
            self._carry.resume_from = found.checkpoint

    def _bookkeeping(self, inp: TrainingRunInput) -> dict[str, object]:
        """Timeouts and retries of the short activities (listing, GC, journal, open)."""
        return {
            "start_to_close_timeout": BOOKKEEPING_TIMEOUT,
            "heartbeat_timeout": timedelta(seconds=inp.heartbeat_timeout_seconds),
            "retry_policy": SHORT_RETRY,
        }

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
            **self._bookkeeping(inp),
        )
        self._carry = RunCarry(
            step=latest.step,
            checkpoint=latest.checkpoint,
            fingerprint=latest.fingerprint,
            store_id=latest.store_id,
            steps_per_epoch=latest.steps_per_epoch,
            reproducibility=latest.reproducibility,
            numerics_id=latest.numerics_id,
        )
        if inp.total_epochs is not None:
            if latest.steps_per_epoch is None:
                raise ApplicationError(
                    "total_epochs: this worker's open_run did not report the epoch length; give total_steps",
                    type="ConfigError",
                    non_retryable=True,
                )
            self._carry.total_steps = inp.total_epochs * latest.steps_per_epoch
        if latest.step > self._total(inp):
            raise ApplicationError(
                f"run {inp.run_id} already has a committed checkpoint at step {latest.step}, "
                f"past total_steps={self._total(inp)}",
                type="InvariantError",
                non_retryable=True,
            )

    def _summary(self, inp: TrainingRunInput) -> RunSummary:
        return RunSummary(
            run_id=inp.run_id,
            checkpoint=self._carry.checkpoint,
            fingerprint=self._carry.fingerprint,
            steps=self._carry.step,
            total_steps=self._total(inp),
            stopped_early=self._carry.step < self._total(inp),
            attempts=list(self._carry.attempts),
            segments=self._carry.segments,
            retried_segments=self._carry.retried_segments,
            recomputed_steps=self._carry.recomputed_steps,
            continued_as_new=self._carry.continued_as_new,
            loss=self._carry.loss,
            effects=dict(self._carry.effects),
            val_loss=self._carry.val_loss,
            val_accuracy=self._carry.val_accuracy,
            reproducibility=self._carry.reproducibility,
            world_size=self._carry.world_size or (inp.world_size if inp else 1),
        )

    def _continue_as_new(self, inp: TrainingRunInput) -> None:
        carry = self._carry.model_copy(update={"continued_as_new": self._carry.continued_as_new + 1})
        workflow.continue_as_new(inp.model_copy(update={"carry": carry}))

    def _segment_fields(self, inp: TrainingRunInput, target: int, resume_from: str | None) -> dict[str, Any]:
        """The ``SegmentInput`` fields of the next segment, in-process or as a gang."""
        return {
            "run_id": inp.run_id,
            "config": inp.config,
            "store": inp.store,
            "store_id": self._carry.store_id,
            "target_step": target,
            "resume_from": resume_from,
            "checkpoint_every": inp.checkpoint.every,
            "throttle_seconds_per_step": inp.throttle_seconds_per_step,
            "heartbeat_every_seconds": min(0.1, inp.heartbeat_timeout_seconds / 4),
            "numerics_id": self._carry.numerics_id,
        }

    def _training_queue(self) -> str:
        """Where training goes: the queue of the workers of the run's numerics profile (a run
        opened by an older worker, with no profile id, stays on the run's own queue)."""
        base = workflow.info().task_queue
        numerics_id = self._carry.numerics_id
        return base if numerics_id is None else profile_queue(base, numerics_id)

    async def _run_segment(self, inp: TrainingRunInput, target: int | None = None) -> None:
        if target is None:
            target = min(self._segment_end(inp), self._total(inp))
        if inp.gang:
            await self._run_gang_segment(inp, target)
            return
        self._checkpoint_now = False
        resume_from, self._carry.resume_from = self._carry.resume_from, None
        handle = workflow.start_activity(
            train_segment,
            TrainSegmentInput(
                **self._segment_fields(inp, target, resume_from), async_save=inp.checkpoint.mode == "async"
            ),
            task_queue=self._training_queue(),
            start_to_close_timeout=timedelta(seconds=inp.segment_timeout_seconds),
            heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_seconds),
            retry_policy=SEGMENT_RETRY,
            cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
        )
        try:
            await workflow.wait_condition(lambda: handle.done() or self._interrupt_requested())
        except asyncio.CancelledError:
            # The workflow is being cancelled: let the segment checkpoint before we stop.
            handle.cancel()
            await self._settle(inp, handle)
            raise
        if not handle.done():
            self._phase = "stopping" if self._carry.stop_requested else "training"
            handle.cancel()
        await self._settle(inp, handle)

    async def _run_gang_segment(self, inp: TrainingRunInput, target: int) -> None:
        """A segment as a gang: one ``train_gang_node`` per node, on that node's own task queue.
        Any node's failure fails the gang: the other nodes are cancelled (their ranks stop and
        are reaped) and the whole gang is retried — a fresh rendezvous — from the last commit."""
        self._checkpoint_now = False
        resume_from, self._carry.resume_from = self._carry.resume_from, None
        base = workflow.info().task_queue
        attempt, reached, failures = 0, None, 0
        while True:
            attempt += 1
            world = self._carry.world_size or inp.world_size
            nodes = self._carry.nodes if self._carry.nodes is not None else inp.nodes
            queues = [node_queue(base, n) for n in nodes] or [self._training_queue()]
            rendezvous = None
            if len(queues) > 1:
                rendezvous = await workflow.execute_activity(
                    gang_endpoint,
                    GangEndpointInput(run_id=inp.run_id),
                    task_queue=queues[0],
                    start_to_close_timeout=timedelta(seconds=30),
                    retry_policy=SEGMENT_RETRY,
                )
            handles = [
                workflow.start_activity(
                    train_gang_node,
                    GangNodeInput(
                        **self._segment_fields(inp, target, resume_from),
                        world_size=world,
                        nnodes=len(queues),
                        node_index=i,
                        rendezvous=rendezvous,
                        rdzv_id=f"{inp.run_id}-{target}-{attempt}-{workflow.info().run_id[:8]}",
                        attempt=attempt,
                        reached_before=reached,
                    ),
                    task_queue=queue,
                    start_to_close_timeout=timedelta(seconds=inp.segment_timeout_seconds),
                    heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_seconds),
                    retry_policy=RetryPolicy(maximum_attempts=1),  # the gang is retried whole, below
                    cancellation_type=workflow.ActivityCancellationType.WAIT_CANCELLATION_COMPLETED,
                )
                for i, queue in enumerate(queues)
            ]

            def failed(hs: list[workflow.ActivityHandle[TrainSegmentResult]] = handles) -> bool:
                return any(h.done() and h.exception() is not None for h in hs)

            def settled(hs: list[workflow.ActivityHandle[TrainSegmentResult]] = handles) -> bool:
                return all(h.done() for h in hs) or failed(hs) or self._interrupt_requested()

            try:
                await workflow.wait_condition(settled)
            except asyncio.CancelledError:
                for h in handles:
                    h.cancel()
                await self._settle_gang(inp, handles, interrupted=True)
                raise
            if not all(h.done() for h in handles):
                if not failed():
                    self._phase = "stopping" if self._carry.stop_requested else "training"
                for h in handles:
                    h.cancel()
            outcome = await self._settle_gang(inp, handles, interrupted=self._interrupt_requested())
            if outcome is None:
                return
            reached = max(reached or 0, outcome) if outcome >= 0 else reached
            failures += 1
            if (
                inp.min_world_size is not None
                and failures >= ELASTIC_AFTER_FAILURES
                and world // 2 >= inp.min_world_size
            ):
                # Elastic: any world size dividing the microbatches gives the same bits, so the
                # run goes on with half the ranks (on the first half of its nodes) from its last commit.
                self._carry.world_size = world // 2
                self._carry.nodes = nodes[: max(1, len(nodes) // 2)] if len(nodes) > 1 else list(nodes)
                failures = 0
                workflow.logger.warning(
                    "gang failed %d times in a row at world size %d: continuing at %d",
                    ELASTIC_AFTER_FAILURES,
                    world,
                    world // 2,
                )
            if attempt >= GANG_ATTEMPTS_PER_RUN or workflow.info().is_continue_as_new_suggested():
                # A gang that keeps failing (a node with no worker) must not grow this run's
                # history without bound: carry on in a fresh run, from the same checkpoint.
                self._carry.resume_from = resume_from
                self._continue_as_new(inp)
            await workflow.sleep(timedelta(milliseconds=min(1000, 200 * 2 ** (attempt - 1))))

    async def _settle_gang(
        self, inp: TrainingRunInput, handles: list[workflow.ActivityHandle[TrainSegmentResult]], *, interrupted: bool
    ) -> int | None:
        """Wait for every node; record the outcome. Returns None when the segment is settled
        (completed or interrupted), else how far the failed attempt got (-1: unknown) for a retry;
        a non-retryable failure is raised (it fails the run)."""
        results: list[TrainSegmentResult] = []
        errors: list[ActivityError] = []
        for h in handles:
            try:
                results.append(await h)
            except ActivityError as err:
                errors.append(err)

        def benign(err: ActivityError) -> bool:
            cause = err.cause
            return isinstance(cause, CancelledError) or (
                isinstance(cause, ApplicationError) and cause.type == INTERRUPTED
            )

        real = [e for e in errors if not benign(e)]
        for err in real:
            if isinstance(err.cause, ApplicationError) and err.cause.non_retryable:
                raise err
        if not errors:
            self._record_result(results[0])
            return None
        if not real or interrupted:
            await self._record_interruption(inp, next((e.cause for e in errors if benign(e)), None))
            return None
        reached = -1
        for err in real:
            cause = err.cause
            details: object = None
            if isinstance(cause, ApplicationError) and cause.details:
                details = cause.details[0]
            elif isinstance(cause, ActivityTimeoutError) and cause.last_heartbeat_details:
                details = cause.last_heartbeat_details[0]
            if isinstance(details, dict) and isinstance(details.get("reached"), int):
                reached = max(reached, details["reached"])
        workflow.logger.warning("gang segment failed (%s); retrying the whole gang", real[0].cause)
        return reached

    def _segment_end(self, inp: TrainingRunInput) -> int:
        """Where the next segment stops: ``segment.steps`` on, or the end of the
        ``segment.epochs``-th epoch boundary from here (an interrupted epoch is finished first)."""
        step, spe, seg = self._carry.step, self._carry.steps_per_epoch, inp.segment
        if seg is None:
            return step + inp.steps_per_segment
        if seg.steps is not None:
            return step + seg.steps
        assert seg.epochs is not None
        if not spe:
            raise ApplicationError(
                "segment.epochs: this worker's open_run did not report the epoch length; use segment.steps",
                type="ConfigError",
                non_retryable=True,
            )
        return (step // spe + seg.epochs) * spe

    async def _settle(self, inp: TrainingRunInput, handle: workflow.ActivityHandle[TrainSegmentResult]) -> None:
        """Record the segment's outcome; after an interruption, read the last durable cursor."""
        try:
            result = await handle
        except ActivityError as err:
            interrupted = isinstance(err.cause, ApplicationError) and err.cause.type == INTERRUPTED
            if not interrupted and not isinstance(err.cause, CancelledError):
                raise
            await self._record_interruption(inp, err.cause)
            return
        self._record_result(result)

    async def _record_interruption(self, inp: TrainingRunInput, cause: BaseException | None) -> None:
        """Interrupted (pause/stop/checkpoint-now/cancel): it committed before reporting.
        After a rollback "latest" may be a checkpoint from before the rollback; training is
        deterministic, so it holds the very state the replay would have reached."""
        latest: LatestCheckpointResult = await workflow.execute_activity(
            latest_checkpoint,
            LatestCheckpointInput(run_id=inp.run_id, store=inp.store, store_id=self._carry.store_id),
            **self._bookkeeping(inp),
        )
        report = _interruption_report(cause)
        self._carry.record_segment(report.get("attempt", 1))
        self._carry.recomputed_steps += report.get("recomputed_steps", 0)
        self._carry.step = latest.step
        self._carry.checkpoint = latest.checkpoint
        self._carry.fingerprint = latest.fingerprint

    def _record_result(self, result: TrainSegmentResult) -> None:
        self._carry.record_segment(result.attempt)
        self._carry.recomputed_steps += result.recomputed_steps
        self._carry.step = result.step
        self._carry.checkpoint = result.checkpoint
        self._carry.fingerprint = result.fingerprint
        self._carry.loss = result.loss
        if result.val_loss is not None:
            self._carry.val_loss = result.val_loss
            self._carry.val_accuracy = result.val_accuracy


def _interruption_report(cause: BaseException | None) -> dict[str, int]:
    """What an interrupted segment reported (attempt, recomputed steps); empty when it was
    cancelled before it could say."""
    if not isinstance(cause, ApplicationError):
        return {}
    details = cause.details[0] if cause.details else None
    if not isinstance(details, dict):
        return {}
    return {k: v for k, v in details.items() if k in ("attempt", "recomputed_steps") and isinstance(v, int)}
