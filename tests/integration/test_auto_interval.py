"""``checkpoint.every: "auto"`` on a real Temporal dev server: the interval is chosen from what
the run measured, shown in its summary, and changes no bit of the training."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from activities.views import RunSummary
from cairn.checkpoint import CheckpointKind, CheckpointRef, list_checkpoints, read_manifest
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint_interval import IntervalChoice, daly_seconds
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.integration.conftest import assert_matches_reference, reference, run_input
from workers.reports.timeline import run_history
from workers.worker import serving
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration


async def test_auto_interval_is_measured_shown_and_bit_identical(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    auto = {"start_every": 7, "prior_mtbf_seconds": 1.0, "max_steps": 40, "max_seconds": None}
    inp = run_input(
        tmp_path,
        total_steps=90,
        steps_per_segment=30,
        checkpoint={"every": "auto", "auto": auto},
        throttle_seconds_per_step=0.01,
        retention=None,
    )
    async with serving(client, task_queue):
        result = await client.execute_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
    summary = RunSummary.model_validate(result)
    assert summary.steps == 90
    assert_matches_reference(summary, inp.config)  # the interval changes when it commits, not what
    first, *measured = summary.checkpoint_interval
    assert (first.step, first.every, first.bound) == (0, 7, "unmeasured")
    assert measured, summary.checkpoint_interval  # the first segment's figures moved it
    for c in measured:
        assert c.save_seconds and c.step_seconds and c.optimum_seconds
        assert c.step_seconds >= 0.01  # the throttle is training time; saves are not
        assert c.optimum_seconds == pytest.approx(daly_seconds(c.save_seconds, c.mtbf_seconds))
        want = min(40, max(1, round(c.optimum_seconds / c.step_seconds)))
        assert c.every == want and c.bound == ("max_steps" if want == 40 else None)
        assert c.failures == 0 and c.exposure_seconds > 0.3  # 30 steps of >= 10 ms, and the prior
    assert summary.checkpoint_every == summary.checkpoint_interval[-1].every
    # The report shows the interval over the run (from the segments' inputs) and why (the choices).
    facts = await run_history(client, inp.run_id)
    assert facts.intervals == [(c.step, c.every) for c in summary.checkpoint_interval]
    assert [IntervalChoice.model_validate(c) for c in facts.interval_choices] == summary.checkpoint_interval


async def test_a_fixed_interval_reports_itself(client: Client, task_queue: str, tmp_path: Path) -> None:
    inp = run_input(tmp_path, total_steps=20, steps_per_segment=20)
    async with serving(client, task_queue):
        result = await client.execute_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
    summary = RunSummary.model_validate(result)
    assert summary.checkpoint_every == 5 and summary.checkpoint_interval == []


async def test_checkpoint_incremental_in_the_run_input_reaches_the_worker(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    """``checkpoint.incremental`` (not the worker's environment) makes the run's saves blocked
    and referencing (format v3); the bits are the uninterrupted run's."""
    inp = run_input(tmp_path, total_steps=30, steps_per_segment=15, checkpoint={"every": 5, "incremental": True})
    async with serving(client, task_queue):
        result = await client.execute_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
    summary = RunSummary.model_validate(result)
    store = LocalStore(inp.store)
    refs = list_checkpoints(store, inp.run_id, CheckpointKind.TRAINING)
    # v3 throughout
    assert refs and all(read_manifest(store, r, expect_kind=None, expand_index=False).indexes for r in refs)
    assert summary.checkpoint is not None
    state, _ = load_training(store, CheckpointRef.parse(summary.checkpoint))
    assert compare_states(state, reference(inp.config, 30).state) == []
