"""Training activities: thin adapters from Temporal to ``cairn`` (the edge they share with
the gang and effect activities is ``activities.edge``).

``open_run`` claims the run and reports its last durable cursor. ``train_segment`` resumes
from that cursor — the latest committed checkpoint in the store, never the segment's start;
memory only when the session this worker holds is exactly that commit (``cairn.runs.warm``) —
trains up to the segment's target step (or its time budget), committing checkpoints under
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
    require_numerics,
)
from activities.fence import SUPERSEDED, AttemptSuperseded, FencedStore
from activities.log_context import run_context, set_step
from activities.models import (
    CollectInput,
    LatestCheckpointInput,
    LatestCheckpointResult,
    OpenRunInput,
    OpenRunResult,
    TrainSegmentInput,
    TrainSegmentResult,
    own_queue,
)
from activities.tier import tiered_store
from cairn import faults
from cairn.checkpoint import CheckpointKind, CheckpointRef, latest_committed, list_checkpoints, read_manifest
from cairn.checkpoint.commit import CommitResult
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage
from cairn.checkpoint.tier import TieredStore
from cairn.checkpoint.validate import manifest_config
from cairn.numerics import profile_id
from cairn.runs.ownership import claim_run, require_run_owner, require_store_identity, store_identity
from cairn.runs.tier_restore import resume_tiered
from cairn.runs.warm import WarmRuns, warm_key
from cairn.session import TrainingSession
from cairn.state import TrainState
from cairn.stores import open_store
from cairn.stores.base import Store
from cairn.trainers.loading import check_checkpoint_config, load_trainer

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
        restore_started = time.perf_counter()
        session, source = _session(inp, attempt, store, key, tiered)
        session.store = FencedStore(session.store, beats.superseded)  # a superseded attempt writes nothing
        warm = source == "memory"
        m.SEGMENT_STARTS.labels("warm" if warm else "cold").inc()
        m.RESTORES.labels(source).inc()
        if not warm:
            m.RESTORE_SECONDS.observe(time.perf_counter() - restore_started)
        resumed = session.state.step
        set_step(resumed)
        recomputed = max(0, (reached_before or 0) - resumed) if attempt > 1 else 0
        if attempt > 1:
            m.RECOVERIES.inc()
            m.STEPS_RECOMPUTED.inc(recomputed)
        log.info(
            "run %s: resumed from step %d (%s%s)%s",
            inp.run_id,
            resumed,
            "held in memory" if warm else session.restored_from or "fresh start",
            {"local": "; from the local tier", "durable": "; from the durable store"}.get(source, "") if tiered else "",
            f"; an earlier attempt had reached step {reached_before}" if reached_before is not None else "",
        )
        if resumed > inp.target_step:
            raise ApplicationError(
                f"latest committed step {resumed} is past this segment's target {inp.target_step}",
                type="InvariantError",
                non_retryable=True,
            )
        beats.update(step=resumed)
        if resumed == 0:
            _record_commit(inp.run_id, session.checkpoint())  # step 0 is a checkpoint too: the origin is durable
        durable = session.durable_ref
        beats.update(checkpoint=str(durable) if durable else None, committed_step=resumed)
        interrupted = ""
        deadline: float | None = None  # from the first update: not the wait for the process's torch lock

        def on_step(state: TrainState) -> bool:
            nonlocal interrupted, deadline
            beats.update(step=state.step, reached=max(state.step, reached_before or 0), loss=state.history["loss"][-1])
            set_step(state.step)
            m.STEPS.inc()
            faults.maybe_crash("mid-segment", step=state.step)
            if inp.throttle_seconds_per_step:
                time.sleep(inp.throttle_seconds_per_step)
            beats.notice_cancellation()
            if (gone := beats.superseded()) is not None:  # thawed after the server retried it elsewhere
                raise AttemptSuperseded(gone)
            if activity.is_cancelled():
                interrupted = "cancelled"
            elif activity.is_worker_shutdown():
                interrupted = "worker-shutdown"
            if deadline is None and inp.max_seconds is not None:
                deadline = time.monotonic() + inp.max_seconds
            return bool(interrupted) or (deadline is not None and time.monotonic() >= deadline)

        def on_checkpoint(result: CommitResult) -> None:
            _record_commit(inp.run_id, result)
            beats.update(step=result.ref.step, checkpoint=str(result.ref), committed_step=result.ref.step)
            beats.beat()

        started = time.perf_counter()
        last = session.run(
            inp.target_step - resumed,
            checkpoint_every=inp.checkpoint_every,
            async_save=inp.async_save,
            on_step=on_step,
            on_checkpoint=on_checkpoint,
        )
        assert last is not None
        if tiered is not None and (interrupted or inp.final):  # the run's cursor must be durable now
            beats.update(phase="uploading")
            tiered.flush(inp.run_id, last.ref.step, last.manifest.fingerprint)  # the durable commit, or raises
        durable_ref = last.ref if tiered is None else latest_committed(store, inp.run_id)
        train_seconds = max(0.0, time.perf_counter() - started - session.blocked_seconds)
        state = session.state
        loss = state.history["loss"][-1] if state.history["loss"] else None
        val_loss = state.history["val_loss"][-1] if state.history.get("val_loss") else None
        val_accuracy = state.history["val_accuracy"][-1] if state.history.get("val_accuracy") else None
        log.info(
            "run %s: segment ended at step %d, loss %s, checkpoint %s%s",
            inp.run_id,
            state.step,
            "-" if loss is None else f"{loss:.6f}",
            last.ref,
            f", recomputed {recomputed} step(s)" if recomputed else "",
        )
        result = TrainSegmentResult(
            step=state.step,
            cursor=state.cursor,
            checkpoint=str(last.ref),
            fingerprint=last.manifest.fingerprint,
            loss=loss,
            val_loss=val_loss,
            val_accuracy=val_accuracy,
            attempt=attempt,
            resumed_from_step=resumed,
            recomputed_steps=recomputed,
            warm=warm,
            saves=session.saves,
            blocked_save_seconds=session.blocked_seconds,
            train_seconds=train_seconds,
            worker_queue=own_queue(info.task_queue),
            durable_checkpoint=None if durable_ref is None else str(durable_ref),
            durable_step=None if durable_ref is None else durable_ref.step,
        )
        if not interrupted:
            WARM.keep(inp.run_id, key, session)
        m.WARM_RUNS.set(WARM.runs)
        m.WARM_BYTES.set(WARM.nbytes)
    return result, interrupted


def _session(
    inp: TrainSegmentInput, attempt: int, store: Store, key: str, tiered: TieredStore | None
) -> tuple[TrainingSession, str]:
    """The segment's session and where its state came from (``memory``: warm, the one this
    worker holds when it is exactly the run's latest commit — first attempts only: after a
    failure, trust only the stores; else ``local``, ``durable`` or ``fresh``): the checkpoint
    a rollback names (from the durable store), or the latest (``cairn.runs.tier_restore``
    with a node-local tier)."""
    options = CheckpointOptions.from_env(**({} if inp.incremental is None else {"incremental": inp.incremental}))
    held = WARM.take(inp.run_id, key)
    if held is not None and inp.resume_from is None and attempt == 1:
        latest = latest_committed(store, inp.run_id)
        step: int | None = None if latest is None else latest.step
        fingerprint: str | None = None
        if latest is not None:
            fingerprint = read_manifest(store, latest, expect_kind=None, expand_index=False).fingerprint
        newest = tiered.newest(inp.run_id) if tiered is not None else None
        if newest is not None and (step is None or newest.ref.step > step):  # committed here, not uploaded yet
            step, fingerprint = newest.ref.step, newest.fingerprint
        if held.matches(step, fingerprint):
            held.session.store = tiered or store
            return held.session, "memory"
        log.info("run %s: the state held in memory is not the latest commit: restoring", inp.run_id)
    if inp.resume_from is not None:  # a rollback: this older checkpoint, not the latest
        session = TrainingSession.fresh(inp.run_id, store, inp.config, options=options)
        session.restore(CheckpointRef.parse(inp.resume_from))
        session.store = tiered or store
        return session, "durable"
    if tiered is not None:
        return resume_tiered(inp.run_id, tiered, store, inp.config, options=options)
    session = TrainingSession.resume_latest(inp.run_id, store, inp.config, options=options)
    return session, "durable" if session.restored_from is not None else "fresh"


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
            ref = latest_committed(store, inp.run_id)
            numerics_id = None if inp.numerics is None else profile_id(inp.numerics)
            if ref is None:
                return OpenRunResult(
                    store_id=store_id, checkpoint=None, step=0, fingerprint=None, numerics_id=numerics_id, **about
                )
            manifest = read_manifest(store, ref, expect_kind=None, expand_index=False)
            if trainer is not None:  # another model or trainer on this run id: say which field, before its length
                check_checkpoint_config(manifest_config(manifest), trainer.config)
            recorded = manifest.lineage.numerics if manifest.lineage is not None else None
            if recorded is not None and recorded.profile == inp.numerics:
                numerics_id = recorded.id  # stay with the workers that computed the run so far
            return OpenRunResult(
                store_id=store_id,
                checkpoint=str(ref),
                step=ref.step,
                fingerprint=manifest.fingerprint,
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
        if inp.at_or_before is None:
            ref = latest_committed(store, inp.run_id)
        else:
            refs = [
                r for r in list_checkpoints(store, inp.run_id, CheckpointKind.TRAINING) if r.step <= inp.at_or_before
            ]
            ref = refs[-1] if refs else None
        if ref is None:
            return LatestCheckpointResult(checkpoint=None, step=0, fingerprint=None)
        manifest = read_manifest(store, ref, expect_kind=None, expand_index=False)
        return LatestCheckpointResult(checkpoint=str(ref), step=ref.step, fingerprint=manifest.fingerprint)


@activity.defn(name="collect_checkpoints")
def collect_checkpoints(inp: CollectInput) -> int:
    """Apply retention; returns how many checkpoints were deleted."""
    with run_context(inp.run_id), activity_errors(), Heartbeater(heartbeat_interval(), phase="collecting"):
        store = open_run_store(inp.store, inp.store_id)
        faults.maybe_crash("in-activity", tag="collect_checkpoints")
        spec = inp.retention
        policy = RetentionPolicy(keep_last=spec.keep_last, keep_every=spec.keep_every, grace_seconds=spec.grace_seconds)
        plan = collect_garbage(store, inp.run_id, policy)
        if plan.delete or plan.orphans:
            log.info(
                "run %s: retention deleted %d checkpoint(s), %d orphan object(s)",
                inp.run_id,
                len(plan.delete),
                len(plan.orphans),
            )
        return len(plan.delete)


TRAINING_ACTIVITIES = [train_segment, open_run, latest_checkpoint, collect_checkpoints]
