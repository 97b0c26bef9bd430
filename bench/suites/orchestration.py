# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Orchestration: the same run as a Temporal ``TrainingRun`` vs the in-process loop.

A real Temporal dev server and one ``cairn worker --no-supervisor`` process are started here (as the
tests start them). Each scenario runs the same steps with the same cadence —
the defaults of ``TrainingRunInput`` (30-second segments, a checkpoint every 10 steps, retention
keep-last 3 after every segment, continue-as-new every 20 segments), or segments of 50 steps
(where every segment boundary shows: warm segments continue from the worker's memory) — both
ways, interleaved rep by rep, on local disk:
- Temporal: ``start_workflow(TrainingRun.run)`` to its result (the worker is already polling);
- in-process: ``TrainingSession`` over the same segments (step 0 committed, a checkpoint every
  10 steps, ``collect_garbage`` after each segment), no Temporal.
Step time is the example model's (sub-millisecond) or, with ``throttle_seconds_per_step``,
a heavier model's (the same sleep per step on both sides).
From the workflow's history (every run, following continue-as-new): per-segment scheduling
latency (a segment's ActivityTaskScheduled -> Started; the previous segment's Completed -> the
next Scheduled, which includes the workflow task and the retention activity), events per run
and per 1,000 steps, and what a 1,000,000-step run makes of them.
Rendered by ``bench.sections.orchestration``.
Run: ``python -m bench.suites.orchestration [--reps 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from activities.inputs import DEFAULT_SEGMENT_SECONDS, TrainingRunInput
from activities.views import RunSummary
from bench.harness.machine import machine
from bench.harness.measure import stats
from bench.harness.results import REPO, write_result
from bench.harness.servers import temporal_server
from bench.harness.temporal import (
    run_history,
    wait_worker_polling,
)
from bench.harness.worker import start_worker
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage
from cairn.config import load_config
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from workers.client import connect
from workflows.training_run import TrainingRun

DEFAULTS = TrainingRunInput.model_validate(
    {"run_id": "x", "config": load_config(REPO / "examples" / "config.json").model_dump(mode="json"),
     "total_steps": 1, "store": "/x"}
)  # fmt: skip


SEGMENT_STEPS = 50


def segment_size(segment: dict[str, Any]) -> tuple[int | None, float | None]:
    """(steps, seconds) of a scenario's segments: the run input's default unless it names steps."""
    inp = DEFAULTS.model_copy(update={"segment": None}) if not segment else DEFAULTS
    steps = segment.get("steps")
    return steps, None if steps else (inp.segment.seconds if inp.segment else DEFAULT_SEGMENT_SECONDS)


def in_process(store_root: Path, run_id: str, total: int, throttle: float, segment: dict[str, Any]) -> float:
    config = load_config(REPO / "examples" / "config.json")
    start = time.perf_counter()
    store = LocalStore(store_root)
    session = TrainingSession.fresh(run_id, store, config)
    session.checkpoint()  # step 0, as the first segment commits it
    policy = DEFAULTS.retention
    assert policy is not None
    retention = RetentionPolicy(policy.keep_last, policy.keep_every, policy.grace_seconds)

    seg_steps, seg_seconds = segment_size(segment)
    deadline = 0.0

    def on_step(_state: object) -> bool:
        if throttle:
            time.sleep(throttle)
        return seg_seconds is not None and time.monotonic() >= deadline

    while session.state.step < total:
        deadline = time.monotonic() + (seg_seconds or 0.0)
        steps = min(seg_steps or total, total - session.state.step)
        session.run(steps, checkpoint_every=DEFAULTS.checkpoint.every, on_step=on_step)
        collect_garbage(store, run_id, retention)
    return time.perf_counter() - start


async def on_temporal(
    client: Any, queue: str, store_root: Path, run_id: str, total: int, throttle: float, segment: dict[str, Any]
) -> tuple[float, str, RunSummary]:
    config = load_config(REPO / "examples" / "config.json")
    inp = TrainingRunInput.model_validate(
        {
            "run_id": run_id,
            "config": config.model_dump(mode="json"),
            "total_steps": total,
            "store": str(store_root),
            "throttle_seconds_per_step": throttle,
            **({"segment": segment} if segment else {}),
        }
    )
    start = time.perf_counter()
    handle = await client.start_workflow(TrainingRun.run, inp, id=run_id, task_queue=queue)
    summary = RunSummary.model_validate(await handle.result())
    seconds = time.perf_counter() - start
    assert summary.steps == total, summary
    return seconds, handle.first_execution_run_id or handle.result_run_id or "", summary


def _ts(event: Any) -> float:
    return float(event.event_time.ToMicroseconds()) / 1e6


def analyse_history(runs: list[list[Any]]) -> dict[str, Any]:
    """Scheduling latencies of train_segment activities and event counts per run."""
    schedule_to_start: list[float] = []
    between_segments: list[float] = []
    segment_inside: list[float] = []
    warm = 0
    for events in runs:
        scheduled: dict[int, tuple[str, float]] = {}
        started: dict[int, float] = {}
        last_segment_done: float | None = None
        for e in events:
            if e.HasField("activity_task_scheduled_event_attributes"):
                name = e.activity_task_scheduled_event_attributes.activity_type.name
                scheduled[e.event_id] = (name, _ts(e))
                if name == "train_segment" and last_segment_done is not None:
                    between_segments.append(_ts(e) - last_segment_done)
            elif e.HasField("activity_task_started_event_attributes"):
                sid = e.activity_task_started_event_attributes.scheduled_event_id
                started[sid] = _ts(e)
                if scheduled.get(sid, ("", 0))[0] == "train_segment":
                    schedule_to_start.append(_ts(e) - scheduled[sid][1])
            elif e.HasField("activity_task_completed_event_attributes"):
                sid = e.activity_task_completed_event_attributes.scheduled_event_id
                if scheduled.get(sid, ("", 0))[0] == "train_segment":
                    last_segment_done = _ts(e)
                    segment_inside.append(_ts(e) - started[sid])
                    payloads = e.activity_task_completed_event_attributes.result.payloads
                    warm += bool(payloads and json.loads(payloads[0].data).get("warm"))
    return {
        "events_per_run": [len(events) for events in runs],
        "segment_schedule_to_start_s": stats(schedule_to_start),
        "segment_done_to_next_scheduled_s": stats(between_segments) if between_segments else None,
        "segment_started_to_completed_s": stats(segment_inside),
        "warm_segments": warm,
    }


async def scenario(
    client: Any, queue: str, work: Path, total: int, throttle: float, segment: dict[str, Any], reps: int
) -> dict[str, Any]:
    times: dict[str, list[float]] = {"temporal": [], "in_process": []}
    history: dict[str, Any] | None = None
    summary: RunSummary | None = None
    for rep in range(reps):
        order = ["temporal", "in_process"] if rep % 2 == 0 else ["in_process", "temporal"]
        for side in order:
            run_id = f"orch-{side.replace('_', '')}-{uuid.uuid4().hex[:6]}"
            if side == "temporal":
                seconds, first_run, summary = await on_temporal(
                    client, queue, work / "store", run_id, total, throttle, segment
                )
                if history is None:
                    history = analyse_history(await run_history(client, run_id, first_run))
            else:
                seconds = await asyncio.to_thread(in_process, work / "store", run_id, total, throttle, segment)
            times[side].append(seconds)
    assert history is not None and summary is not None
    t, p = stats(times["temporal"]), stats(times["in_process"])
    segments = summary.segments
    per_run_steps = DEFAULTS.segments_per_run * total / max(1, segments)
    events = history["events_per_run"]
    full_runs = [n for n in events[:-1]] or events
    million = 1_000_000
    return {
        "total_steps": total,
        "throttle_seconds_per_step": throttle,
        "segment": segment or "default",
        "segments": segments,
        "warm_segments": history["warm_segments"],
        "temporal": t,
        "in_process": p,
        "ratio": t["median"] / p["median"],
        "overhead": t["median"] / p["median"] - 1,
        "overhead_per_segment_s": (t["median"] - p["median"]) / max(1, segments),
        "history": history,
        "events_per_1000_steps": sum(events) / total * 1000,
        "continued_as_new": summary.continued_as_new,
        "million_steps": {
            "runs": math.ceil(million / per_run_steps),
            "events_per_run": max(full_runs),
            "largest_history_events": max(full_runs),
            "total_events_all_runs": round(sum(events) / total * million),
        },
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cairn-bench-orch-") as tmp:
        work = Path(tmp)
        with temporal_server(work / "temporal") as address:
            queue = f"bench-{uuid.uuid4().hex[:6]}"
            worker = start_worker(address, queue, work / "worker.log", supervised=False)
            try:
                client = await connect(address)
                await wait_worker_polling(client, queue)
                results = {}
                metrics_url = worker_metrics_url(work / "worker.log")
                for name, total, throttle, segment in args.scenarios:
                    before = scrape_sdk_latencies(metrics_url)
                    r = await scenario(client, queue, work, total, throttle, segment, args.reps)
                    r["sdk_latencies_ms"] = latency_delta(before, scrape_sdk_latencies(metrics_url))
                    results[name] = r
                    h = r["history"]
                    print(
                        f"{name}: {total} steps, {r['segments']} segments; temporal {r['temporal']['median']:.2f}s"
                        f" in-process {r['in_process']['median']:.2f}s ratio {r['ratio']:.3f}"
                        f" (+{r['overhead_per_segment_s'] * 1e3:.0f} ms/segment); schedule->start"
                        f" {h['segment_schedule_to_start_s']['median'] * 1e3:.1f} ms; events per run"
                        f" {h['events_per_run']}; per 1000 steps {r['events_per_1000_steps']:.0f}",
                        flush=True,
                    )
                return results
            finally:
                worker.stop(grace=10)


SDK_LATENCIES = {
    "temporal_request_latency": "server request (not a long poll)",
    "temporal_workflow_task_execution_latency": "workflow code per workflow task",
    "temporal_workflow_task_schedule_to_start_latency": "workflow task scheduled -> started",
    "temporal_activity_schedule_to_start_latency": "activity scheduled -> started",
}
"""The Temporal SDK's own latency histograms, read off the worker's metrics endpoint: where a
segment boundary's milliseconds go between the worker and the server."""


def worker_metrics_url(log: Path, timeout: float = 30.0) -> str | None:
    """The worker's metrics URL, from the line it logs at start (``metrics on URL``)."""
    import re

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(r"metrics on (\S+)", log.read_text() if log.exists() else "")
        if found:
            return found.group(1)
        time.sleep(0.1)
    return None


def scrape_sdk_latencies(url: str | None) -> dict[str, tuple[float, float]]:
    """(sum ms, count) of each of ``SDK_LATENCIES``, summed over its labels."""
    import re
    import urllib.request

    if url is None:
        return {}
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, tuple[float, float]] = {}
    for line in text.splitlines():
        m = re.match(r"([a-z_]+)_(sum|count)(?:\{[^}]*\})? ([0-9.e+-]+)$", line)
        if m and m.group(1) in SDK_LATENCIES:
            total, count = out.get(m.group(1), (0.0, 0.0))
            value = float(m.group(3))
            out[m.group(1)] = (total + value, count) if m.group(2) == "sum" else (total, count + value)
    return out


def latency_delta(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """Mean ms and count of each latency over a scenario (its Temporal reps)."""
    out: dict[str, Any] = {}
    for name, (total, count) in after.items():
        t0, c0 = before.get(name, (0.0, 0.0))
        if count > c0:
            out[name] = {"mean_ms": (total - t0) / (count - c0), "count": int(count - c0)}
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small runs, 2 reps: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.reps = 2
        args.scenarios = [
            ("example model", 1100, 0.0, {}),
            ("20 ms steps", 100, 0.02, {}),
            ("example model, 50-step segments", 1100, 0.0, {"steps": SEGMENT_STEPS}),
        ]
    else:
        args.scenarios = [
            ("example model", 2500, 0.0, {}),
            ("example model, 25,000 steps", 25_000, 0.0, {}),
            ("20 ms steps", 500, 0.02, {}),
            ("example model, 50-step segments", 2500, 0.0, {"steps": SEGMENT_STEPS}),
            ("20 ms steps, 50-step segments", 500, 0.02, {"steps": SEGMENT_STEPS}),
        ]
    results = asyncio.run(main_async(args))
    write_result(
        "orchestration",
        {
            "machine": machine(),
            "reps": args.reps,
            "cadence": {
                "segment_seconds": DEFAULT_SEGMENT_SECONDS,
                "steps_per_segment": SEGMENT_STEPS,
                "checkpoint_every": DEFAULTS.checkpoint.every,
                "segments_per_run": DEFAULTS.segments_per_run,
                "retention_keep_last": DEFAULTS.retention.keep_last if DEFAULTS.retention else None,
            },
            "scenarios": results,
        },
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
