"""TrainingRun on a real Temporal dev server: completion, crash resume, CLI start, control,
continue-as-new and replay."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.worker import Replayer

from activities.converter import DATA_CONVERTER
from activities.inputs import TrainingRunInput
from activities.views import RunSummary
from cairn.checkpoint import latest_committed, list_checkpoints, read_manifest
from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig
from cairn.effects import load_journal
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.conftest import REPO, small_config
from tests.integration.conftest import (
    TemporalServer,
    assert_matches_reference,
    cli,
    reference,
    run_input,
    start_worker_process,
    wait_progress,
)
from workers.cli.temporal import live_step
from workers.stack.servers import ServerProcess
from workers.worker import WORKFLOWS, serving
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration


async def test_run_completes_bit_identical(client: Client, task_queue: str, tmp_path: Path) -> None:
    inp = run_input(tmp_path)
    async with serving(client, task_queue):
        summary = await client.execute_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
    assert summary.steps == 40 and not summary.stopped_early
    assert summary.attempts == [1, 1, 1] and summary.recomputed_steps == 0
    assert summary.segments == 3 and summary.retried_segments == 0
    assert_matches_reference(summary, inp.config)


async def activity_results(handle: WorkflowHandle[Any, Any]) -> list[dict[str, Any]]:
    """Decoded results of every completed train_segment in this run's history."""
    out = []
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            payloads = event.activity_task_completed_event_attributes.result.payloads
            if payloads:
                value = json.loads(payloads[0].data)
                if isinstance(value, dict) and "resumed_from_step" in value:
                    out.append(value)
    return out


@pytest.mark.drill
async def test_sigkilled_worker_is_replaced_and_run_resumes(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    inp = run_input(tmp_path, total_steps=60, steps_per_segment=60, throttle_seconds_per_step=0.05)
    store = LocalStore(inp.store)
    first = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-a.log")
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        deadline = time.monotonic() + 60
        while True:  # wait until the segment is well underway, with checkpoints committed
            ref = latest_committed(store, inp.run_id)
            if ref is not None and ref.step >= 12:
                break
            assert time.monotonic() < deadline, first.log_tail()
            await asyncio.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)  # a lost machine: no cleanup, no completion
        first.proc.wait(timeout=10)  # type: ignore[union-attr]
        durable_at_kill = latest_committed(store, inp.run_id)
        assert durable_at_kill is not None
        second = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-b.log")
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert summary.steps == 60 and summary.attempts[0] >= 2, summary
    assert summary.recomputed_steps <= inp.checkpoint.every
    [segment] = await activity_results(handle)
    # The retry resumed from the last durable cursor — not the segment's start (0).
    assert segment["resumed_from_step"] >= durable_at_kill.step >= 12
    assert segment["attempt"] >= 2
    assert_matches_reference(summary, inp.config)


def temporal_start(address: str, task_queue: str, workflow_id: str, input_file: Path) -> None:
    """`temporal workflow start --input-file`: what a user (or the Web UI's form) sends."""
    from workers.stack.servers import find_binary

    subprocess.run(
        [
            find_binary("temporal"),
            "workflow",
            "start",
            "--type",
            "TrainingRun",
            "--task-queue",
            task_queue,
            "--workflow-id",
            workflow_id,
            "--input-file",
            str(input_file),
            "--address",
            address,
        ],
        check=True,
        capture_output=True,
    )


async def test_run_started_with_temporal_cli(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    """examples/run.json through `temporal workflow start --input-file`, its store pointed at a
    temporary directory (tests never write into the checkout)."""
    example = json.loads((REPO / "examples" / "run.json").read_text())
    example["store"] = str(tmp_path / "store")
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps(example))
    workflow_id = f"cli-{uuid.uuid4().hex[:8]}"
    async with serving(client, task_queue):
        temporal_start(temporal_server.address, task_queue, workflow_id, run_file)
        result = await client.get_workflow_handle(workflow_id).result()
    summary = RunSummary.model_validate(result)
    assert summary.steps == example["total_steps"] and summary.run_id == example["run_id"]
    assert_matches_reference(summary, TrainConfig.model_validate(example["config"]))


@pytest.mark.parametrize(
    "edit, needle",
    [
        (lambda body: body["checkpoint"].update(evry=10), "checkpoint.evry"),
        (lambda body: body.update(store=".cairn/store"), "relative path"),
        (lambda body: body.update(store="ftp://host/x"), "unsupported scheme"),
        (lambda body: body["config"]["model"].update(kind="transformer"), "config.model.kind"),
        (lambda body: body["config"]["optimizer"].update(lr="fast"), "config.optimizer.lr"),
    ],
    ids=["typo", "relative-store", "bad-scheme", "unknown-model", "bad-type"],
)
async def test_bad_input_fails_the_run_at_once(
    client: Client,
    temporal_server: TemporalServer,
    task_queue: str,
    tmp_path: Path,
    edit: Any,
    needle: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A run started with a malformed input (the `temporal` CLI, the Web UI) ends FAILED within
    seconds with the field named, instead of retrying its workflow task forever."""
    body = json.loads((REPO / "examples" / "run.json").read_text())
    body["store"] = str(tmp_path / "store")
    edit(body)
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps(body))
    workflow_id = f"bad-{uuid.uuid4().hex[:8]}"
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    async with serving(client, task_queue):
        temporal_start(temporal_server.address, task_queue, workflow_id, run_file)
        handle = client.get_workflow_handle(workflow_id)
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), timeout=20)
        # With a worker polling, status never queries a closed run (the worker would log the SDK's
        # "Expected workflow input" traceback replaying it); journal asks the run, which cannot
        # answer: its input never decoded. It says so in a line (was: the SDK's 60-line traceback).
        # In a thread: the commands run their own event loop, and this one serves the worker.
        caplog.clear()
        status = await asyncio.to_thread(cli, "run", "status", workflow_id, env=env, check=False)
        assert "Expected workflow input" not in caplog.text  # no query reached the worker
        journal = await asyncio.to_thread(cli, "run", "journal", workflow_id, env=env, check=False)
    assert status.returncode == 0 and "Traceback" not in status.stderr, status.stderr
    assert f"{workflow_id}: FAILED" in status.stdout and needle in status.stdout, status.stdout
    assert journal.returncode == 5 and "cannot answer queries (its input never decoded" in journal.stderr, (
        journal.stderr
    )
    assert len(journal.stderr.strip().splitlines()) == 1, journal.stderr
    cause = failed.value.cause
    assert getattr(cause, "type", None) == "ConfigError", cause
    message = str(cause)
    assert needle in message and "\n" not in message, message
    assert (await handle.describe()).status == WorkflowExecutionStatus.FAILED
    assert not (tmp_path / "store").exists()  # nothing was trained or written


async def segment_underway(handle: WorkflowHandle[Any, Any], step: int = 10) -> None:
    """Wait until a segment is underway: the server has a heartbeat from it at ``step`` or later,
    so a control signal sent now lands mid-segment, after step 0."""
    deadline = time.monotonic() + 60
    while (seen := live_step(await handle.describe()) or 0) < step:
        assert time.monotonic() < deadline, seen
        await asyncio.sleep(0.05)


def control_input(tmp_path: Path, **kw: Any) -> TrainingRunInput:
    # Checkpoints only at segment ends (every=1000), so a checkpoint anywhere else was made by
    # the control action itself.
    body: dict[str, Any] = {
        "total_steps": 100,
        "steps_per_segment": 50,
        "checkpoint": {"every": 1000},
        "throttle_seconds_per_step": 0.05,
    }
    body.update(kw)
    return run_input(tmp_path, **body)


async def test_pause_checkpoints_and_resume_completes(client: Client, task_queue: str, tmp_path: Path) -> None:
    inp = control_input(tmp_path)
    store = LocalStore(inp.store)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await segment_underway(handle)
        await handle.signal(TrainingRun.pause)
        paused = await wait_progress(handle, lambda p: p["phase"] == "paused")
        step = paused["step"]
        assert 0 < step < 50  # checkpointed mid-segment
        assert latest_committed(store, inp.run_id).step == step  # type: ignore[union-attr]
        await asyncio.sleep(1.0)  # deliberate: a window in which a run that did not pause would move on
        assert (await handle.query(TrainingRun.progress)).step == step  # really paused
        assert live_step(await handle.describe()) is None  # and no segment is running (heartbeating)
        await handle.signal(TrainingRun.resume)
        summary = RunSummary.model_validate(await handle.result())
    assert summary.steps == 100 and not summary.stopped_early
    assert_matches_reference(summary, inp.config)


async def test_a_pause_signalled_before_the_run_opened_is_kept(client: Client, task_queue: str, tmp_path: Path) -> None:
    """Signalled before any worker ran the workflow (so before ``open_run`` returned): the run
    opens, pauses before its first segment, and completes after ``resume``."""
    inp = control_input(tmp_path)
    handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
    await handle.signal(TrainingRun.pause)  # nobody polls the task queue yet
    async with serving(client, task_queue):
        opened = await wait_progress(handle, lambda p: p["phase"] != "starting")
        assert (opened["phase"], opened["step"]) == ("paused", 0)  # a dropped pause shows "training" here
        assert live_step(await handle.describe()) is None  # no segment was started
        await handle.signal(TrainingRun.resume)
        summary = RunSummary.model_validate(await handle.result())
    assert summary.steps == 100 and not summary.stopped_early
    assert_matches_reference(summary, inp.config)


async def test_checkpoint_now_then_carry_on(client: Client, task_queue: str, tmp_path: Path) -> None:
    inp = control_input(tmp_path)
    store = LocalStore(inp.store)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await segment_underway(handle)
        await handle.signal(TrainingRun.checkpoint_now)
        summary = RunSummary.model_validate(await handle.result())
    steps = [r.step for r in list_checkpoints(store, inp.run_id)]
    assert any(s not in (0, 50, 100) for s in steps), steps  # the extra, signalled checkpoint
    assert summary.steps == 100
    assert_matches_reference(summary, inp.config)


async def test_stop_is_graceful(client: Client, task_queue: str, tmp_path: Path) -> None:
    inp = control_input(tmp_path)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await segment_underway(handle)
        await handle.signal(TrainingRun.stop)
        summary = RunSummary.model_validate(await handle.result())
    assert summary.stopped_early and 0 < summary.steps < 50
    assert summary.checkpoint and summary.checkpoint.endswith(f"{summary.steps:012d}")
    assert_matches_reference(summary, inp.config)


async def test_cancel_checkpoints_before_stopping(client: Client, task_queue: str, tmp_path: Path) -> None:
    inp = control_input(tmp_path)
    store = LocalStore(inp.store)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await segment_underway(handle)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    latest = latest_committed(store, inp.run_id)
    assert latest is not None and 0 < latest.step < 50  # committed at cancellation, mid-segment
    state, _ = load_training(store, latest)
    assert compare_states(state, reference(inp.config, latest.step).state) == []


async def test_long_run_continues_as_new_with_bounded_history(client: Client, task_queue: str, tmp_path: Path) -> None:
    inp = run_input(tmp_path, total_steps=36, steps_per_segment=3, segments_per_run=3, checkpoint={"every": 3})
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        summary = RunSummary.model_validate(await handle.result())
        lengths = await history_lengths(client, inp.run_id, handle.first_execution_run_id)  # type: ignore[arg-type]
    assert summary.steps == 36 and summary.continued_as_new == 3
    assert len(lengths) == 4
    # Per run: at most segments_per_run segments, each a bounded number of events.
    bound = 20 * inp.segments_per_run + 20
    assert max(lengths) <= bound, lengths
    assert_matches_reference(summary, inp.config)


async def history_lengths(client: Client, workflow_id: str, first_run_id: str) -> list[int]:
    lengths = []
    run_id: str | None = first_run_id
    while run_id:
        handle = client.get_workflow_handle(workflow_id, run_id=run_id)
        events = [e async for e in handle.fetch_history_events()]
        lengths.append(len(events))
        last = events[-1]
        run_id = None
        if last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
    return lengths


async def test_replay_recorded_histories(client: Client, task_queue: str, tmp_path: Path) -> None:
    """Histories recorded on the real server replay deterministically with the SDK's Replayer."""
    inp = control_input(tmp_path, steps_per_segment=20, total_steps=40, segments_per_run=1)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await segment_underway(handle, step=3)  # the signals land in the first segment's history
        await handle.signal(TrainingRun.checkpoint_now)
        await handle.signal(TrainingRun.pause)
        await wait_progress(handle, lambda p: p["phase"] == "paused")
        await handle.signal(TrainingRun.resume)
        await handle.result()
    replayer = Replayer(workflows=WORKFLOWS, data_converter=DATA_CONVERTER)
    histories = client.list_workflows(f"WorkflowId = '{inp.run_id}'")
    count = 0
    async for history in histories.map_histories():
        result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
        assert result.replay_failure is None
        count += 1
    assert count >= 2  # continued-as-new at least once: several runs replayed


@pytest.mark.drill
async def test_sigterm_worker_checkpoints_and_hands_back(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    """Graceful shutdown: the running segment commits a checkpoint at its current step (not a
    multiple of checkpoint.every) and another worker finishes the run, bit-identical."""
    inp = run_input(
        tmp_path, total_steps=80, steps_per_segment=80, checkpoint={"every": 1000}, throttle_seconds_per_step=0.04
    )
    store = LocalStore(inp.store)
    first = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-a.log")
    second: ServerProcess | None = None
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await segment_underway(handle)  # training, past step 0
        os.kill(first.pid, signal.SIGTERM)
        assert first.proc is not None
        await asyncio.get_running_loop().run_in_executor(None, first.proc.wait, 60)
        handed_back = latest_committed(store, inp.run_id)
        assert handed_back is not None and 0 < handed_back.step < 80, first.log_tail()
        second = start_worker_process(temporal_server.address, task_queue, tmp_path / "worker-b.log")
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=120))
    finally:
        first.stop()
        if second is not None:
            second.stop()
    assert summary.attempts == [2] and summary.steps == 80
    [segment] = await activity_results(handle)
    assert segment["resumed_from_step"] == handed_back.step
    assert_matches_reference(summary, inp.config)


async def test_a_rollback_by_more_than_a_segment_replays_to_the_end(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    """Rolled back from past step 60 to step 10 with segments of 20 and every checkpoint kept:
    the run replays from 10, each segment from the commit the previous one made (not from the
    run's latest commit, which is still the pre-rollback one, past the segment's target), and
    ends on the bits of the uninterrupted run."""
    inp = control_input(tmp_path, total_steps=80, steps_per_segment=20, checkpoint={"every": 10})
    store = LocalStore(inp.store)
    async with serving(client, task_queue):
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await wait_progress(handle, lambda p: p["step"] >= 60, timeout=120)
        await handle.signal(TrainingRun.rollback, 10)
        summary = RunSummary.model_validate(await handle.result())
    [decision] = [e for e in load_journal(store, inp.run_id).entries if e.kind == "decision"]
    assert decision.detail["to_step"] == 10 and decision.detail["from_step"] >= 60, decision
    assert summary.steps == 80 and not summary.stopped_early
    assert_matches_reference(summary, inp.config)


async def test_a_compressed_run_reports_its_choice_and_ends_on_the_raw_runs_fingerprint(
    client: Client, task_queue: str, tmp_path: Path
) -> None:
    """``checkpoint.compression: zstd``: every checkpoint's large tensors are stored in frames,
    the summary says so, and the run ends on the fingerprint and bits of an uncompressed
    in-process run (the fingerprint covers logical bytes, never the codec)."""
    config = small_config(
        model={"kind": "mlp", "hidden": 512, "init_scale": 1.0, "version": "mlp-v1"},
        data={"source": "synthetic", "seed": 11, "n_examples": 256, "n_features": 64, "n_classes": 3,
              "noise": 0.6, "version": "synthetic-v1"},
    )  # fmt: skip
    inp = run_input(
        tmp_path, config=config.model_dump(mode="json"), total_steps=20, checkpoint={"every": 5, "compression": "zstd"}
    )
    async with serving(client, task_queue):
        summary = await client.execute_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
    assert summary.compression is not None and summary.compression.compress, summary.compression
    assert summary.compression.mode == "zstd"
    store = LocalStore(inp.store)
    for ref in list_checkpoints(store, inp.run_id):
        manifest = read_manifest(store, ref, expect_kind=None)
        assert any(t.encoding is not None for t in manifest.tensors), ref  # theta/W1, Adam m, v of W1
    assert_matches_reference(summary, inp.config)
