"""The workflow's input and carry (``activities.inputs``): bad gang inputs and a relative store are
refused before anything runs, and the carry stays bounded."""

from __future__ import annotations

import json

import pytest

from activities.inputs import RunCarry, TrainingRunInput, TrainSegmentResult
from cairn.gang.job import RankResult
from cairn.runs.outcome import SegmentOutcome
from cairn.session import TrainingSession
from cairn.stores import MemoryStore
from tests.conftest import REPO, dist_config, small_config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"world_size": 3},
            r"world_size must divide config.distributed.microbatches \(8\) \(expected one of \[1, 2, 4, 8\], found 3\)",
        ),
        ({"world_size": 2, "config": small_config().model_dump(mode="json")}, "needs config.distributed"),
        ({"world_size": 4, "nodes": ["a", "b", "c"]}, "multiple of len"),
        ({"world_size": 4, "nodes": ["a", "a"]}, "distinct"),
        ({"world_size": 2, "nodes": ["bad name"]}, "pattern"),
        ({"world_size": 2, "nodes": [""]}, "pattern"),  # `--nodes ""` / `--nodes a,,b`: refused, not dropped
        (
            {"world_size": 2, "min_world_size": 4},
            r"reachable by halving world_size \(expected one of \[2, 1\], found 4\)",
        ),
        ({"world_size": 4, "min_world_size": 3}, r"expected one of \[4, 2, 1\], found 3"),  # 4 -> 2 skips 3
    ],
)
def test_bad_gang_inputs_are_refused_before_anything_runs(overrides: dict, message: str) -> None:
    body = {
        "run_id": "r1",
        "config": dist_config().model_dump(mode="json"),
        "total_steps": 10,
        "store": "/tmp/cairn-never-used",
    }
    body.update(overrides)
    with pytest.raises(ValueError, match=message):
        TrainingRunInput.model_validate(body)


def test_workflow_input_refuses_a_relative_store() -> None:
    body = json.loads((REPO / "examples" / "run.json").read_text())
    body["store"] = "relative/dir"
    with pytest.raises(ValueError, match="relative path"):
        TrainingRunInput.model_validate(body)


def test_carry_stays_bounded() -> None:
    carry = RunCarry()
    for attempt in [1] * 100 + [3]:
        carry.record_segment(attempt)
    assert carry.segments == 101 and carry.retried_segments == 1
    assert len(carry.attempts) == 32 and carry.attempts[-1] == 3
    assert len(RunCarry(attempts=[1] * 500).attempts) == 32


def test_a_segments_result_and_a_ranks_are_one_flat_outcome() -> None:
    """Both results inherit the outcome's fields (``cairn.runs.outcome``): the payload stays the
    flat JSON the recorded histories hold, and the state's part is read in one place."""
    shared = {"step", "cursor", "checkpoint", "fingerprint", "loss", "val_loss", "val_accuracy", "resumed_from_step"}
    assert set(SegmentOutcome.model_fields) == shared
    assert shared < set(TrainSegmentResult.model_fields) and shared < set(RankResult.model_fields)
    state = TrainingSession.fresh("outcome", MemoryStore("outcome"), small_config()).state
    state.history["loss"] = [2.0, 1.5]
    result = TrainSegmentResult.of(
        state, checkpoint="c", fingerprint="f", resumed_from_step=0, attempt=1, recomputed_steps=0
    )
    assert (result.step, result.cursor, result.loss, result.val_loss) == (state.step, state.cursor, 1.5, None)
    assert set(json.loads(result.model_dump_json())) == shared | {
        "attempt",
        "recomputed_steps",
        "warm",
        "saves",
        "blocked_save_seconds",
        "train_seconds",
        "worker_queue",
        "compression",
        "durable_checkpoint",
        "durable_step",
    }
