"""The run's carry (``workflows.run_state``): both cursors — the checkpoint a segment reported
(maybe local-only) and the durable one — reach the progress query, the summary and its text."""

from __future__ import annotations

from typing import Any

from activities.models import RunCarry, TrainingRunInput, TrainSegmentResult
from workers.cli.temporal import summary_text
from workflows import run_state

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
