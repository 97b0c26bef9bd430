"""Record the histories the run report's fault tests read (``test_fault_reports.py``): one short
run per way a fault is detected, on a real Temporal dev server with real worker processes, each
fault injected at a moment this script notes, beside what it saw happen.

Run after a change to how segments fail, retry or report: ``.venv/bin/python -m
tests.unit.workers.reports.record_fault_histories [SCENARIO ...]``. Each scenario writes
``histories/SCENARIO.json``: the workflow's histories, the store's commits (step, commit time),
and ``truth``: the fault's wall-clock times (unix seconds) as this script observed them —
``fault_at`` (the kill, SIGSTOP or SIGTERM), ``detected_at`` (the first poll of the workflow's
pending activity that showed the attempt failed; a 20 ms poll), ``retry_started_at`` and
``training_at`` (the retry's "resumed from step" log line: its restore is done), the step the
lost attempt's heartbeats last reported before the fault and where its retry resumed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import Client, WorkflowHandle

from cairn.checkpoint import latest_committed
from cairn.runs.record import run_record
from cairn.stores import LocalStore
from tests.integration.conftest import run_input, start_worker_process
from workers.client import WORKFLOW_TASK_TIMEOUT, connect
from workers.stack.servers import ServerProcess, free_port, temporal_command, wait_for_temporal
from workflows.training_run import TrainingRun

HERE = Path(__file__).resolve().parent / "histories"
REPO = Path(__file__).resolve().parents[4]
POLL = 0.02
JSON_LOGS = {"CAIRN_LOG_FORMAT": "json"}


@dataclass
class Scene:
    client: Client
    address: str
    root: Path
    procs: list[ServerProcess] = field(default_factory=list)
    truth: dict[str, Any] = field(default_factory=dict)

    def supervised(self, name: str) -> ServerProcess:
        argv = [sys.executable, "-m", "workers.cli", "worker", "--address", self.address, "--task-queue", self.queue]
        proc = ServerProcess(name, argv, self.root / f"{name}.log", env=JSON_LOGS, cwd=REPO).start()
        self.procs.append(proc)
        return proc

    def bare(self, name: str) -> ServerProcess:
        proc = start_worker_process(self.address, self.queue, self.root / f"{name}.log", env=JSON_LOGS)
        self.procs.append(proc)
        return proc

    @property
    def queue(self) -> str:
        return f"record-{self.root.name}"

    def stop(self) -> None:
        for p in self.procs:
            if p.alive():
                os.killpg(p.pid, signal.SIGCONT)
            p.stop(grace=5.0)


async def running(handle: WorkflowHandle[Any, Any]) -> Any | None:
    for p in (await handle.describe()).raw_description.pending_activities:
        if p.activity_type.name == "train_segment":
            return p
    return None


async def until(what: Callable[[], Awaitable[Any]], timeout: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = await what()
        if found:
            return found
        await asyncio.sleep(POLL)
    raise TimeoutError("gave up waiting")


def heartbeat(p: Any) -> dict[str, Any]:
    if not p.heartbeat_details.payloads:
        return {}
    body = json.loads(p.heartbeat_details.payloads[0].data)
    return body if isinstance(body, dict) else {}


async def mid_interval(handle: WorkflowHandle[Any, Any], store: LocalStore, run_id: str, warm: bool) -> Any:
    """The running segment (on a warm worker's own queue if ``warm``) past its first commits,
    halfway between two of them (every 10 steps), so that its retry recomputes some."""

    async def ready() -> Any:
        p = await running(handle)
        ref = latest_committed(store, run_id)
        if p is None or p.state != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED or ref is None:
            return None
        if warm != ("#w-" in p.activity_options.task_queue.name):
            return None
        step = heartbeat(p).get("step")
        return p if isinstance(step, int) and step >= 25 and step % 10 in (4, 5, 6) else None

    return await until(ready)


def pid_of(segment: Any) -> int:
    return int(segment.last_worker_identity.split("@", 1)[0])


async def failed_after(handle: WorkflowHandle[Any, Any], segment: Any) -> float:
    """When a poll first saw ``segment``'s attempt failed: a later attempt, or another activity."""

    async def seen() -> float | None:
        p = await running(handle)
        gone = p is None or p.activity_id != segment.activity_id or p.attempt > segment.attempt
        return time.time() if gone else None

    return float(await until(seen, timeout=60))


def resumed_log_time(scene: Scene, after: float) -> float | None:
    """The first "resumed from step" log line of any worker after ``after``: the retry trains."""
    found = []
    for log in scene.root.glob("*.log"):
        for line in log.read_text().splitlines():
            try:
                body = json.loads(line)
            except ValueError:
                continue
            if isinstance(body, dict) and "resumed from step" in str(body.get("message", "")):
                at = datetime.fromisoformat(body["ts"]).timestamp()
                if at > after:
                    found.append(at)
    return min(found) if found else None


async def supervised_crash(scene: Scene) -> None:
    """One supervised worker; its worker process is SIGKILLed: the supervisor fails the attempt
    (retryable, on the shared queue) and the retry waits for the restarted process."""
    inp = run_input(scene.root, total_steps=100, steps_per_segment=100, checkpoint={"every": 10},
                    throttle_seconds_per_step=0.05, heartbeat_timeout_seconds=30, retention=None)  # fmt: skip
    scene.supervised("worker")
    await _kill(scene, inp, warm=False, how=lambda seg: os.kill(pid_of(seg), signal.SIGKILL))


async def own_queue_crash(scene: Scene) -> None:
    """Two supervised workers; the holder of a warm run is SIGKILLed during a segment on its own
    queue: its supervisor fails the attempt non-retryable and the workflow re-offers it."""
    inp = run_input(scene.root, total_steps=90, steps_per_segment=45, checkpoint={"every": 10},
                    throttle_seconds_per_step=0.05, heartbeat_timeout_seconds=30, retention=None)  # fmt: skip
    scene.supervised("worker-a")
    scene.supervised("worker-b")
    await _kill(scene, inp, warm=True, how=lambda seg: os.kill(pid_of(seg), signal.SIGKILL))


async def host_loss(scene: Scene) -> None:
    """A supervised worker killed with its supervisor (the host is gone): the heartbeat timeout
    detects it; a standby worker takes the retry."""
    inp = run_input(scene.root, total_steps=100, steps_per_segment=100, checkpoint={"every": 10},
                    throttle_seconds_per_step=0.05, heartbeat_timeout_seconds=3, retention=None)  # fmt: skip
    host = scene.supervised("worker")
    await _kill(scene, inp, warm=False, how=lambda seg: os.killpg(host.pid, signal.SIGKILL), standby=True)


async def freeze(scene: Scene) -> None:
    """A worker process SIGSTOPped (alive, silent): the heartbeat timeout detects it; a standby
    worker takes the retry. The frozen process is thawed and stopped once the run is done."""
    inp = run_input(scene.root, total_steps=100, steps_per_segment=100, checkpoint={"every": 10},
                    throttle_seconds_per_step=0.05, heartbeat_timeout_seconds=3, retention=None)  # fmt: skip
    frozen = scene.bare("worker")
    await _kill(scene, inp, warm=False, how=lambda seg: os.killpg(frozen.pid, signal.SIGSTOP), standby=True)


async def hand_back(scene: Scene) -> None:
    """A worker SIGTERMed: its segment commits and hands back (``WorkerShutdown``, retryable); a
    standby worker takes the retry."""
    inp = run_input(scene.root, total_steps=100, steps_per_segment=100, checkpoint={"every": 10},
                    throttle_seconds_per_step=0.05, heartbeat_timeout_seconds=30, retention=None)  # fmt: skip
    leaving = scene.bare("worker")
    await _kill(scene, inp, warm=False, how=lambda seg: os.kill(leaving.pid, signal.SIGTERM), standby=True)


async def _kill(scene: Scene, inp: Any, warm: bool, how: Callable[[Any], None], standby: bool = False) -> None:
    handle = await scene.client.start_workflow(
        TrainingRun.run, inp, id=inp.run_id, task_queue=scene.queue, task_timeout=WORKFLOW_TASK_TIMEOUT
    )
    store = LocalStore(inp.store)
    if standby:
        await until(lambda: running(handle))  # the first worker has it before the standby polls
        spare = scene.bare("standby")

        async def polling() -> bool:
            return "polling" in spare.log_tail(200)

        await until(polling)
    segment = await mid_interval(handle, store, inp.run_id, warm)
    fault_at = time.time()
    how(segment)
    detected_at = await failed_after(handle, segment)
    retry = await until(lambda: _retry_started(handle, segment))
    await asyncio.wait_for(handle.result(), timeout=180)
    retry_at = retry.last_started_time.ToMicroseconds() / 1e6
    scene.truth = {
        "run_id": inp.run_id,
        "heartbeat_timeout_seconds": inp.heartbeat_timeout_seconds,
        "fault_at": fault_at,
        "step_at_fault": heartbeat(segment).get("step"),
        "detected_at": detected_at,
        "retry_started_at": retry_at,
        "training_at": resumed_log_time(scene, retry_at - 0.5),
    }
    record = run_record(store, inp.run_id)
    scene.truth["commits"] = [[c.step, c.at.timestamp() if c.at else None, c.bytes] for c in record.commits]
    scene.truth["steps"] = record.steps


async def _retry_started(handle: WorkflowHandle[Any, Any], segment: Any) -> Any | None:
    p = await running(handle)
    if p is None or p.state != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
        return None
    return p if p.activity_id != segment.activity_id or p.attempt > segment.attempt else None


SCENARIOS = {f.__name__: f for f in (supervised_crash, own_queue_crash, host_loss, freeze, hand_back)}


async def main(names: list[str]) -> None:
    root = Path(tempfile.mkdtemp())
    port = free_port()
    server = ServerProcess("temporal", temporal_command(port, None, root / "t.db"), root / "t.log").start()
    try:
        wait_for_temporal("127.0.0.1", port, timeout=60, alive=server.alive)
        client = await connect(f"127.0.0.1:{port}")
        for name in names or list(SCENARIOS):
            scene = Scene(client, f"127.0.0.1:{port}", root / f"{name}-{uuid.uuid4().hex[:6]}")
            scene.root.mkdir()
            try:
                await SCENARIOS[name](scene)
            finally:
                scene.stop()
            histories = []
            async for e in client.list_workflows(f"WorkflowId = '{scene.truth['run_id']}'"):
                history = await client.get_workflow_handle(e.id, run_id=e.run_id).fetch_history()
                histories.append((e.start_time.timestamp(), json.loads(history.to_json())))
            body = {"scenario": name, "truth": scene.truth, "histories": [h for _, h in sorted(histories)]}
            HERE.mkdir(exist_ok=True)
            (HERE / f"{name}.json").write_text(json.dumps(body, indent=None, separators=(",", ":")) + "\n")
            print(name, json.dumps({k: v for k, v in scene.truth.items() if k != "commits"}))
    finally:
        server.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
