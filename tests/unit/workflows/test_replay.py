"""Workflow determinism across code changes: histories recorded with an earlier version of
`TrainingRun` must replay on the current code. A change to the workflow that would break
running workflows fails here; make it with `workflow.patched(...)` (see the README's
"Upgrading workers"), then record fresh histories next to the old ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from activities.converter import DATA_CONVERTER
from tests.conftest import FIXTURES
from workers.worker import WORKFLOWS

HISTORIES = sorted((FIXTURES / "histories").glob("*.json"))


def test_recorded_histories_exist() -> None:
    assert len(HISTORIES) >= 2  # a run that continued-as-new, with signals: pause, resume, checkpoint now


@pytest.mark.parametrize("path", HISTORIES, ids=[p.stem for p in HISTORIES])
async def test_recorded_history_replays_on_current_code(path: Path) -> None:
    history = WorkflowHistory.from_json("replay-fixture", path.read_text())
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, f"{path.name}: {result.replay_failure}"
