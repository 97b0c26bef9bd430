"""Distributed training for real: torchrun rank processes over gloo on loopback, SeaweedFS as
the store, Temporal as the orchestrator.

- W=4 and W=2 segments and a W=1 finish give exactly the W=1 reference's bits (save at W=4,
  resume at W=2, resume at W=1), through ranged reads of each rank's own blocks on S3;
- the exactness claim can fail: summing in rank order (a test-only switch) breaks W=4 vs W=1;
- a rank SIGKILLed mid-save leaves no committed checkpoint and no rank process; the retry
  converges on the same checkpoint;
- on Temporal, a two-node gang (2 workers x 2 ranks) trains bit-identically, a killed rank
  fails the whole gang, which is retried from the last commit, and a cancelled run leaves no
  rank process behind.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from activities.inputs import TrainingRunInput
from activities.views import RunSummary
from cairn.checkpoint import latest_committed, list_checkpoints
from cairn.checkpoint.reader import read_manifest
from cairn.config import TrainConfig
from cairn.distributed.comm import SoloComm
from cairn.errors import GangFailedError
from cairn.gang.job import GangJob, RankResult
from cairn.gang.launch import Gang, GangSpec, gang_processes
from cairn.gang.rank import run_rank
from cairn.stores import open_store
from cairn.stores.base import Store
from cairn.training import load_training
from tests.conftest import REPO, dist_config
from tests.integration.conftest import S3Server, TemporalServer, gang_ranks, gang_worker, wait_progress
from workers.reports.timeline import run_events
from workflows.training_run import TrainingRun

pytestmark = pytest.mark.integration


def job(
    store_url: str, config: TrainConfig, target: int, run_id: str = "dist", every: int = 4, **extra: Any
) -> GangJob:
    return GangJob(run_id=run_id, store=store_url, config=config, target_step=target, checkpoint_every=every, **extra)


def gang(workdir: Path, world: int, body: GangJob) -> RankResult:
    g = Gang(GangSpec(nproc_per_node=world), body, workdir)
    g.start()
    try:
        return g.supervise(on_progress=lambda _: None, cancelled=lambda: False)
    finally:
        assert gang_processes(g.token) == [], "a rank process outlived its gang"


def reference(tmp_path: Path, config: TrainConfig, target: int) -> dict[str, str]:
    """W=1, in this process: step -> fingerprint of every checkpoint up to ``target``."""
    store_url = str(tmp_path / "reference")
    run_rank(SoloComm(), job(store_url, config, target), tmp_path / "ref-work")
    store = open_store(store_url)
    return {str(r.step): read_manifest(store, r, expect_kind=None).fingerprint for r in list_checkpoints(store, "dist")}


@pytest.fixture
def s3_url(seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", seaweedfs.endpoint)  # the rank processes inherit it
    return f"s3://{seaweedfs.bucket}/dist-{uuid.uuid4().hex[:8]}"


def test_save_at_four_ranks_resume_at_two_then_one_is_bit_identical_on_s3(tmp_path: Path, s3_url: str) -> None:
    config = dist_config(microbatches=4, block_bytes=64)  # 8 values per block: slices cut tensors
    expected = reference(tmp_path, config, 16)
    four = gang(tmp_path / "w4", 4, job(s3_url, config, 8))
    assert four.world_size == 4 and four.fingerprint == expected["8"]
    two = gang(tmp_path / "w2", 2, job(s3_url, config, 12))
    assert two.resumed_from_step == 8 and two.fingerprint == expected["12"]
    one = run_rank(SoloComm(), job(s3_url, config, 16), tmp_path / "w1")
    assert one.resumed_from_step == 12 and one.fingerprint == expected["16"]
    store = open_store(s3_url)
    manifest = read_manifest(store, latest_committed(store, "dist"), expect_kind=None)  # type: ignore[arg-type]
    assert manifest.writer.ranks == 1
    eight = [r for r in list_checkpoints(store, "dist") if r.step == 8][0]
    written_by_four = read_manifest(store, eight, expect_kind=None)
    assert written_by_four.writer.ranks == 4 and {s.rank for s in written_by_four.shards} == {0, 1, 2, 3}


def test_summing_in_rank_order_breaks_the_exactness_across_world_sizes(
    tmp_path: Path, rank_order_sums: Callable[[], None]
) -> None:
    config = dist_config(microbatches=8, block_bytes=64)
    rank_order_sums()  # this process (W=1); the ranks follow their job
    expected = reference(tmp_path, config, 8)
    four = gang(tmp_path / "w4", 4, job(str(tmp_path / "store"), config, 8, reduction="rank-order"))
    assert four.reduction == "rank-order"  # the ranks did sum in rank order (not the tree)
    assert four.fingerprint != expected["8"], "rank-order sums should change the bits at W=4"


def test_a_rank_killed_mid_save_leaves_no_committed_checkpoint_and_no_rank_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = dist_config(microbatches=4, block_bytes=64)
    store_url = str(tmp_path / "store")
    monkeypatch.setenv("CAIRN_FAULT", "rank-mid-save:1@8")  # rank 1 dies after writing its blocks
    with pytest.raises(GangFailedError) as failed:
        gang(tmp_path / "killed", 2, job(store_url, config, 12))
    assert failed.value.retryable
    store: Store = open_store(store_url)
    assert [r.step for r in list_checkpoints(store, "dist")] == [0, 4]  # nothing at step 8
    assert any("/training/000000000008/" in o.key for o in store.list("dist/")), "rank 0's shards were written"
    monkeypatch.delenv("CAIRN_FAULT")
    retry = gang(tmp_path / "retry", 2, job(store_url, config, 12))
    assert retry.resumed_from_step == 4
    assert retry.fingerprint == reference(tmp_path, config, 12)["12"]


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGTERM-twice"])
def test_ctrl_c_of_cairn_train_checkpoints_every_rank_together(tmp_path: Path, sig: str) -> None:
    """Ctrl-C at the terminal reaches the command's process group (SIGTERM, a service manager's
    stop, reaches the command): the command asks its gang to stop, the ranks finish the step,
    commit one checkpoint together and exit; nothing is killed. The run then resumes from the
    checkpoint named as the user types it: relative to the working directory. A second signal
    (sent while the gang is still stopping) aborts at once: the gang is stopped, no rank survives."""
    store = tmp_path / "store"
    config = tmp_path / "config.json"
    config.write_text(dist_config(microbatches=4, block_bytes=64).model_dump_json())
    argv = [sys.executable, "-m", "workers.cli", "train", "--config", str(config), "--store", str(store)]
    argv += ["--run-id", "dist", "--steps", "200000", "--checkpoint-every", "100000", "--world-size", "2"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    # Processes, not workers.cli.main in this one: the signals are the point, and the gang's job
    # folder goes where the command's own TMPDIR says (this process has cached its temp dir).
    cli = subprocess.Popen(argv, cwd=REPO, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not (progress := list(tmp_path.glob("cairn-gang-*/progress.json"))) or '"step": 0,' in (
            progress[0].read_text()
        ):
            assert cli.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        if sig == "SIGINT":
            os.killpg(cli.pid, signal.SIGINT)  # what the terminal does
        else:
            os.kill(cli.pid, signal.SIGTERM)  # what `kill`, systemd or a scheduler does
        if sig == "SIGTERM-twice":
            # Once the first is handled (the command asked its gang to stop), while the ranks stop:
            while not list(tmp_path.glob("cairn-gang-*/stop")):
                assert cli.poll() is None and time.monotonic() < deadline + 30
                time.sleep(0.001)
            os.kill(cli.pid, signal.SIGTERM)
        _, err = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert gang_processes(str(tmp_path)) == [], "no agent or rank outlives the command"
    assert not list(tmp_path.glob("cairn-gang-*")), "the gang's job folder is removed"
    if sig == "SIGTERM-twice":
        assert cli.returncode == 130 and "aborted by a second signal; the gang was stopped" in err, err
        assert "last committed checkpoint: " in err and "resume with: cairn train --resume" in err, err
        return
    assert cli.returncode == 128 + getattr(signal, sig), err
    said = re.search(r"interrupted at step (\d+): checkpoint (\S+) committed", err)
    assert said is not None, err
    step = int(said.group(1))
    local = open_store(str(store))
    assert [r.step for r in list_checkpoints(local, "dist")] == [0, step] and 0 < step < 100000
    assert read_manifest(local, latest_committed(local, "dist"), expect_kind=None).writer.ranks == 2  # type: ignore[arg-type]
    if sig == "SIGTERM":
        return
    relative = f"store/dist/training/{step:012d}"  # as a user in tmp_path types it (a process: its own cwd)
    argv = [sys.executable, "-m", "workers.cli", "train", "--resume", relative, "--store", "store"]
    argv += ["--steps", "2", "--world-size", "2", "--json"]
    resumed = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    body = json.loads(resumed.stdout)
    assert body["step"] == step + 2 and body["resumed_from_step"] == step


def test_ctrl_c_before_the_ranks_train_stops_the_gang_at_once(tmp_path: Path) -> None:
    """Ctrl-C while the ranks are still starting (importing, restoring, meeting in the
    rendezvous): there is nothing to checkpoint, so the gang is stopped at once rather than
    waited on, and the command names the last commit and how to resume."""
    store = tmp_path / "store"
    config = tmp_path / "config.json"
    config.write_text(dist_config(microbatches=4, block_bytes=64).model_dump_json())
    argv = [sys.executable, "-m", "workers.cli", "train", "--config", str(config), "--store", str(store)]
    argv += ["--run-id", "dist", "--steps", "20", "--world-size", "2"]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    cli = subprocess.Popen(argv, cwd=REPO, env=env, start_new_session=True, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while not list(tmp_path.glob("cairn-gang-*/job.json")):
            assert cli.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        os.killpg(cli.pid, signal.SIGINT)
        _, err = cli.communicate(timeout=60)
    finally:
        cli.kill()
    assert cli.returncode == 130, err
    assert "CommandInterrupted: stopped before training began; the gang was stopped;" in err, err
    assert gang_processes(str(tmp_path)) == [], "no agent or rank outlives the command"


# -- on Temporal ----------------------------------------------------------------------------------
def dist_run_input(tmp_path: Path, **overrides: Any) -> TrainingRunInput:
    body: dict[str, Any] = {
        "run_id": f"dist-{uuid.uuid4().hex[:8]}",
        "config": dist_config(microbatches=4, block_bytes=64).model_dump(mode="json"),
        "total_steps": 12,
        "steps_per_segment": 6,
        "store": str(tmp_path / "store"),
        "checkpoint": {"every": 3},
        "heartbeat_timeout_seconds": 5,
        "world_size": 4,
    }
    body.update(overrides)
    return TrainingRunInput.model_validate(body)


def reference_fingerprint(tmp_path: Path, inp: TrainingRunInput) -> str:
    return reference(tmp_path, inp.config, inp.total_steps or 0)[str(inp.total_steps)]


async def test_two_nodes_of_two_ranks_on_temporal_train_bit_identically(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    # compression reaches the ranks and their decision the summary (64-byte blocks stay raw)
    inp = dist_run_input(tmp_path, nodes=["host-a", "host-b"], checkpoint={"every": 3, "compression": "zstd"})
    workers = [gang_worker(temporal_server, task_queue, tmp_path, n) for n in ("host-a", "host-b")]
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=240))
    finally:
        for w in workers:
            w.stop()
    assert summary.steps == 12 and summary.segments == 2
    assert summary.fingerprint == reference_fingerprint(tmp_path, inp)
    assert summary.compression is not None and summary.compression.mode == "zstd", summary.compression
    store = open_store(inp.store)
    manifest = read_manifest(store, latest_committed(store, inp.run_id), expect_kind=None)  # type: ignore[arg-type]
    assert manifest.writer.ranks == 4
    logs = "".join((tmp_path / f"worker-{n}.log").read_text() for n in ("host-a", "host-b"))
    assert "node 0 of 2, 2 rank(s) of 4" in logs and "node 1 of 2, 2 rank(s) of 4" in logs
    assert gang_ranks(tmp_path) == []


async def test_a_killed_rank_fails_the_gang_which_is_retried_whole_and_ends_bit_identical(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    inp = dist_run_input(tmp_path, world_size=2, throttle_seconds_per_step=0.15)
    proc = gang_worker(temporal_server, task_queue, tmp_path)
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        await wait_progress(handle, lambda p: p["step"] >= 3, timeout=120)
        deadline = time.monotonic() + 60
        while not (ranks := gang_ranks(tmp_path, ranks_only=True)):
            assert time.monotonic() < deadline, proc.log_tail()
            await asyncio.sleep(0.05)
        victim = ranks[-1]
        os.kill(victim, signal.SIGKILL)
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=240))
    finally:
        proc.stop()
    assert summary.steps == 12 and summary.retried_segments >= 1 and max(summary.attempts) >= 2
    assert summary.fingerprint == reference_fingerprint(tmp_path, inp)
    assert "retrying the whole gang" in (tmp_path / "worker-any.log").read_text()
    assert gang_ranks(tmp_path) == []


async def test_a_cancelled_gang_checkpoints_and_leaves_no_rank_process(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    inp = dist_run_input(tmp_path, world_size=2, total_steps=90, steps_per_segment=90, throttle_seconds_per_step=0.1)
    store = open_store(inp.store)
    proc = gang_worker(temporal_server, task_queue, tmp_path)
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        deadline = time.monotonic() + 120
        while (seen := latest_committed(store, inp.run_id)) is None or seen.step < 6:
            assert time.monotonic() < deadline, proc.log_tail()
            await asyncio.sleep(0.05)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await asyncio.wait_for(handle.result(), timeout=120)
        assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    finally:
        proc.stop()
    assert gang_ranks(tmp_path) == []
    said = re.search(r"gang segment interrupted on request at step (\d+)", (tmp_path / "worker-any.log").read_text())
    assert said is not None
    latest = latest_committed(store, inp.run_id)
    assert latest is not None and latest.step == int(said.group(1)) >= seen.step  # committed on its way out
    state, _ = load_training(store, latest)
    assert state.step == latest.step


async def test_an_elastic_run_shrinks_a_failing_gang_and_stays_bit_identical(
    client: Client, temporal_server: TemporalServer, task_queue: str, tmp_path: Path
) -> None:
    """Rank 3 dies in every save at world size 4 (a fault only a gang of 4 has): after two failed
    attempts the run (``min_world_size: 2``) goes on at 2 ranks, from the last commit, and ends
    with the bits of the uninterrupted single-process run."""
    inp = dist_run_input(tmp_path, world_size=4, min_world_size=2, total_steps=6, steps_per_segment=6)
    proc = gang_worker(temporal_server, task_queue, tmp_path, extra={"CAIRN_FAULT": "rank-mid-save:3@3"})
    try:
        handle = await client.start_workflow(TrainingRun.run, inp, id=inp.run_id, task_queue=task_queue)
        summary = RunSummary.model_validate(await asyncio.wait_for(handle.result(), timeout=240))
    finally:
        proc.stop()
    assert summary.world_size == 2 and summary.steps == 6
    assert summary.fingerprint == reference_fingerprint(tmp_path, inp)
    assert "continuing at 2" in (tmp_path / "worker-any.log").read_text()
    # `cairn run report`'s timeline (from history): the failed gangs, then a restore at W=2.
    _, events = await run_events(client, inp.run_id)
    kinds = [e.kind for e in events]
    assert kinds.count("failure") >= 2 and "interrupted" not in kinds, events
    assert any(e.kind == "restore" and e.detail.endswith("at world size 2") for e in events), events
    store = open_store(inp.store)
    manifest = read_manifest(store, latest_committed(store, inp.run_id), expect_kind=None)  # type: ignore[arg-type]
    assert manifest.writer.ranks == 2
    assert gang_ranks(tmp_path) == []
