"""What `cairn run status`, `watch` and `start` show is true, against a real Temporal server
(issue 22): a failed run's reason and checkpoint, watch's loss and Ctrl-C, a refused start,
and the input Temporal records for a torch run."""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from cairn.checkpoint import CheckpointRef
from cairn.checkpoint.latest import latest_committed
from cairn.runs.ownership import claim_run
from cairn.stores import LocalStore
from cairn.stores.identity import store_identity
from cairn.training import load_training
from tests.conftest import REPO
from tests.integration.conftest import TemporalServer, cairn
from workers.cli.temporal import start_input
from workers.worker import HEARTBEAT_THROTTLE, serving

pytestmark = pytest.mark.integration


def run_file(tmp_path: Path, example: str = "run.json", **changes: Any) -> tuple[Path, dict[str, Any]]:
    body = json.loads((REPO / "examples" / example).read_text())
    body.update({"run_id": f"truth-{uuid.uuid4().hex[:6]}", "store": str(tmp_path / "store"), **changes})
    path = tmp_path / f"{body['run_id']}.json"
    path.write_text(json.dumps(body))
    return path, body


async def wait_closed(client: Client, workflow_id: str, timeout: float = 90) -> WorkflowExecutionStatus | None:
    deadline = time.monotonic() + timeout
    while (desc := await client.get_workflow_handle(workflow_id).describe()).status == WorkflowExecutionStatus.RUNNING:
        assert time.monotonic() < deadline, workflow_id
        await asyncio.sleep(0.2)
    return desc.status


async def test_status_of_a_failed_run_shows_its_reason_and_latest_checkpoint(
    temporal_server: TemporalServer, client: Client, tmp_path: Path, task_queue: str
) -> None:
    """A run that diverges inside its first segment: the workflow never recorded a checkpoint,
    the error names the last committed one; status shows the reason and that checkpoint."""
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    body = json.loads((REPO / "examples" / "run.json").read_text())["config"]
    body["optimizer"].update(lr=5.0, warmup_steps=0, decay="constant", weight_decay=5.0)
    path, run = run_file(
        tmp_path, config=body, total_steps=400, steps_per_segment=400, checkpoint={"every": 20}
    )  # diverges at 224
    async with serving(client, task_queue):
        started = await asyncio.to_thread(cairn, "run", "start", str(path), "--task-queue", task_queue, env=env)
        assert started.returncode == 0, started.stderr
        assert await wait_closed(client, run["run_id"]) == WorkflowExecutionStatus.FAILED
        polled = await asyncio.to_thread(cairn, "run", "status", run["run_id"], env=env)  # a worker answers queries
    alone = await asyncio.to_thread(cairn, "run", "status", run["run_id"], env=env)  # history and store only
    latest = latest_committed(LocalStore(tmp_path / "store"), run["run_id"])
    assert latest is not None and latest.step > 0
    for shown in (polled, alone):
        lines = shown.stdout.splitlines()
        assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
        assert lines[0].startswith(
            f"{run['run_id']}: FAILED - TrainingDivergedError: loss: training diverged at step"
        ), lines
        assert f"last committed checkpoint: {latest}" in lines[0], lines  # the error and the line below agree
        assert lines[1] == f"  checkpoint  {latest} (latest committed)", lines
        assert "starting" not in shown.stdout and "none committed" not in shown.stdout, shown.stdout


async def test_a_second_start_of_an_owned_run_id_is_refused_before_starting(
    temporal_server: TemporalServer, client: Client, tmp_path: Path, task_queue: str
) -> None:
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    path, run = run_file(tmp_path)
    owner, second = f"{run['run_id']}-a", f"{run['run_id']}-b"
    first = await asyncio.to_thread(
        cairn, "run", "start", str(path), "--task-queue", task_queue, "--workflow-id", owner, env=env
    )
    assert first.returncode == 0, first.stderr  # no worker polls: it stays RUNNING
    store = LocalStore(tmp_path / "store")  # the owner record its open_run would write
    store_id = store_identity(store, create=True)
    assert store_id is not None
    claim_run(store, run["run_id"], owner, store_id, owner_running=lambda _: False)
    refused = await asyncio.to_thread(
        cairn, "run", "start", str(path), "--task-queue", task_queue, "--workflow-id", second, env=env, check=False
    )
    assert refused.returncode == 2 and refused.stdout == "", (refused.stdout, refused.stderr)
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("cairn: error: RunOwnershipError: run_id: ") and f"workflow {owner!r}" in line, line
    with pytest.raises(RPCError) as missing:  # no workflow was started
        await client.get_workflow_handle(second).describe()
    assert missing.value.status == RPCStatusCode.NOT_FOUND
    # A closed owner is no refusal: the run is taken over.
    await client.get_workflow_handle(owner).terminate("test: the owner goes away")
    taken = await asyncio.to_thread(
        cairn, "run", "start", str(path), "--task-queue", task_queue, "--workflow-id", second, env=env
    )
    assert taken.returncode == 0 and f"started TrainingRun {second}" in taken.stdout, taken.stderr
    await client.get_workflow_handle(second).terminate("test: done")


async def test_the_input_temporal_records_for_a_torch_run_is_the_users_file(
    temporal_server: TemporalServer, client: Client, tmp_path: Path, task_queue: str
) -> None:
    pytest.importorskip("torch")
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    path, body = run_file(tmp_path, "digits-run.json", store="store")  # relative: resolved by the starter
    started = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "workers.cli", "run", "start", str(path), "--task-queue", task_queue],
        capture_output=True, text=True, cwd=tmp_path, env={**os.environ, **env, "PYTHONPATH": str(REPO)}, timeout=180,
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    recorded = await start_input(client, body["run_id"])  # the start event's input, as the Web UI shows it
    assert not {"model", "data", "optimizer"} & set(recorded["config"]), recorded["config"]
    assert recorded == {**body, "store": str((tmp_path / "store").resolve())}, recorded
    await client.get_workflow_handle(body["run_id"]).terminate("test: done")


def watched_steps(lines: list[str]) -> set[int]:
    """The steps (> 0) of the watch's frames that show a loss."""
    found = (re.search(r"(\d+)/120 .*loss=([-\d.]+)", line) for line in list(lines))
    return {int(m.group(1)) for m in found if m is not None and m.group(2) != "-" and int(m.group(1)) > 0}


async def test_watch_shows_the_current_steps_loss_and_ctrl_c_stops_only_watching(
    temporal_server: TemporalServer, client: Client, tmp_path: Path, task_queue: str
) -> None:
    """Every frame of the bar: step N with the loss of a step in [N - steps per heartbeat, N].
    Several segments, so the workflow's own loss (the last finished segment's) is older than
    the step the heartbeat reports: the loss of step 78 at step 147, before."""
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    throttle = 0.04
    per_heartbeat = math.ceil(HEARTBEAT_THROTTLE.total_seconds() / throttle) + 1
    path, run = run_file(
        tmp_path, total_steps=120, steps_per_segment=30, checkpoint={"every": 10}, throttle_seconds_per_step=throttle
    )
    async with serving(client, task_queue):
        started = await asyncio.to_thread(cairn, "run", "start", str(path), "--task-queue", task_queue, env=env)
        assert started.returncode == 0, started.stderr
        watch = subprocess.Popen(
            [sys.executable, "-m", "workers.cli", "run", "watch", run["run_id"], "--interval", "0.1"],
            cwd=REPO, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        lines: list[str] = []  # stderr as it comes: the watch is stopped once it has shown enough
        reader = threading.Thread(target=lambda: lines.extend(iter(watch.stderr.readline, "")), daemon=True)
        reader.start()
        deadline = time.monotonic() + 90
        while (await client.get_workflow_handle(run["run_id"]).query("progress")).get("step", 0) < 70 or (
            len(watched_steps(lines)) < 5 and time.monotonic() < deadline  # a slow machine: wait for the frames
        ):
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        watch.send_signal(signal.SIGINT)
        await asyncio.to_thread(watch.wait, 30)
        reader.join(timeout=30)  # stderr's end: the watch has exited
        err = "".join(lines)
        assert watch.stdout is not None and watch.stderr is not None
        watch.stdout.close()
        watch.stderr.close()
        assert (await client.get_workflow_handle(run["run_id"]).describe()).status == WorkflowExecutionStatus.RUNNING
        summary = await client.get_workflow_handle(run["run_id"]).result()
    assert watch.returncode == 130, err
    assert f"stopped watching {run['run_id']}; the run keeps going" in err and "cairn: error" not in err, err
    frames = [m.groups() for f in re.split(r"[\r\n]", err) if (m := re.search(r"(\d+)/120 .*loss=([-\d.]+)", f))]
    shown = [(int(n), float(loss)) for n, loss in frames if loss != "-" and int(n) > 0]
    assert len({n for n, _ in shown}) >= 5, frames
    ref = CheckpointRef.parse(summary["checkpoint"] if isinstance(summary, dict) else summary.checkpoint)
    state, _ = load_training(LocalStore(ref.store_url), ref)
    losses = state.history["loss"]  # per update: losses[s - 1] is the loss of step s
    assert len(losses) == 120
    for n, loss in shown:
        window = range(max(1, n - per_heartbeat), n + 1)
        assert any(abs(losses[s - 1] - loss) <= 5e-5 for s in window), (n, loss, [losses[s - 1] for s in window])


async def test_status_names_the_queues_a_run_needs_and_who_polls_each(
    temporal_server: TemporalServer, client: Client, tmp_path: Path, task_queue: str
) -> None:
    """With a worker: every queue the run uses (its own, for workflow tasks and bookkeeping, and
    its numerics profile's, where its segments go) is listed with the workers polling it now.
    Without one (a queue nobody ever polled), status says which queue waits, in words and JSON."""
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    path, run = run_file(tmp_path, total_steps=400, steps_per_segment=40, throttle_seconds_per_step=0.02)
    async with serving(client, task_queue):
        started = await asyncio.to_thread(cairn, "run", "start", str(path), "--task-queue", task_queue, env=env)
        assert started.returncode == 0, started.stderr
        deadline = time.monotonic() + 60
        while (await client.get_workflow_handle(run["run_id"]).query("progress")).get("step", 0) < 5:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
        shown = await asyncio.to_thread(cairn, "run", "status", run["run_id"], "--json", env=env)
        text = await asyncio.to_thread(cairn, "run", "status", run["run_id"], env=env)
        await client.get_workflow_handle(run["run_id"]).terminate("test done")
    status = json.loads(shown.stdout)
    queues = {(q["queue"], q["kind"]): q for q in status["queues"]}
    assert (task_queue, "workflow") in queues and (task_queue, "activity") in queues
    training = [q for (name, kind), q in queues.items() if name.startswith(f"{task_queue}~") and kind == "activity"]
    assert len(training) == 1, queues  # the numerics profile's queue, where the segments go
    assert status["workers_polling"] >= 1 and all(q["live"] >= 1 for q in queues.values())
    assert "no worker is polling" not in text.stdout and "polling" in text.stdout, text.stdout
