"""Training activities: thin adapters from Temporal to ``cairn`` (the edge they share with
the gang and effect activities is ``activities.edge``).

``open_run`` claims the run and reports its last durable cursor. ``train_segment`` resumes
from that cursor — the latest committed checkpoint in the store, never the segment's start;
memory only when the session this worker holds is exactly that commit; the choice is
``cairn.runs.restore``'s — trains up to the segment's target step (or its time budget), committing checkpoints under
absolute-step idempotency keys, and heartbeats its progress. A retried attempt (on this or
another worker) does the same, so it converges on the same committed checkpoints; a stale
attempt that is still running commits identical bytes (or is caught by the fingerprint check
if the run were non-deterministic); an attempt that learns it has been superseded (its worker
stalled past the heartbeat timeout, or the server says the attempt is gone) stops and writes
nothing more (``activities.fence``). ``latest_checkpoint`` and ``collect_checkpoints`` list
and apply retention.

Every activity heartbeats while it works (restoring, training, saving, listing, collecting)
and first checks that the store is the run's store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time

from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError, RPCStatusCode

from activities import metrics as m
from activities.edge import (
    Heartbeater,
    activity_errors,
    heartbeat_interval,
    interruption,
    open_run_store,
    previous_reach,
    recomputed_steps,
    require_numerics,
)
from activities.fence import SUPERSEDED, AttemptSuperseded, FencedStore
from activities.inputs import (
    CollectInput,
    LatestCheckpointInput,
    LatestCheckpointResult,
    OpenRunInput,
    OpenRunResult,
    TrainSegmentInput,
    TrainSegmentResult,
    own_queue,
)
from activities.log_context import run_context, set_step
from activities.tier import tiered_store
from cairn import faults
from cairn.checkpoint import (
    CheckpointOptions,
    CommitResult,
    RetentionPolicy,
    TieredStore,
    checkpoint_overrides,
    collect_garbage,
    last_choice,
    latest_committed,
    latest_cursor,
    manifest_config,
)
from cairn.numerics import profile_id
from cairn.runs import (
    RestoreSource,
    WarmRuns,
    choose_restore,
    claim_run,
    require_not_past,
    require_run_owner,
    require_store_identity,
    warm_key,
)
from cairn.session import TrainingSession
from cairn.state import TrainState
from cairn.stores import Store, open_store, store_identity
from cairn.trainers import check_checkpoint_config, load_trainer

__all__ = ["train_segment", "open_run", "latest_checkpoint", "collect_checkpoints", "TRAINING_ACTIVITIES"]

log = logging.getLogger("cairn.activity")

WARM_RUNS_ENV = "CAIRN_WARM_RUNS"
WARM = WarmRuns(capacity=int(os.environ.get(WARM_RUNS_ENV, "2")))
"""The runs this worker process holds in memory between their segments (``cairn.runs.warm``;
``CAIRN_WARM_RUNS=0`` turns it off)."""


@activity.defn(name="train_segment")
def train_segment(inp: TrainSegmentInput) -> TrainSegmentResult:
    info = activity.info()
    attempt = info.attempt + inp.prior_attempts  # a segment re-offered after a lost attempt counts on
    # Cancellation (pause, stop, checkpoint-now, workflow cancel) and worker shutdown must not
    # interrupt a step or a commit halfway: defer the SDK's in-thread exception, poll instead,
    # commit a checkpoint at the current step, then report.
    with run_context(inp.run_id, attempt), activity.shield_thread_cancel_exception():
        try:
            with activity_errors():
                result, why = _train_segment(inp, info, attempt)
        except AttemptSuperseded as exc:
            m.SEGMENTS.labels("superseded").inc()
            log.warning("run %s: attempt %d superseded, stopped without committing: %s", inp.run_id, attempt, exc)
            raise ApplicationError(
                f"attempt superseded: {exc}", type=SUPERSEDED, category=ApplicationErrorCategory.BENIGN
            ) from None
        except BaseException:
            m.SEGMENTS.labels("failed").inc()
            raise
        return _report(inp, result, why)


def _report(inp: TrainSegmentInput, result: TrainSegmentResult, why: str) -> TrainSegmentResult:
    """The segment's outcome: a result, or the typed failure an interruption is reported as."""
    m.SEGMENTS.labels({"worker-shutdown": "handed_back", "cancelled": "interrupted"}.get(why, "completed")).inc()
    if why == "worker-shutdown":
        log.info("run %s: worker shutting down; handed back at step %d", inp.run_id, result.step)
        raise ApplicationError(
            f"worker shutting down at step {result.step} (checkpoint {result.checkpoint} committed)",
            {"attempt": result.attempt, "step": result.step},
            type="WorkerShutdown",
            category=ApplicationErrorCategory.BENIGN,  # expected: no WARNING traceback in the log
        )
    if why == "cancelled":
        raise interruption(inp.run_id, result, "segment")
    return result


def _train_segment(inp: TrainSegmentInput, info: activity.Info, attempt: int) -> tuple[TrainSegmentResult, str]:
    reached = [r for r in (previous_reach(info), inp.reached_before) if r is not None]
    reached_before = max(reached) if reached else None
    beats = Heartbeater(
        min(inp.heartbeat_every_seconds, heartbeat_interval()),
        step=None,
        reached=reached_before,  # kept, so an attempt that dies early does not erase an earlier reach
        checkpoint=None,
        attempt=attempt,
        loss=None,
    )
    with beats, contextlib.ExitStack() as cleanup:
        log.info(
            "run %s: segment to step %d, attempt %d (workflow %s)",
            inp.run_id,
            inp.target_step,
            attempt,
            info.workflow_id,
        )
        require_numerics(inp.numerics_id)
        store = open_run_store(inp.store, inp.store_id)
        cleanup.callback(store.close)  # a warm session kept for the next segment gets that one's store
        require_run_owner(store, inp.run_id, info.workflow_id)  # before any expensive restore
        key = warm_key(inp.config.canonical_json(), inp.store)
        tiered = tiered_store(inp.store)  # this worker's node-local tier, if it has one
        session, warm, recomputed = _resumed(inp, attempt, store, key, tiered, reached_before)
        session.store = FencedStore(session.store, beats.superseded)  # a superseded attempt writes nothing
        resumed = session.state.step
        beats.update(step=resumed)
        if resumed == 0:
            _record_commit(inp.run_id, session.checkpoint())  # step 0 is a checkpoint too: the origin is durable
        durable = session.durable_ref
        beats.update(checkpoint=str(durable) if durable else None, committed_step=resumed)
        watch = _StepWatch(inp, beats, reached_before)

        def on_checkpoint(result: CommitResult) -> None:
            _record_commit(inp.run_id, result)
            beats.update(step=result.ref.step, checkpoint=str(result.ref), committed_step=result.ref.step)
            beats.beat()

        started = time.perf_counter()
        last = session.run(
            inp.target_step - resumed,
            checkpoint_every=inp.checkpoint_every,
            async_save=inp.async_save,
            on_step=watch,
            on_checkpoint=on_checkpoint,
        )
        assert last is not None
        if tiered is not None and (watch.interrupted or inp.final):  # the run's cursor must be durable now
            beats.update(phase="uploading")
            tiered.flush(inp.run_id, last.ref.step, last.manifest.fingerprint)  # the durable commit, or raises
        durable_ref = last.ref if tiered is None else latest_committed(store, inp.run_id, options=session.options)
        result = TrainSegmentResult.of(
            session.state,
            checkpoint=str(last.ref),
            fingerprint=last.manifest.fingerprint,
            resumed_from_step=resumed,
            attempt=attempt,
            recomputed_steps=recomputed,
            warm=warm,
            saves=session.saves,
            blocked_save_seconds=session.blocked_seconds,
            train_seconds=max(0.0, time.perf_counter() - started - session.blocked_seconds),
            worker_queue=own_queue(info.task_queue),
            durable_checkpoint=None if durable_ref is None else str(durable_ref),
            durable_step=None if durable_ref is None else durable_ref.step,
            compression=last_choice(session.store.url),
        )
        log.info(
            "run %s: segment ended at step %d, loss %s, checkpoint %s%s",
            inp.run_id,
            result.step,
            "-" if result.loss is None else f"{result.loss:.6f}",
            last.ref,
            f", recomputed {recomputed} step(s)" if recomputed else "",
        )
        if not watch.interrupted:
            WARM.keep(inp.run_id, key, session)
        m.WARM_RUNS.set(WARM.runs)
        m.WARM_BYTES.set(WARM.nbytes)
    return result, watch.interrupted


def _resumed(
    inp: TrainSegmentInput, attempt: int, store: Store, key: str, tiered: TieredStore | None, reached: int | None
) -> tuple[TrainingSession, bool, int]:
    """The segment's session (``_session``), counted and logged; whether it came from memory, and
    the steps it recomputes."""
    restore_started = time.perf_counter()
    session, source = _session(inp, attempt, store, key, tiered)
    warm = source == "memory"
    m.SEGMENT_STARTS.labels("warm" if warm else "cold").inc()
    m.RESTORES.labels(source).inc()
    if not warm:
        m.RESTORE_SECONDS.observe(time.perf_counter() - restore_started)
    resumed = session.state.step
    set_step(resumed)
    recomputed = recomputed_steps(reached, resumed, attempt)
    if attempt > 1:
        m.RECOVERIES.inc()
        m.STEPS_RECOMPUTED.inc(recomputed)
    log.info(
        "run %s: resumed from step %d (%s%s)%s",
        inp.run_id,
        resumed,
        "held in memory" if warm else session.restored_from or "fresh start",
        {"local": "; from the local tier", "durable": "; from the durable store"}.get(source, "") if tiered else "",
        f"; an earlier attempt had reached step {reached}" if reached is not None else "",
    )
    require_not_past(resumed, inp.target_step)
    return session, warm, recomputed


def _session(
    inp: TrainSegmentInput, attempt: int, store: Store, key: str, tiered: TieredStore | None
) -> tuple[TrainingSession, RestoreSource]:
    """The segment's session and where its state came from (``cairn.runs.restore``), with the
    worker's options (read here, at the edge) and the session this worker holds for the run."""
    options = CheckpointOptions.from_env(**checkpoint_overrides(inp.incremental, inp.compression))
    held = WARM.take(inp.run_id, key)
    return choose_restore(
        inp.run_id,
        inp.config,
        store,
        options,
        tiered=tiered,
        resume_from=inp.resume_from,
        held=held,
        first_attempt=attempt == 1,
    )


class _StepWatch:
    """Called after every update: heartbeats, metrics and the checks that end a segment early (a
    cancellation or worker shutdown, in ``interrupted``; the time budget; a superseded attempt)."""

    def __init__(self, inp: TrainSegmentInput, beats: Heartbeater, reached_before: int | None) -> None:
        self.inp, self.beats, self.reached_before = inp, beats, reached_before
        self.interrupted = ""
        self.deadline: float | None = None  # from the first update: not the wait for the process's torch lock

    def __call__(self, state: TrainState) -> bool:
        inp, beats = self.inp, self.beats
        beats.update(step=state.step, reached=max(state.step, self.reached_before or 0), loss=state.last("loss"))
        set_step(state.step)
        m.STEPS.inc()
        faults.maybe_crash("mid-segment", step=state.step)
        if inp.throttle_seconds_per_step:
            time.sleep(inp.throttle_seconds_per_step)
        beats.notice_cancellation()
        if (gone := beats.superseded()) is not None:  # thawed after the server retried it elsewhere
            raise AttemptSuperseded(gone)
        if activity.is_cancelled():
            self.interrupted = "cancelled"
        elif activity.is_worker_shutdown():
            self.interrupted = "worker-shutdown"
        if self.deadline is None and inp.max_seconds is not None:
            self.deadline = time.monotonic() + inp.max_seconds
        return bool(self.interrupted) or (self.deadline is not None and time.monotonic() >= self.deadline)


def _record_commit(run_id: str, result: CommitResult) -> None:
    set_step(result.ref.step)
    log.info(
        "run %s: committed step %d%s (%s, %d bytes, %.3f s)",
        run_id,
        result.ref.step,
        "" if result.created else " (identical, already committed)",
        result.manifest.fingerprint[:19],
        result.manifest.total_bytes,
        result.seconds,
    )
    m.COMMITS.labels("created" if result.created else "existing").inc()
    if result.created:
        m.CHECKPOINT_BYTES.observe(result.manifest.total_bytes)
        m.SAVE_SECONDS.observe(result.seconds)


@activity.defn(name="open_run")
async def open_run(inp: OpenRunInput) -> OpenRunResult:
    """The run's first activity: the store's identity (created on first use), the run's owner
    (this workflow, or a refusal while another workflow still trains the run id), and the last
    durable cursor to continue from."""
    client = activity.client()
    loop = asyncio.get_running_loop()

    async def running(workflow_id: str) -> bool:
        try:
            desc = await client.get_workflow_handle(workflow_id).describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return False
            raise
        return desc.status == WorkflowExecutionStatus.RUNNING

    def owner_running(workflow_id: str) -> bool:
        return asyncio.run_coroutine_threadsafe(running(workflow_id), loop).result(timeout=30)

    def work() -> OpenRunResult:
        with run_context(inp.run_id), activity_errors():
            store = open_store(inp.store)
            faults.maybe_crash("in-activity", tag="open_run")
            if inp.store_id is not None:
                require_store_identity(store, inp.store_id)
            store_id = store_identity(store, create=True)
            assert store_id is not None
            claim_run(store, inp.run_id, inp.workflow_id, store_id, owner_running=owner_running)
            trainer = load_trainer(inp.config, on_host=True) if inp.config is not None else None
            about = (
                {}
                if trainer is None
                else {
                    "steps_per_epoch": trainer.steps_per_epoch,
                    "trainer": trainer.path,
                    "reproducibility": trainer.reproducibility,
                }
            )
            latest = latest_cursor(store, inp.run_id, CheckpointOptions.from_env())
            numerics_id = None if inp.numerics is None else profile_id(inp.numerics)
            if latest is None:
                return OpenRunResult(
                    store_id=store_id, checkpoint=None, step=0, fingerprint=None, numerics_id=numerics_id, **about
                )
            manifest = latest.manifest
            if trainer is not None:  # another model or trainer on this run id: say which field, before its length
                check_checkpoint_config(manifest_config(manifest), trainer.config)
            recorded = manifest.lineage.numerics if manifest.lineage is not None else None
            if recorded is not None and recorded.profile == inp.numerics:
                numerics_id = recorded.id  # stay with the workers that computed the run so far
            return OpenRunResult(
                store_id=store_id,
                checkpoint=str(latest.ref),
                step=latest.ref.step,
                fingerprint=latest.fingerprint,
                numerics_id=numerics_id,
                **about,
            )

    task = asyncio.ensure_future(asyncio.to_thread(work))  # to_thread carries the activity's context
    interval = heartbeat_interval()
    while not task.done():
        activity.heartbeat({"phase": "open"})
        await asyncio.wait({task}, timeout=interval)
    return task.result()


@activity.defn(name="latest_checkpoint")
def latest_checkpoint(inp: LatestCheckpointInput) -> LatestCheckpointResult:
    """The run's last durable cursor (after an interrupted segment, or a rollback target)."""
    with run_context(inp.run_id), activity_errors(), Heartbeater(heartbeat_interval(), phase="listing"):
        store = open_run_store(inp.store, inp.store_id)
        faults.maybe_crash("in-activity", tag="latest_checkpoint")
        latest = latest_cursor(store, inp.run_id, CheckpointOptions.from_env(), at_or_before=inp.at_or_before)
        if latest is None:
            return LatestCheckpointResult(checkpoint=None, step=0, fingerprint=None)
        return LatestCheckpointResult(checkpoint=str(latest.ref), step=latest.ref.step, fingerprint=latest.fingerprint)


@activity.defn(name="collect_checkpoints")
def collect_checkpoints(inp: CollectInput) -> int:
    """Apply retention; returns how many checkpoints were deleted."""
    with run_context(inp.run_id), activity_errors(), Heartbeater(heartbeat_interval(), phase="collecting"):
        store = open_run_store(inp.store, inp.store_id)
        faults.maybe_crash("in-activity", tag="collect_checkpoints")
        spec = inp.retention
        policy = RetentionPolicy(keep_last=spec.keep_last, keep_every=spec.keep_every, grace_seconds=spec.grace_seconds)
        plan = collect_garbage(store, inp.run_id, policy, options=CheckpointOptions.from_env())
        if plan.delete or plan.orphans:
            log.info(
                "run %s: retention deleted %d checkpoint(s), %d orphan object(s)",
                inp.run_id,
                len(plan.delete),
                len(plan.orphans),
            )
        return len(plan.delete)


TRAINING_ACTIVITIES = [train_segment, open_run, latest_checkpoint, collect_checkpoints]
