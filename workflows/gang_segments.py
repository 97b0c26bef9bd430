"""The gang half of the ``TrainingRun`` workflow: a segment trained by a gang of rank processes,
one ``train_gang_node`` activity per node, retried as a whole (``workflows.gang_policy``).

A mixin of ``workflows.training_run.TrainingRun``, which owns the state it reads and writes
(the carry, the phase) and the steps it shares (interruptions, continue-as-new).
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import gang_policy, run_state, segments

with workflow.unsafe.imports_passed_through():
    from activities.gang import gang_endpoint, train_gang_node
    from activities.inputs import (
        GangEndpointInput,
        GangNodeInput,
        RunCarry,
        TrainingRunInput,
        TrainSegmentResult,
        node_queue,
    )

__all__ = ["GangSegments"]


class GangSegments:
    """Gang segments for ``TrainingRun`` (which provides everything declared here)."""

    _carry: RunCarry
    _phase: str
    _checkpoint_now: bool

    def _interrupt_requested(self) -> bool:
        raise NotImplementedError

    def _training_queue(self) -> str:
        raise NotImplementedError

    def _continue_as_new(self, inp: TrainingRunInput) -> None:
        raise NotImplementedError

    async def _record_interruption(self, inp: TrainingRunInput, cause: BaseException | None) -> None:
        raise NotImplementedError

    def _replay_resume(self) -> str | None:
        raise NotImplementedError

    async def _run_gang_segment(self, inp: TrainingRunInput, target: int) -> None:
        """A segment as a gang: one ``train_gang_node`` per node, on that node's own task queue.
        Any node's failure fails the gang: the other nodes are cancelled (their ranks stop and
        are reaped) and the whole gang is retried — a fresh rendezvous — from the last commit."""
        self._checkpoint_now = False
        resume_from, self._carry.resume_from = self._carry.resume_from, None
        resume_from = resume_from or self._replay_resume()
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
                    retry_policy=segments.SEGMENT_RETRY,
                )
            handles = [
                workflow.start_activity(
                    train_gang_node,
                    GangNodeInput(
                        **segments.segment_fields(inp, self._carry, target, resume_from),
                        world_size=world,
                        nnodes=len(queues),
                        node_index=i,
                        rendezvous=rendezvous,
                        rdzv_id=gang_policy.rendezvous_id(inp.run_id, target, attempt, workflow.info().run_id),
                        attempt=attempt,
                        reached_before=reached,
                    ),
                    task_queue=queue,
                    start_to_close_timeout=timedelta(seconds=inp.segment_timeout_seconds),
                    heartbeat_timeout=timedelta(seconds=inp.heartbeat_timeout_seconds),
                    retry_policy=gang_policy.NODE_RETRY,
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
            reached = gang_policy.carried_reach(reached, outcome)
            failures += 1
            smaller = gang_policy.shrunk(world, nodes, failures, inp.min_world_size)
            if smaller is not None:
                self._carry.world_size, self._carry.nodes = smaller
                failures = 0
                workflow.logger.warning(
                    "gang failed %d times in a row at world size %d: continuing at %d",
                    gang_policy.ELASTIC_AFTER_FAILURES,
                    world,
                    self._carry.world_size,
                )
            if gang_policy.out_of_attempts(attempt) or workflow.info().is_continue_as_new_suggested():
                # A gang that keeps failing (a node with no worker) must not grow this run's
                # history without bound: carry on in a fresh run, from the same checkpoint.
                self._carry.resume_from = resume_from
                self._continue_as_new(inp)
            await workflow.sleep(gang_policy.retry_delay(attempt))

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
        real = [e for e in errors if not segments.interrupted(e)]
        fatal = gang_policy.non_retryable(real)
        if fatal is not None:
            raise fatal
        if not errors:
            run_state.record_result(self._carry, results[0], inp)
            return None
        if not real or interrupted:
            # A node stopped before its ranks trained reports a failure, not an interruption: its
            # details still name the attempt.
            cause = next((e.cause for e in errors if segments.interrupted(e)), errors[0].cause)
            await self._record_interruption(inp, cause)
            return None
        reached = gang_policy.furthest_reach(real)
        workflow.logger.warning("gang segment failed (%s); retrying the whole gang", real[0].cause)
        return reached
