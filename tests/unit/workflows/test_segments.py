"""Pure segment policy (``workflows.segments``): when a boundary starts a retention pass."""

from __future__ import annotations

from typing import Any

import pytest

from activities.models import TrainingRunInput
from workflows import segments


def run_input(**retention: Any) -> TrainingRunInput:
    body: dict[str, Any] = {
        "run_id": "r",
        "config": {"seed": 1},
        "total_steps": 10,
        "store": "/tmp/x",
        "retention": retention or None,
    }
    return TrainingRunInput.model_validate(body)


def test_no_retention_never_collects() -> None:
    assert not segments.collect_due(run_input(), in_flight=False, since_last=None)


def test_a_pass_in_flight_is_never_joined_by_another() -> None:
    inp = run_input(keep_last=3, grace_seconds=3600)
    assert not segments.collect_due(inp, in_flight=True, since_last=None)
    assert not segments.collect_due(inp, in_flight=True, since_last=10_000.0)


@pytest.mark.parametrize(
    ("spec", "since", "due"),
    [
        ({"grace_seconds": 3600}, None, True),  # the first boundary of a run
        ({"grace_seconds": 3600}, 59.9, False),  # default pacing: min(60, grace)
        ({"grace_seconds": 3600}, 60.0, True),
        ({"grace_seconds": 5}, 4.0, False),  # a short grace paces by the grace
        ({"grace_seconds": 5}, 5.0, True),
        ({"grace_seconds": 3600, "every_seconds": 0}, 0.0, True),  # every boundary, as before
        ({"grace_seconds": 3600, "every_seconds": 600}, 599.0, False),
    ],
)
def test_paced_by_every_seconds(spec: dict[str, Any], since: float | None, due: bool) -> None:
    assert segments.collect_due(run_input(keep_last=3, **spec), in_flight=False, since_last=since) is due


def test_every_seconds_is_validated() -> None:
    with pytest.raises(ValueError, match="every_seconds"):
        run_input(keep_last=3, every_seconds=-1)
