"""A TrainingRun's state: how its carry changes, and what the run reports from it.

The carry (``RunCarry``) is adopted from ``open_run``'s result, advanced by each segment's
result or interruption report, and moved back by a rollback; the ``progress`` query and the
run's ``RunSummary`` are read from it.

Pure state transitions for ``workflows.training_run``: no workflow calls, no I/O, no clock.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from workflows.segments import run_total

with workflow.unsafe.imports_passed_through():
    from activities.edge import as_application_error
    from activities.inputs import (
        LatestCheckpointResult,
        OpenRunResult,
        RunCarry,
        RunInfo,
        TrainingRunInput,
        TrainSegmentResult,
    )
    from cairn.errors import ConfigError, InvariantError
from activities.views import RunProgress, RunSummary

__all__ = [
    "opened",
    "adopt_length",
    "record_result",
    "record_interruption",
    "interruption_report",
    "rollback_detail",
    "roll_back",
    "info",
    "progress",
    "summary",
]


def opened(latest: OpenRunResult) -> RunCarry:
    """The carry of a run that ``open_run`` just opened: its last durable cursor."""
    return RunCarry(
        step=latest.step,
        checkpoint=latest.checkpoint,
        fingerprint=latest.fingerprint,
        durable_checkpoint=latest.checkpoint,
        durable_step=latest.step,
        store_id=latest.store_id,
        steps_per_epoch=latest.steps_per_epoch,
        reproducibility=latest.reproducibility,
        numerics_id=latest.numerics_id,
    )


def adopt_length(carry: RunCarry, inp: TrainingRunInput, latest: OpenRunResult) -> None:
    """Resolve the run's length (``total_epochs`` needs the trainer's epoch length) and refuse
    a run whose committed checkpoints are already past it."""
    if inp.total_epochs is not None:
        if latest.steps_per_epoch is None:
            raise as_application_error(
                ConfigError("total_epochs: this worker's open_run did not report the epoch length; give total_steps")
            )
        carry.total_steps = inp.total_epochs * latest.steps_per_epoch
    if latest.step > run_total(inp, carry):
        raise as_application_error(
            InvariantError(
                f"run {inp.run_id} already has a committed checkpoint at step {latest.step}, "
                f"past total_steps={run_total(inp, carry)}"
            )
        )


def record_result(carry: RunCarry, result: TrainSegmentResult, inp: TrainingRunInput) -> None:
    """A segment completed: its cursor, loss and evaluation become the run's; what it measured
    feeds ``checkpoint.every: "auto"`` (its failed attempts count as the run's failures)."""
    carry.record_segment(result.attempt)
    carry.recomputed_steps += result.recomputed_steps
    carry.step = result.step
    carry.checkpoint = result.checkpoint
    carry.fingerprint = result.fingerprint
    durable = result.durable_step is not None  # else an older worker: its checkpoint is durable
    carry.durable_checkpoint = result.durable_checkpoint if durable else result.checkpoint
    carry.durable_step = result.durable_step if result.durable_step is not None else result.step
    carry.loss = result.loss
    carry.warm_queue = result.worker_queue
    if result.compression is not None:
        carry.compression = result.compression
    if carry.interval is not None and inp.checkpoint.every == "auto":
        carry.interval.observe(
            inp.checkpoint.auto,
            saves=result.saves,
            blocked_seconds=result.blocked_save_seconds,
            steps=result.step - result.resumed_from_step,
            train_seconds=result.train_seconds,
            failures=result.attempt - 1,
        )
    if result.val_loss is not None:
        carry.val_loss = result.val_loss
        carry.val_accuracy = result.val_accuracy


def record_interruption(carry: RunCarry, latest: LatestCheckpointResult, cause: BaseException | None) -> None:
    """A segment was interrupted after committing: the run goes on from the latest checkpoint."""
    report = interruption_report(cause)
    carry.record_segment(report.get("attempt", 1))
    carry.recomputed_steps += report.get("recomputed_steps", 0)
    carry.step = latest.step
    carry.checkpoint = latest.checkpoint
    carry.fingerprint = latest.fingerprint
    carry.durable_checkpoint, carry.durable_step = latest.checkpoint, latest.step  # read from the durable store
    carry.warm_queue = None  # a pause, stop or rollback: the next segment restores


def interruption_report(cause: BaseException | None) -> dict[str, int]:
    """What an interrupted segment reported (attempt, recomputed steps); empty when it was
    cancelled before it could say."""
    if not isinstance(cause, ApplicationError):
        return {}
    details = cause.details[0] if cause.details else None
    if not isinstance(details, dict):
        return {}
    return {k: v for k, v in details.items() if k in ("attempt", "recomputed_steps") and isinstance(v, int)}


def rollback_detail(carry: RunCarry, wanted: int, found: LatestCheckpointResult) -> dict[str, object]:
    """What the journal records of a rollback to ``wanted``: where it went, or why it was
    refused, and the external effects it does not undo."""
    detail: dict[str, object] = {"from_step": carry.step, "requested_step": wanted}
    if found.checkpoint is None:
        detail["refused"] = f"no committed checkpoint at or before step {wanted} (retention may have removed it)"
    else:
        detail.update(to_step=found.step, checkpoint=found.checkpoint)
        if carry.reservation is not None:
            detail["reservation"] = carry.reservation.receipt
            detail["note"] = (
                f"training state restored to step {found.step}; reservation "
                f"{carry.reservation.receipt} is NOT returned: restoring a checkpoint never undoes "
                "an external effect"
            )
    return detail


def roll_back(carry: RunCarry, found: LatestCheckpointResult) -> None:
    """After the rollback is journaled: the next segment resumes from ``found`` (if any), and
    the segments after it from their predecessor's commit until the run is back where it was."""
    carry.rollbacks += 1
    if found.checkpoint is not None:
        if found.step < carry.step:
            carry.replay_until = max(carry.step, carry.replay_until or 0)
        carry.step = found.step
        carry.checkpoint = found.checkpoint
        carry.fingerprint = found.fingerprint
        carry.durable_checkpoint, carry.durable_step = found.checkpoint, found.step
        carry.resume_from = found.checkpoint


def replay_resume(carry: RunCarry) -> str | None:
    """The checkpoint the next segment resumes from while a rollback replays (the durable commit
    of the segment before it), else None (the run's latest commit, as usual). The run's latest
    commit is then still a pre-rollback one, past the segment's target; training is
    deterministic, so the replay reaches the very same states."""
    if carry.replay_until is None:
        return None
    if carry.step >= carry.replay_until or carry.durable_checkpoint is None:
        carry.replay_until = None
        return None
    return carry.durable_checkpoint


def info(inp: TrainingRunInput | None) -> RunInfo:
    """The ``info`` query's answer: where the run keeps its checkpoints and publishes."""
    if inp is None:
        return RunInfo(run_id="", store="")
    registry = inp.effects.registry if inp.effects else None
    return RunInfo(run_id=inp.run_id, store=inp.store, registry=registry)


def progress(inp: TrainingRunInput | None, carry: RunCarry, phase: str) -> RunProgress:
    """The ``progress`` query's answer."""
    return RunProgress(
        run_id=inp.run_id if inp else "",
        phase=phase,  # type: ignore[arg-type]
        step=carry.step,
        total=run_total(inp, carry) if inp else 0,
        loss=carry.loss,
        checkpoint=carry.checkpoint,
        durable_checkpoint=carry.durable_checkpoint,
        durable_step=carry.durable_step,
        attempts=list(carry.attempts),
        segments=carry.segments,
        retried_segments=carry.retried_segments,
        recomputed_steps=carry.recomputed_steps,
        continued_as_new=carry.continued_as_new,
        epoch=carry.step / spe if (spe := carry.steps_per_epoch) else None,
        steps_per_epoch=carry.steps_per_epoch,
        val_loss=carry.val_loss,
        val_accuracy=carry.val_accuracy,
        reproducibility=carry.reproducibility,
        world_size=carry.world_size or (inp.world_size if inp else 1),
        checkpoint_every=current_every(inp, carry),
    )


def current_every(inp: TrainingRunInput | None, carry: RunCarry) -> int | None:
    """The interval the run checkpoints at now (``"auto"``: its latest choice)."""
    if inp is None:
        return None
    every = inp.checkpoint.every
    return every if every != "auto" else carry.interval.every if carry.interval else None


def summary(inp: TrainingRunInput, carry: RunCarry) -> RunSummary:
    """The run's result."""
    return RunSummary(
        run_id=inp.run_id,
        checkpoint=carry.checkpoint,
        fingerprint=carry.fingerprint,
        durable_checkpoint=carry.durable_checkpoint,
        durable_step=carry.durable_step,
        steps=carry.step,
        total_steps=run_total(inp, carry),
        stopped_early=carry.step < run_total(inp, carry),
        attempts=list(carry.attempts),
        segments=carry.segments,
        retried_segments=carry.retried_segments,
        recomputed_steps=carry.recomputed_steps,
        continued_as_new=carry.continued_as_new,
        loss=carry.loss,
        effects=dict(carry.effects),
        val_loss=carry.val_loss,
        val_accuracy=carry.val_accuracy,
        reproducibility=carry.reproducibility,
        world_size=carry.world_size or (inp.world_size if inp else 1),
        checkpoint_every=current_every(inp, carry),
        checkpoint_interval=list(carry.interval.choices) if carry.interval else [],
        compression=carry.compression,
    )
