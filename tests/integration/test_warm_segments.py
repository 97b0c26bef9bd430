"""Warm segments and time-sized segments on a real Temporal server: a run's next segment goes to
the worker that holds its state and continues from memory (the results say which path ran);
with the cache off every segment restores; both end on the same bits as an uninterrupted run.
A segment sized in seconds ends at a step boundary past its budget, with a checkpoint."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.views import RunSummary
from cairn.stores import LocalStore
from tests.integration.conftest import (
    TemporalServer,
    assert_matches_reference,
    kill_after_commit,
    run_input,
    start_worker_process,
)
from tests.integration.test_training_run import activity_results
from workers.worker import serving
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration


async def test_segments_continue_warm_on_the_worker_that_holds_the_run(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    inp = run_input(tmp_path, total_steps=40, steps_per_segment=10)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        summary = RunSummary.model_validate(await handle.result())
        results = await activity_results(handle)
    assert [r["warm"] for r in results] == [False, True, True, True]  # one restore, then memory
    assert len({r["worker_queue"] for r in results}) == 1 and "#w-" in results[0]["worker_queue"]
    assert summary.segments == 4 and summary.attempts == [1, 1, 1, 1]
    assert_matches_reference(summary, inp.config)


async def test_with_the_cache_off_every_segment_restores_to_the_same_bits(
    client: Client, task_queue: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("activities.training.WARM.capacity", 0)
    inp = run_input(tmp_path, total_steps=40, steps_per_segment=10)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        summary = RunSummary.model_validate(await handle.result())
        results = await activity_results(handle)
    assert [r["warm"] for r in results] == [False] * 4
    assert_matches_reference(summary, inp.config)


async def test_segments_sized_in_seconds_end_past_their_budget_with_a_checkpoint(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    inp = run_input(
        tmp_path, total_steps=30, steps_per_segment=None, segment={"seconds": 0.3}, throttle_seconds_per_step=0.05
    )
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        summary = RunSummary.model_validate(await handle.result())
        results = await activity_results(handle)
    assert summary.steps == 30 and summary.segments == len(results) >= 3  # 30 x 50 ms in 0.3 s budgets
    assert all(r["step"] - r["resumed_from_step"] <= 10 for r in results)  # ~6 steps each, never the rest
    assert [r["warm"] for r in results][1:] == [True] * (len(results) - 1)
    assert_matches_reference(summary, inp.config)


async def test_with_two_workers_the_run_stays_on_the_one_that_holds_it(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    """Without the routing, each of the 7 later segments would go to either worker (both poll
    the run's queue): all on the first by chance is 1 in 128."""
    workers = [start_worker_process(temporal_server.address, task_queue, tmp_path / f"w{i}.log") for i in range(2)]
    try:
        inp = run_input(tmp_path, total_steps=40, steps_per_segment=5)
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
        results = await activity_results(handle)
    finally:
        for w in workers:
            w.stop()
    assert [r["warm"] for r in results] == [False] + [True] * 7
    assert len({r["worker_queue"] for r in results}) == 1
    assert_matches_reference(summary, inp.config)


async def test_an_attempt_lost_on_the_warm_workers_queue_is_counted_when_another_worker_retries_it(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    """The worker holding the run dies in its second (warm-routed) segment: the retry waits on its
    queue, is not picked up there, and is re-offered to every worker — still as attempt 2, with
    how far the lost attempt got carried to the retry (what users see is what happened)."""
    inp = run_input(
        tmp_path, total_steps=60, steps_per_segment=20, throttle_seconds_per_step=0.05, heartbeat_timeout_seconds=2
    )
    first = start_worker_process(temporal_server.address, task_queue, tmp_path / "a.log")
    second = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        # in the second segment, some steps past a commit (a checkpoint every 5 steps of 50 ms)
        await kill_after_commit(first, LocalStore(inp.store), inp.run_id, 25, after=0.15)
        second = start_worker_process(temporal_server.address, task_queue, tmp_path / "b.log")
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert summary.attempts == [1, 2, 1] and summary.retried_segments == 1
    # the lost attempt's last heartbeat (at most a throttle interval stale) reached the retry
    assert "an earlier attempt had reached step" in (tmp_path / "b.log").read_text()
    assert summary.recomputed_steps <= inp.checkpoint.every
    assert_matches_reference(summary, inp.config)
