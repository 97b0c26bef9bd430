"""The workflow's input and carry (``activities.models``): bad gang inputs and a relative store are
refused before anything runs, and the carry stays bounded."""

from __future__ import annotations

import json

import pytest

from activities.models import RunCarry, TrainingRunInput
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
