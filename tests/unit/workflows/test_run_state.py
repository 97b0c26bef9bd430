"""The run's carry (``workflows.run_state``): both cursors — the checkpoint a segment reported
(maybe local-only) and the durable one — reach the progress query, the summary and its text."""

from __future__ import annotations

from typing import Any

import pytest
from temporalio.exceptions import ApplicationError

from activities.inputs import OpenRunResult, RunCarry, TrainingRunInput, TrainSegmentResult
from workers.cli.temporal import summary_text
from workflows import run_state, segments

LOCAL = "/s/r/training/000000000020"
DURABLE = "/s/r/training/000000000015"


def _inp() -> TrainingRunInput:
    return TrainingRunInput.model_validate({"run_id": "r", "config": {"seed": 1}, "total_steps": 40, "store": "/s"})


def _result(**fields: Any) -> TrainSegmentResult:
    body = {"step": 20, "cursor": 40, "checkpoint": LOCAL, "fingerprint": "sha256:" + "0" * 64, "loss": 1.0}
    return TrainSegmentResult(**{**body, "attempt": 1, "resumed_from_step": 0, "recomputed_steps": 0, **fields})


def test_the_carry_knows_both_cursors() -> None:
    carry = RunCarry()
    run_state.record_result(carry, _result(durable_checkpoint=DURABLE, durable_step=15), _inp())
    progress = run_state.progress(_inp(), carry, "training")
    assert (progress.checkpoint, progress.durable_checkpoint, progress.durable_step) == (LOCAL, DURABLE, 15)
    summary = run_state.summary(_inp(), carry)
    assert (summary.durable_checkpoint, summary.durable_step) == (DURABLE, 15)
    assert f"durable      {DURABLE} (upload of the newer one pending)" in summary_text(summary)


def test_an_older_workers_result_is_durable_as_reported() -> None:
    carry = RunCarry()
    run_state.record_result(carry, _result(), _inp())
    assert (carry.durable_checkpoint, carry.durable_step) == (LOCAL, 20)
    assert "durable      the same (uploaded)" in summary_text(run_state.summary(_inp(), carry))


def test_the_workflows_refusals_are_typed_as_the_activities_are() -> None:
    """The workflow refuses through the one conversion of a Cairn error: its type name, one
    line, non-retryable as the class declares."""
    by_epochs = TrainingRunInput.model_validate(
        {"run_id": "r", "config": {"seed": 1}, "total_epochs": 2, "store": "/s", "segment": {"epochs": 1}}
    )
    opened = OpenRunResult(store_id="s", checkpoint=None, step=0, fingerprint=None)
    with pytest.raises(ApplicationError) as unknown:
        run_state.adopt_length(RunCarry(), by_epochs, opened)
    assert (unknown.value.type, unknown.value.non_retryable) == ("ConfigError", True)
    assert unknown.value.message == (
        "total_epochs: this worker's open_run did not report the epoch length; give total_steps"
    )
    with pytest.raises(ApplicationError) as past:
        run_state.adopt_length(RunCarry(), _inp(), opened.model_copy(update={"step": 41}))
    assert (past.value.type, past.value.non_retryable) == ("InvariantError", True)
    assert past.value.message == "run r already has a committed checkpoint at step 41, past total_steps=40"
    with pytest.raises(ApplicationError) as epochs:
        segments.segment_end(by_epochs, RunCarry())
    assert (epochs.value.type, epochs.value.non_retryable) == ("ConfigError", True)
    assert epochs.value.message.startswith("segment.epochs: this worker's open_run did not report the epoch length")
