# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Recovery: SIGKILL the worker running a segment; how long until training makes progress
again, and how many steps are computed twice — vs the heartbeat timeout and the checkpoint
interval.

A real Temporal dev server and two ``cairn worker --no-supervisor`` processes (the second stands by, as in
any deployment with more than one worker). A ``TrainingRun`` with 20 ms steps (the example
model, throttled: a heavier model), long segments (so that kills land mid-segment) and a
checkpoint every K steps. Each rep: wait a random time into the segment, SIGKILL the worker
that holds it (the pending activity names it), start a replacement, then poll the server
every 50 ms:
- retry started: the segment's next attempt is STARTED (server timestamp);
- resumed progress: that attempt's heartbeat reports a step past the one it resumed from
  (seen through the heartbeat path, so up to ~0.3 s late: an upper bound);
- caught up: its heartbeat reaches the step the killed attempt had reported.
Steps recomputed = the killed attempt's last reported step - the latest committed step at the
kill (its heartbeat is up to ~0.3 s stale, so this is a lower bound by at most ~15 steps here);
the workflow's own count (``recomputed_steps``) is reported too.
Rendered by ``bench.sections.recovery``.
Run: ``python -m bench.suites.recovery [--reps 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from activities.inputs import TrainingRunInput
from bench.harness.machine import machine
from bench.harness.measure import stats
from bench.harness.results import REPO, write_result
from bench.harness.servers import temporal_server
from bench.harness.temporal import (
    segment_view,
    wait_worker_polling,
)
from bench.harness.worker import start_worker
from cairn.checkpoint import latest_committed
from cairn.config import load_config
from cairn.stores import LocalStore
from workers.client import connect
from workflows.training_run import TrainingRun

STEP_SECONDS = 0.02


async def one_kill(handle: Any, store: LocalStore, run_id: str, workers: list[Any], spawn: Any) -> dict[str, Any]:
    from temporalio.api.enums.v1 import PendingActivityState

    started = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
    # a running attempt that has made some progress past its resume point
    while True:
        view = segment_view(await handle.describe())
        if (
            view
            and view["state"] == started
            and view["details"].get("attempt") == view["attempt"]
            and isinstance(view["details"].get("step"), int)
            and view["pid"] in {w.pid for w in workers}
        ):
            break
        await asyncio.sleep(0.05)
    await asyncio.sleep(random.uniform(0.5, 1.5))
    view = segment_view(await handle.describe())
    assert view is not None
    victim = next(w for w in workers if w.pid == view["pid"])
    killed_attempt = view["attempt"]
    durable = latest_committed(store, run_id)
    t_kill = time.time()
    os.killpg(victim.pid, signal.SIGKILL)
    reported = view["details"].get("step")
    durable_step = durable.step if durable else 0
    workers.remove(victim)
    victim.stop()
    workers.append(spawn())  # the replacement; the standby worker is already polling
    t_retry = t_progress = t_caught_up = None
    resumed_from = None
    while t_caught_up is None:
        view = segment_view(await handle.describe())
        now = time.time()
        if view and view["attempt"] > killed_attempt and view["state"] == started:
            if t_retry is None:
                t_retry = view["started"] or now
            d = view["details"]
            if d.get("attempt") == view["attempt"] and isinstance(d.get("step"), int):
                if resumed_from is None:
                    resumed_from = d.get("committed_step", d["step"])
                if t_progress is None and d["step"] > resumed_from:
                    t_progress = now
                if reported is None or d["step"] >= reported:
                    t_caught_up = now
        if now - t_kill > 120:
            raise TimeoutError(f"no recovery within 120 s after the kill: {view}")
        await asyncio.sleep(0.05)
    assert t_retry is not None and t_progress is not None
    return {
        "killed_attempt": killed_attempt,
        "kill_to_retry_started_s": t_retry - t_kill,
        "kill_to_progress_s": t_progress - t_kill,
        "kill_to_caught_up_s": t_caught_up - t_kill,
        "reported_step_at_kill": reported,
        "durable_step_at_kill": durable_step,
        "resumed_from": resumed_from,
        "recomputed_steps": max(0, (reported or 0) - durable_step),  # a commit can land after the last heartbeat
    }


async def scenario(address: str, queue: str, work: Path, heartbeat: float, every: int, reps: int) -> dict[str, Any]:
    client = await connect(address)
    config = load_config(REPO / "examples" / "config.json")
    run_id = f"recovery-{uuid.uuid4().hex[:6]}"
    store_root = work / "store"
    logs = iter(range(1000))

    def spawn() -> Any:
        return start_worker(address, queue, work / f"worker-{next(logs)}.log", supervised=False)

    workers = [spawn(), spawn()]
    try:
        await wait_worker_polling(client, queue)
        inp = TrainingRunInput(
            run_id=run_id,
            config=config,
            total_steps=1_000_000,
            store=str(store_root),
            steps_per_segment=400,
            checkpoint={"every": every},
            heartbeat_timeout_seconds=heartbeat,
            throttle_seconds_per_step=STEP_SECONDS,
        )
        handle = await client.start_workflow(TrainingRun.run, inp, id=run_id, task_queue=queue)
        kills = []
        for rep in range(reps):
            k = await one_kill(handle, LocalStore(store_root), run_id, workers, spawn)
            kills.append(k)
            print(
                f"heartbeat {heartbeat:g}s, every {every}: kill {rep + 1}: retry started "
                f"{k['kill_to_retry_started_s']:.2f}s, progress {k['kill_to_progress_s']:.2f}s, caught up "
                f"{k['kill_to_caught_up_s']:.2f}s; recomputed {k['recomputed_steps']} steps "
                f"(reported {k['reported_step_at_kill']}, durable {k['durable_step_at_kill']})",
                flush=True,
            )
        await asyncio.sleep(1.0)
        progress = (await handle.query(TrainingRun.progress)).model_dump()
        await handle.terminate("benchmark over")
    finally:
        for w in workers:
            w.stop(grace=2)
    return {
        "heartbeat_timeout_s": heartbeat,
        "checkpoint_every": every,
        "step_seconds": STEP_SECONDS,
        "checkpoint_interval_s": every * STEP_SECONDS,
        "kills": kills,
        "kill_to_retry_started_s": stats([k["kill_to_retry_started_s"] for k in kills]),
        "kill_to_progress_s": stats([k["kill_to_progress_s"] for k in kills]),
        "kill_to_caught_up_s": stats([k["kill_to_caught_up_s"] for k in kills]),
        "recomputed_steps": stats([float(k["recomputed_steps"]) for k in kills]),
        "workflow_recomputed_steps_total": progress["recomputed_steps"],
        "target_s": heartbeat + 2.0,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results = {}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-recovery-") as tmp:
        work = Path(tmp)
        with temporal_server(work / "temporal") as address:
            for heartbeat, every, reps in args.scenarios:
                queue = f"recovery-{uuid.uuid4().hex[:6]}"
                sub = work / f"hb{heartbeat:g}-every{every}"
                sub.mkdir()
                results[f"heartbeat {heartbeat:g} s, checkpoint every {every}"] = await scenario(
                    address, queue, sub, heartbeat, every, reps
                )
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 kills at a 3 s heartbeat timeout: a smoke run")
    args = parser.parse_args()
    random.seed(13)
    if args.quick:
        args.scenarios = [(3.0, 25, 2)]
    else:
        args.scenarios = [(5.0, 25, args.reps), (10.0, 100, args.reps)]
    results = asyncio.run(main_async(args))
    write_result("recovery", {"machine": machine(), "scenarios": results}, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
