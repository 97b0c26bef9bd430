# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Segment boundaries on a timeline: the digits CNN and the LM example trained by a ``TrainingRun``
with short segments, every step's wall-clock time recorded, each boundary's gap (the last step of
segment k -> the first step of segment k+1) next to the steps inside the segments.

A real Temporal dev server and one supervised ``cairn worker`` (a supervisor and its worker
process; it keeps up to ``CAIRN_WARM_RUNS`` runs warm in memory between their segments, 2 by
default). The runs are ``examples/digits-run.json`` and ``examples/lm-run.json`` as shipped
(model, batch, checkpoint cadence, heartbeat timeout), on a local-disk store, with a fixed number
of steps per segment so that a boundary comes every second or few (``RUNS`` below: where a run
differs from its file, it says so).

Where the step times come from: ``bench/harness/step_probe/sitecustomize.py`` (on the worker's
``PYTHONPATH``, nothing in Cairn changed) wraps the ``cairn_training_steps`` counter that
``train_segment`` increments once per update, right after the update (and its checkpoint, when
the step is one): one line per step, ``time.time()`` to the microsecond, in the worker process
itself. A step's interval therefore includes its checkpoint save; an evaluation, which the
adapter runs inside the update it follows, falls in that update's interval. The other sources
were coarser: heartbeats reach the server at most once a second (``heartbeat_interval``), the
Prometheus endpoint would have to be scraped every 20-50 ms (each scrape re-renders the SDK's
metrics in the worker process: CPU taken from training on 2 cores) and counts steps, not which
step; the worker's JSON log lines (1 ms resolution) mark a segment's start, resume, commits and
end, and the server's history events (1 µs) the activity's completion and the next one's
schedule and start: both are used to split each boundary's gap into its parts.

Rendered by ``bench.sections.boundaries``.
Run: ``python -m bench.suites.boundaries [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness.machine import machine
from bench.harness.measure import stats
from bench.harness.results import REPO, write_result
from bench.harness.servers import temporal_server
from bench.harness.steps import read_log, read_steps
from bench.harness.temporal import (
    run_history,
    wait_worker_polling,
)
from bench.harness.worker import start_worker
from workers.client import WORKFLOW_TASK_TIMEOUT, connect
from workers.run_input import load_run_input
from workflows.training_run import TrainingRun

RUNS: dict[str, dict[str, Any]] = {
    "digits CNN": {
        "file": "examples/digits-run.json",
        "overrides": {"total_epochs": None, "total_steps": 4800, "segment": {"steps": 200}},
        "quick": {"total_steps": 800},
        "changed": "4,800 steps (≈ 123 epochs) in 200-step segments instead of 6 one-epoch segments",
    },
    "LM": {
        "file": "examples/lm-run.json",
        "overrides": {"total_steps": 200, "segment": {"steps": 20}, "checkpoint": {"every": 10}},
        "quick": {"total_steps": 60},
        "changed": "200 steps in 20-step segments with a checkpoint every 10 instead of 400 steps in 100-step segments, a checkpoint every 50",
    },
}
"""name -> the run file and what is changed in it (top-level fields)."""

STEP_FACTOR = 3.0
PLATEAU_SLACK_S = 0.050
"""No plateau: every boundary's gap <= max(STEP_FACTOR x the median step, the median checkpoint
step + PLATEAU_SLACK_S). A boundary may cost what a checkpoint costs inside a segment plus 50 ms
(a few loopback round trips to the server: the result, the workflow task, the next dispatch)."""


def _ts(event: Any) -> float:
    return float(event.event_time.ToMicroseconds()) / 1e6


def _payload(payloads: Any) -> Any:
    return json.loads(payloads.payloads[0].data) if payloads.payloads else None


def history_events(runs: list[list[Any]]) -> dict[str, Any]:
    """Times of the workflow's start, open_run and every train_segment attempt (server clock)."""
    segments: list[dict[str, Any]] = []
    open_run: dict[str, Any] = {}
    start = None
    for events in runs:
        scheduled: dict[int, tuple[str, float]] = {}
        started: dict[int, float] = {}
        for e in events:
            if start is None and e.HasField("workflow_execution_started_event_attributes"):
                start = _ts(e)
            if e.HasField("activity_task_scheduled_event_attributes"):
                scheduled[e.event_id] = (e.activity_task_scheduled_event_attributes.activity_type.name, _ts(e))
            elif e.HasField("activity_task_started_event_attributes"):
                started[e.activity_task_started_event_attributes.scheduled_event_id] = _ts(e)
            elif e.HasField("activity_task_completed_event_attributes"):
                a = e.activity_task_completed_event_attributes
                name, t_sched = scheduled[a.scheduled_event_id]
                if name == "open_run":
                    open_run = {"scheduled": t_sched, "started": started[a.scheduled_event_id], "completed": _ts(e)}
                    open_run["steps_per_epoch"] = (_payload(a.result) or {}).get("steps_per_epoch")
                elif name == "train_segment":
                    r = _payload(a.result)
                    segments.append(
                        {
                            "scheduled": t_sched,
                            "started": started[a.scheduled_event_id],
                            "completed": _ts(e),
                            "resumed_from_step": r["resumed_from_step"],
                            "step": r["step"],
                            "warm": bool(r.get("warm")),
                            "attempt": r["attempt"],
                        }
                    )
    return {
        "workflow_started": start,
        "open_run": open_run,
        "segments": segments,
        "events_per_run": [len(e) for e in runs],
    }


def committed_steps(log: list[tuple[float, str]], run_id: str) -> set[int]:
    """The steps the worker logged a commit of ("committed step N"): the checkpoint steps."""
    prefix = f"run {run_id}: committed step "
    return {int(msg[len(prefix) :].split()[0]) for _t, msg in log if msg.startswith(prefix)}


def _first(log: list[tuple[float, str]], prefix: str, after: float) -> float | None:
    """The first log line starting with ``prefix`` at or after ``after`` (the log has 1 ms resolution)."""
    return next((t for t, msg in log if msg.startswith(prefix) and t >= after - 0.0015), None)


def analyse(
    steps: list[tuple[float, int, int, int]],
    log: list[tuple[float, str]],
    hist: dict[str, Any],
    run_id: str,
    committed: set[int],
    eval_interval: int | None,
    t_submit: float,
) -> dict[str, Any]:
    """Step intervals by kind, every boundary's gap and its parts, the cold start."""
    if not steps:
        raise RuntimeError("the step probe recorded no steps (see 'step probe not installed' in the worker's log)")
    at = {step: t for t, step, _a, _p in steps}  # one attempt per step here (no kills)
    segs = hist["segments"]
    intervals: dict[str, list[float]] = {"step": [], "checkpoint": [], "evaluation": [], "checkpoint + evaluation": []}
    for s in segs:
        for n in range(s["resumed_from_step"] + 2, s["step"] + 1):
            if n in at and n - 1 in at:
                ckpt = n in committed
                ev = bool(eval_interval and n % eval_interval == 0)
                kind = (
                    "checkpoint + evaluation"
                    if ckpt and ev
                    else "checkpoint"
                    if ckpt
                    else "evaluation"
                    if ev
                    else "step"
                )
                intervals[kind].append(at[n] - at[n - 1])
    boundaries = []
    for k in range(len(segs) - 1):
        a, b = segs[k], segs[k + 1]
        last, first = a["step"], b["resumed_from_step"] + 1
        t_last, t_first = at[last], at[first]
        resumed = _first(log, f"run {run_id}: resumed from step {b['resumed_from_step']}", b["started"])
        ended = _first(log, f"run {run_id}: segment ended at step {last}", t_last)
        parts = {
            "segment end on the worker (last step → ActivityTaskCompleted)": a["completed"] - t_last,
            "workflow task (Completed → next Scheduled)": b["scheduled"] - a["completed"],
            "dispatch (Scheduled → Started)": b["started"] - b["scheduled"],
            "segment start on the worker (Started → resumed log line)": (resumed - b["started"]) if resumed else None,
            "first step (resumed log line → first step)": (t_first - resumed) if resumed else None,
        }
        boundaries.append(
            {
                "after_segment": k + 1,
                "last_step": last,
                "first_step": first,
                "gap_s": t_first - t_last,
                "warm": b["warm"],
                "continued_as_new": False,
                "last_step_to_end_log_s": (ended - t_last) if ended else None,
                "parts_s": parts,
                "evaluation_in_gap": bool(eval_interval and first % eval_interval == 0),
                "checkpoint_in_gap": first in committed,
            }
        )
    first_seg = segs[0]
    t0 = at.get(first_seg["resumed_from_step"] + 1)
    resumed0 = _first(log, f"run {run_id}: resumed from step {first_seg['resumed_from_step']}", first_seg["started"])
    o = hist["open_run"]
    cold = {
        "submit → first step": (t0 - t_submit) if t0 else None,
        "submit → WorkflowExecutionStarted": hist["workflow_started"] - t_submit,
        "open_run (Scheduled → Completed; it builds the trainer once to learn its epoch)": o["completed"]
        - o["scheduled"]
        if o
        else None,
        "open_run Completed → first segment Started": first_seg["started"] - o["completed"] if o else None,
        "segment start on the worker (Started → resumed log line: build, restore or fresh state)": (
            resumed0 - first_seg["started"]
        )
        if resumed0
        else None,
        "resumed log line → first step (the step-0 checkpoint, the first update)": (t0 - resumed0)
        if t0 and resumed0
        else None,
    }
    step_med = statistics.median(intervals["step"])
    saves = intervals["checkpoint"] or intervals["checkpoint + evaluation"]
    ckpt_med = statistics.median(saves) if saves else step_med
    threshold = max(STEP_FACTOR * step_med, ckpt_med + PLATEAU_SLACK_S)
    gaps = [b["gap_s"] for b in boundaries]
    t_start = steps[0][0] if steps else 0.0
    return {
        "steps_recorded": len(steps),
        "segments": len(segs),
        "warm_segments": sum(1 for s in segs if s["warm"]),
        "segments_detail": [{k: v for k, v in s.items()} for s in segs],
        "intervals": {k: stats(v) for k, v in intervals.items() if v},
        "boundaries": boundaries,
        "gap_s": stats(gaps),
        "threshold_s": threshold,
        "plateaus": [b["after_segment"] for b in boundaries if b["gap_s"] > threshold],
        "cold_start_s": cold,
        "timeline": [[round(t - t_start, 6), step] for t, step, _a, _p in steps],
        "t_start": t_start,
    }


async def one_run(
    client: Any, queue: str, name: str, spec: dict[str, Any], work: Path, steps_dir: Path, log_path: Path, quick: bool
) -> dict[str, Any]:
    run_id = f"bound-{name.split()[0].lower()}-{uuid.uuid4().hex[:6]}"
    overrides = {
        **spec["overrides"],
        **(spec["quick"] if quick else {}),
        "run_id": run_id,
        "store": str(work / "store"),
    }
    inp = load_run_input(str(REPO / spec["file"]), overrides=overrides)
    t_submit = time.time()
    handle = await client.start_workflow(
        TrainingRun.run, inp, id=run_id, task_queue=queue, task_timeout=WORKFLOW_TASK_TIMEOUT
    )
    summary = await handle.result()
    wall = time.time() - t_submit
    first_run = handle.first_execution_run_id or handle.result_run_id or ""
    hist = history_events(await run_history(client, run_id, first_run))
    await asyncio.sleep(0.5)  # the log lines and the probe's writes of the last step are on disk
    options = inp.config.trainer.options if inp.config.trainer is not None else {}
    spe = hist["open_run"].get("steps_per_epoch")
    eval_interval = (options or {}).get("eval_every") or spe
    log = read_log(log_path, run_id)
    result = analyse(
        read_steps(steps_dir, run_id),
        log,
        hist,
        run_id,
        committed_steps(log, run_id),
        eval_interval,
        t_submit,
    )
    cont = (
        getattr(summary, "continued_as_new", None) if not isinstance(summary, dict) else summary.get("continued_as_new")
    )
    # which boundaries are continue-as-new: after every segments_per_run segments
    for b in result["boundaries"]:
        b["continued_as_new"] = b["after_segment"] % inp.segments_per_run == 0
    result.update(
        {
            "run_file": spec["file"],
            "changed": spec["changed"],
            "total_steps": inp.total_steps,
            "steps_per_segment": inp.segment.steps if inp.segment else None,
            "checkpoint_every": inp.checkpoint.every,
            "checkpoint_steps": sorted(committed_steps(log, run_id)),
            "eval_interval": eval_interval,
            "steps_per_epoch": spe,
            "heartbeat_timeout_s": inp.heartbeat_timeout_seconds,
            "segments_per_run": inp.segments_per_run,
            "continued_as_new": cont,
            "wall_s": wall,
            "events_per_run": hist["events_per_run"],
        }
    )
    return result


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-boundaries-") as tmp:
        work = Path(tmp)
        steps_dir = work / "steps"
        steps_dir.mkdir()
        log_path = work / "worker.log"
        with temporal_server(work / "temporal") as address:
            queue = f"bounds-{uuid.uuid4().hex[:6]}"
            worker = start_worker(address, queue, log_path, steps=steps_dir)
            try:
                client = await connect(address)
                await wait_worker_polling(client, queue, timeout=120)
                for name, spec in RUNS.items():
                    r = await one_run(client, queue, name, spec, work, steps_dir, log_path, args.quick)
                    results[name] = r
                    g, s = r["gap_s"], r["intervals"]["step"]
                    print(
                        f"{name}: {r['segments']} segments ({r['warm_segments']} warm) in {r['wall_s']:.1f} s; step "
                        f"{s['median'] * 1e3:.1f} ms; boundary gap {g['median'] * 1e3:.1f} ms ({g['min'] * 1e3:.1f}–"
                        f"{g['max'] * 1e3:.1f}); threshold {r['threshold_s'] * 1e3:.1f} ms; plateaus {r['plateaus']}; "
                        f"cold start {r['cold_start_s']['submit → first step']:.2f} s",
                        flush=True,
                    )
            finally:
                worker.stop(grace=10)
                if args.keep_logs:
                    keep = Path(args.keep_logs)
                    keep.mkdir(parents=True, exist_ok=True)
                    (keep / "worker.log").write_bytes(log_path.read_bytes())
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short runs: a smoke run")
    parser.add_argument("--keep-logs", help="copy the worker's log here (to read what a boundary did)")
    args = parser.parse_args()
    at_start = machine()  # the load average before the run, not after it
    results = asyncio.run(main_async(args))
    write_result(
        "boundaries",
        {"machine": at_start, "warm_runs": int(os.environ.get("CAIRN_WARM_RUNS", "2")), "runs": results},
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
