# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Recovery with a supervisor: SIGKILL the worker process running a segment while its supervisor
lives on (it fails the attempt at once through Temporal's async-completion API), vs a bare worker
(the heartbeat timeout notices), vs the whole host (supervisor and worker process: the heartbeat
timeout again), all with a 10 s heartbeat timeout, in one run; and the same supervised kill with
the digits CNN (``examples/digits-run.json``: a real model whose retry builds a trainer and restores).

A real Temporal dev server; a ``TrainingRun`` with 20 ms steps (the example model, throttled),
long segments (400 steps), a checkpoint every 25 steps. Scenarios:
- supervised: two ``cairn worker`` (supervisor + worker process each); the worker process holding
  the segment is SIGKILLed (its supervisor restarts it; the other worker stands by, polling);
- supervised, one worker: the same with no standby, so the retry waits for the restarted process;
- bare: two ``cairn worker --no-supervisor`` processes (``workers.worker``), as in section 5;
- host loss: two ``cairn worker``; the holder's whole process group (supervisor too) is SIGKILLed
  and a replacement started;
- host freeze: two ``cairn worker``; the holder's whole process group is SIGSTOPped (a paused VM, a
  process stuck in I/O) until its segment's retry runs on the other worker and the freeze has
  outlasted the heartbeat timeout by 1.5 s, then SIGCONTed (its attempt, thawed, must stop
  without committing); measured beside *host loss* in the same run;
- digits CNN, supervised (workers started with ``--preload examples.digits``): as *supervised*,
  training ``examples/digits-run.json`` (its model, batch,
  a checkpoint every 20 steps, heartbeat timeout 10 s) in 2,000-step segments. Besides the
  heartbeat, the step probe (``bench.harness.steps``: ``step_probe/`` on the workers'
  ``PYTHONPATH``) records every step's time in the worker process: *first step* is the exact time
  of the retry's first update past the step it resumed from; the workers' JSON log lines split the
  retry into its start (server) -> "resumed from step" (the trainer built, the checkpoint restored)
  -> the first step.
Each kill waits until every worker process polls and the segment is making progress, then a
random 0.5–1.5 s more (and never makes a supervisor's 5th crash within its 60 s window, which would
end it by design); then the server is polled every 50 ms:
*retry started* is the next attempt's start (server timestamp), *progress* the first heartbeat of
that attempt past the step it resumed from (up to ~0.3 s late: an upper bound).
Rendered by ``bench.sections.recovery_supervised``.
Run: ``python -m bench.suites.recovery_supervised [--kills 10] [--baseline-kills 3] [--host-kills 7]
[--digits-kills 10] [--only NAME;...] [--quick]`` (``--only`` runs some scenarios, a partial result:
for trying them).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from activities.inputs import CheckpointPolicy, TrainingRunInput
from bench.harness.fleet import Fleet
from bench.harness.machine import machine
from bench.harness.measure import stats
from bench.harness.results import REPO, write_result
from bench.harness.servers import temporal_server
from bench.harness.steps import read_log, read_steps
from bench.harness.temporal import (
    failure_kind,
    kill_events,
    pending_segment,
    run_history,
    wait_worker_polling,
)
from cairn.config import load_config
from workers.client import WORKFLOW_TASK_TIMEOUT, connect
from workers.run_input import load_run_input
from workflows.training_run import TrainingRun

STEP_SECONDS = 0.02
EVERY = 25
DIGITS_SEGMENT_STEPS = 2000
FREEZE_MARGIN_S = 1.5
"""A freeze lasts at least the heartbeat timeout plus this (``workers.drills.schedule``'s margin)."""


async def one_kill(
    client: Any, handle: Any, fleet: Fleet, how: str, probe: Path | None = None, heartbeat: float = 10.0
) -> dict[str, Any] | None:
    """One kill (or freeze) and its recovery; None when the kill missed (the segment it aimed at
    had completed in the instant before it landed: the next segment runs, no retry to time). A
    frozen host is let go on once its segment progresses elsewhere and the freeze has outlasted
    the heartbeat timeout by ``FREEZE_MARGIN_S``."""
    from temporalio.api.enums.v1 import PendingActivityState

    started = PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
    await fleet.ready(client)
    while True:  # a running attempt that has made progress past its resume point, still running after the wait
        view = pending_segment(await handle.describe())
        if not (
            view
            and view["state"] == started
            and view["logical"] is not None
            and isinstance(view["details"].get("step"), int)
            and view["pid"] in fleet.worker_pids()
        ):
            await asyncio.sleep(0.05)
            continue
        await asyncio.sleep(random.uniform(0.5, 1.5))
        view = pending_segment(await handle.describe())
        if (
            view
            and view["state"] == started
            and view["logical"] is not None
            and view["pid"] in fleet.worker_pids()
            and fleet.may_kill(view["pid"])
        ):
            break  # else the segment ended meanwhile, or its worker's supervisor needs a rest: wait
    killed, killed_key, killed_logical, killed_pid = view["attempt"], view["key"], view["logical"], view["pid"]
    torch_loaded = {pid: has_torch(pid) for pid in fleet.worker_pids()} if probe else {}
    t_kill = time.time()
    fleet.kill(killed_pid, how)
    t_retry = t_progress = None
    resumed_from = retry_pid = None
    reoffered = False
    kind = "?"
    frozen = fleet.frozen_pids()
    while t_progress is None:
        desc = await handle.describe()
        view = pending_segment(desc)
        now = time.time()
        if view and view["state"] == started and view["pid"] not in frozen:  # a frozen host "starts" nothing
            same = view["key"] == killed_key
            if not same and view["logical"] is not None and view["logical"] <= killed_logical:
                fleet.thaw()
                return None  # a new segment's own first attempt: the aimed-at one had completed
            retry = (same and view["attempt"] > killed) or (not same and view["logical"] is not None)
            if retry and t_retry is None:
                t_retry = view["started"] or now
                reoffered = not same
                kind = "re-offered to the run's queue" if reoffered else failure_kind(desc)
                retry_pid = view["pid"]
            d = view["details"]
            if retry and view["logical"] is not None and isinstance(d.get("step"), int):
                if resumed_from is None:
                    resumed_from = d.get("committed_step", d["step"])
                if d["step"] > resumed_from:
                    t_progress = now
        if now - t_kill > 120:
            raise TimeoutError(f"no recovery within 120 s after the kill: {view}")
        await asyncio.sleep(0.05)
    assert t_retry is not None
    if fleet.frozen is not None:
        while time.time() - t_kill < heartbeat + FREEZE_MARGIN_S:
            await asyncio.sleep(0.05)
        fleet.thaw()
    out = {
        "t_kill": t_kill,
        "killed_attempt": killed,
        "killed_logical_attempt": killed_logical,
        "reoffered": reoffered,
        "kill_to_retry_started_s": t_retry - t_kill,
        "kill_to_progress_s": t_progress - t_kill,
        "detected_by": kind,
    }
    if probe is not None:
        out.update(probed(probe, fleet, handle.id, killed_pid, t_kill, t_retry, resumed_from, retry_pid))
        out["retry_process_had_torch"] = retry_pid is not None and torch_loaded.get(retry_pid, False)
    return out


def has_torch(pid: int) -> bool:
    """Whether a process has PyTorch loaded (its shared library is mapped): a worker process
    that has built a torch trainer before, vs one that would import it first."""
    try:
        return "libtorch" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


def probed(
    probe: Path,
    fleet: Fleet,
    run_id: str,
    killed_pid: int,
    t_kill: float,
    t_retry: float,
    resumed: int | None,
    pid: Any,
) -> dict[str, Any]:
    """From the step probe and the JSON logs: the retry's first step (exact: the first update any
    other process computed after the kill; the step before it is the one it resumed from, which
    the heartbeat may show only after a later commit) and its "resumed from step" log line (the
    trainer built and the state restored: 1 ms resolution)."""
    first = None
    for _ in range(40):  # the probe's line is written with the step; the heartbeat saw it later
        recs = [r for r in read_steps(probe, run_id) if r[3] != killed_pid and r[0] > t_kill]
        if recs:  # the retry's first update: the step after the checkpoint it resumed from
            first = recs[0]
            resumed = first[1] - 1
            break
        time.sleep(0.05)
    resumed_at = None
    for log in fleet.work.glob("worker-*.log"):
        for t, msg in read_log(log, run_id):
            if t >= t_kill and msg.startswith(f"run {run_id}: resumed from step {resumed} "):
                resumed_at = t if resumed_at is None else min(resumed_at, t)
    return {
        "resumed_from_step": resumed,
        "retry_pid": pid,
        "kill_to_first_step_s": None if first is None else first[0] - t_kill,
        "retry_started_to_resumed_s": None if resumed_at is None else resumed_at - t_retry,
        "resumed_to_first_step_s": None if (resumed_at is None or first is None) else first[0] - resumed_at,
    }


def digits_input(run_id: str, store: Path, heartbeat: float) -> TrainingRunInput:
    """``examples/digits-run.json`` as shipped, but long: a million steps in 2,000-step segments."""
    overrides = {
        "run_id": run_id,
        "store": str(store),
        "total_epochs": None,
        "total_steps": 1_000_000,
        "segment": {"steps": DIGITS_SEGMENT_STEPS},
        "heartbeat_timeout_seconds": heartbeat,
    }
    return load_run_input(str(REPO / "examples" / "digits-run.json"), overrides=overrides)


async def scenario(
    address: str, work: Path, kind: str, count: int, how: str, kills: int, heartbeat: float, model: str = "example"
) -> dict[str, Any]:
    queue = f"supervised-{uuid.uuid4().hex[:6]}"
    client = await connect(address)
    probe = None
    if model == "digits":
        probe = work / "steps"
        probe.mkdir(exist_ok=True)
    # The digits workers preload the trainer's package (`--preload`, as the README advises for torch
    # trainers), so a retry in a fresh worker process does not wait seconds for `import torch`.
    env = {"CAIRN_PRELOAD": "examples.digits"} if probe else None
    fleet = Fleet(address, queue, work, kind, count, steps=probe, env=env)
    run_id = f"recovery-{uuid.uuid4().hex[:6]}"
    try:
        await wait_worker_polling(client, queue, timeout=120)
        if model == "digits":
            inp = digits_input(run_id, work / "store", heartbeat)
        else:
            inp = TrainingRunInput(
                run_id=run_id,
                config=load_config(REPO / "examples" / "config.json"),
                total_steps=1_000_000,
                store=str(work / "store"),
                steps_per_segment=400,
                checkpoint=CheckpointPolicy(every=EVERY),
                heartbeat_timeout_seconds=heartbeat,
                throttle_seconds_per_step=STEP_SECONDS,
            )
        handle = await client.start_workflow(
            TrainingRun.run, inp, id=run_id, task_queue=queue, task_timeout=WORKFLOW_TASK_TIMEOUT
        )
        results: list[dict[str, Any]] = []
        missed = 0
        while len(results) < kills:
            got = await one_kill(client, handle, fleet, how, probe, heartbeat)
            if got is None:
                missed += 1
                print(f"{model}: {kind} x{count}: the kill missed (the segment had just completed): again", flush=True)
                if missed > kills:
                    raise RuntimeError(f"{missed} kills missed their segment")
                continue
            k = got
            results.append(k)
            rep = len(results) - 1
            print(
                f"{model}: {kind} x{count}, {'freeze the host' if how == 'freeze' else 'kill the ' + how}: {rep + 1}: retry started {k['kill_to_retry_started_s']:.2f} s, "
                f"progress {k['kill_to_progress_s']:.2f} s ({k['detected_by']})"
                + (
                    f"; first step {k['kill_to_first_step_s']:.2f} s, started -> resumed {k['retry_started_to_resumed_s']}"
                    if probe
                    else ""
                ),
                flush=True,
            )
        await handle.terminate("benchmark over")
        runs = await run_history(client, run_id, handle.first_execution_run_id or handle.result_run_id or "")
        for k in results:  # what the server recorded between each kill and its retry's start
            k["events"] = kill_events(runs, k["t_kill"], k["t_kill"] + k["kill_to_retry_started_s"] + 0.05)
    finally:
        fleet.stop()
    out = {
        "workers": kind,
        "count": count,
        "kill": how,
        "model": model,
        "missed_kills": missed,
        "heartbeat_timeout_s": heartbeat,
        "kills": results,
        "kill_to_retry_started_s": stats([k["kill_to_retry_started_s"] for k in results]),
        "kill_to_progress_s": stats([k["kill_to_progress_s"] for k in results]),
        "detected_by": sorted({k["detected_by"] for k in results}),
    }
    if model == "digits":
        out["run"] = {
            "file": "examples/digits-run.json",
            "steps_per_segment": DIGITS_SEGMENT_STEPS,
            "checkpoint_every": inp.checkpoint.every,
        }
        for key in ("kill_to_first_step_s", "retry_started_to_resumed_s", "resumed_to_first_step_s"):
            vals = [k[key] for k in results if k.get(key) is not None]
            out[key] = stats(vals) if vals else None
    return out


SCENARIOS: dict[str, tuple[str, int, str, str]] = {
    "supervised": ("supervised", 2, "process", "example"),
    "supervised, one worker": ("supervised", 1, "process", "example"),
    "bare": ("bare", 2, "process", "example"),
    "host loss": ("supervised", 2, "host", "example"),
    "host freeze": ("supervised", 2, "freeze", "example"),
    "digits CNN, supervised": ("supervised", 2, "process", "digits"),
}
"""name -> (workers, how many, what is killed, the model: the throttled example or the digits CNN)."""


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results = {}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-supervised-") as tmp:
        work = Path(tmp)
        with temporal_server(work / "temporal") as address:
            for name, (kind, count, how, model) in SCENARIOS.items():
                if args.only and name not in args.only:
                    continue
                kills = {
                    "supervised": args.kills,
                    "host loss": args.host_kills,
                    "host freeze": args.host_kills,
                    "digits CNN, supervised": args.digits_kills,
                }.get(name, args.baseline_kills)
                sub = work / name.replace(" ", "-").replace(",", "")
                sub.mkdir()
                results[name] = await scenario(address, sub, kind, count, how, kills, args.heartbeat, model)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=10, help="kills of a supervised worker process")
    parser.add_argument("--baseline-kills", type=int, default=3, help="kills in each other scenario")
    parser.add_argument("--host-kills", type=int, default=7, help="host losses, and as many host freezes, side by side")
    parser.add_argument(
        "--digits-kills", type=int, default=10, help="kills of a supervised worker training the digits CNN"
    )
    parser.add_argument(
        "--only",
        help=f"semicolon-separated subset of: {'; '.join(SCENARIOS)} (a partial result, written to the temp dir as --quick)",
    )
    parser.add_argument("--quick", action="store_true", help="2 + 1 kills at a 3 s heartbeat timeout: a smoke run")
    args = parser.parse_args()
    random.seed(17)
    args.heartbeat = 10.0
    args.only = [n.strip() for n in args.only.split(";")] if args.only else None
    if args.quick:
        args.kills, args.baseline_kills, args.host_kills, args.digits_kills, args.heartbeat = 2, 1, 1, 2, 3.0
    at_start = machine()  # the load average before the run, not after it
    results = asyncio.run(main_async(args))
    write_result(
        "recovery_supervised", {"machine": at_start, "scenarios": results}, quick=args.quick or bool(args.only)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
