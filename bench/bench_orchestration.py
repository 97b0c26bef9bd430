# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Orchestration: the same run as a Temporal ``TrainingRun`` vs the in-process loop.

A real Temporal dev server and one ``cairn worker`` process are started here (as the tests and
``cairn dev up`` start them). Each scenario runs the same steps with the same cadence —
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
``section`` / ``plot`` render section 4 of ``BENCHMARKS.md`` and ``results/orchestration.png`` from the results.
Run: ``python bench/bench_orchestration.py [--reps 5] [--quick]``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    REPO,
    machine,
    run_history,
    stats,
    temporal_server,
    wait_worker_polling,
    worker_process,
    write_result,
)
from render import Targets, spread  # noqa: E402

from activities.models import DEFAULT_SEGMENT_SECONDS, TrainingRunInput  # noqa: E402
from activities.views import RunSummary  # noqa: E402
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage  # noqa: E402
from cairn.config import load_config  # noqa: E402
from cairn.session import TrainingSession  # noqa: E402
from cairn.stores import LocalStore  # noqa: E402
from workers.client import connect  # noqa: E402
from workflows.training_run import TrainingRun  # noqa: E402

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
            worker = worker_process(address, queue, work / "worker.log")
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


# -- section 4 of BENCHMARKS.md and its plot ------------------------------------------------------


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    """Section 4: each scenario both ways, the per-segment latencies, the history; the 3% target."""
    c = r["cadence"]
    out = [
        "## 4. Orchestration: Temporal vs the in-process loop",
        "",
        f"The same run both ways, at the default cadence ({c.get('segment_seconds', 30):.0f}-second segments, a "
        f"checkpoint every {c['checkpoint_every']}, retention keep-last {c['retention_keep_last']} after each segment, "
        f"continue-as-new every {c['segments_per_run']} segments) and with segments of {c['steps_per_segment']} steps "
        f"(every boundary shows), local disk, {r['reps']} interleaved reps: a `TrainingRun` on a real Temporal dev "
        "server with one `cairn worker` process already polling (start to result), vs `TrainingSession` "
        "in-process over the same segments (checkpoint at step 0, every 10 steps, `collect_garbage` after each "
        "segment). Step time: the example model (sub-millisecond steps), and a heavier model simulated by a 20 ms "
        "sleep per step on both sides. Warm: segments that continued from the worker's memory (no restore).",
        "",
        "| scenario | steps | segments (warm) | Temporal | in-process | ratio | overhead per segment |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, x in r["scenarios"].items():
        out.append(
            f"| {name} | {x['total_steps']} | {x['segments']} ({x.get('warm_segments', 0)}) | {spread(x['temporal'])} | "
            f"{spread(x['in_process'])} | **{x['ratio']:.3f}** | {x['overhead_per_segment_s'] * 1e3:.0f} ms |"
        )
    out += ["", "Per segment, from the workflow's history (first Temporal rep):", ""]
    out += [
        "| scenario | ActivityTaskScheduled → Started | segment Completed → next Scheduled | segment Started → Completed |"
    ]
    out += ["|---|---|---|---|"]
    for name, x in r["scenarios"].items():
        h = x["history"]
        between = h["segment_done_to_next_scheduled_s"]
        out.append(
            f"| {name} | {spread(h['segment_schedule_to_start_s'], 'ms', 1e3, 1)} | "
            f"{spread(between, 'ms', 1e3, 1) if between else '–'} | {spread(h['segment_started_to_completed_s'], 'ms', 1e3, 1)} |"
        )
    sdk = {n: x["sdk_latencies_ms"] for n, x in r["scenarios"].items() if x.get("sdk_latencies_ms")}
    if sdk:
        out += [
            "",
            "Where the milliseconds go, from the Temporal SDK's own histograms (the worker's metrics, mean over each "
            "scenario's Temporal reps; a segment boundary needs the activity's completion and the workflow task's "
            "response, two server requests, and two dispatches):",
            "",
            "| scenario | " + " | ".join(SDK_LATENCIES.values()) + " |",
            "|---|" + "---|" * len(SDK_LATENCIES),
        ]
        for name, lat in sdk.items():
            cells = [f"{lat[k]['mean_ms']:.1f} ms" if k in lat else "–" for k in SDK_LATENCIES]
            out.append(f"| {name} | " + " | ".join(cells) + " |")
    full = next((x for x in r["scenarios"].values() if x["continued_as_new"] > 0), None)
    if full is not None:
        m = full["million_steps"]
        out += [
            "",
            f"History: the {full['total_steps']}-step run continued as new {full['continued_as_new']} time(s); events per "
            f"run {full['history']['events_per_run']} — each full run (20 segments, 1,000 steps) has the same number "
            f"of events, however long the whole run: **{full['events_per_1000_steps']:.0f} events per 1,000 steps**. "
            f"A 1,000,000-step run at this cadence is {m['runs']:,} runs of ≤ {m['largest_history_events']} events each "
            f"(Temporal's limit is 51,200 events per run), about {m['total_events_all_runs']:,} events in all; no single "
            "history grows with the run's length.",
        ]
    default = {n: x for n, x in r["scenarios"].items() if x.get("segment", "default") == "default"}
    stepped = {n: x for n, x in r["scenarios"].items() if x.get("segment", "default") != "default"}
    worst = max((x["overhead"] for x in default.values()), default=float("inf"))
    fixed = [x["temporal"]["median"] - x["in_process"]["median"] for x in default.values() if x["segments"] == 1]
    fixed_note = (
        f"a fixed cost per run of {min(fixed):.2f}–{max(fixed):.2f} s (start, open_run, the first workflow task, "
        "the last retention pass and workflow task) shows on runs of a few seconds"
        if fixed
        else ""
    )
    targets.add(
        "Temporal run within 3% of the in-process loop at the default cadence",
        ", ".join(f"{n}: {x['overhead']:+.1%}" for n, x in default.items()),
        worst <= 0.03,
        fixed_note,
    )
    if fixed_note:
        out += ["", f"At the default cadence {fixed_note}; on a longer run it is amortised (the 25,000-step row)."]
    if stepped:
        per_seg = max(x["overhead_per_segment_s"] for x in stepped.values())
        temporal = [
            x["history"]["segment_schedule_to_start_s"]["median"]
            + x["history"]["segment_done_to_next_scheduled_s"]["median"]
            for x in stepped.values()
            if x["history"]["segment_done_to_next_scheduled_s"]
        ]
        targets.add(
            "per-segment fixed cost on a warm worker <= 20 ms",
            ", ".join(f"{n}: {x['overhead_per_segment_s'] * 1e3:.0f} ms" for n, x in stepped.items()),
            per_seg <= 0.020,
            f"Temporal's own round trip per segment (Completed → next Scheduled → Started) is "
            f"{min(temporal) * 1e3:.0f}–{max(temporal) * 1e3:.0f} ms of it"
            if temporal
            else "",
        )
    out += ["", "![orchestration](bench/results/orchestration.png)", ""]
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``orchestration.png``: wall seconds per scenario, both ways."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(r["scenarios"])
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(7, 4))
    t = [r["scenarios"][n]["temporal"]["median"] for n in names]
    p = [r["scenarios"][n]["in_process"]["median"] for n in names]
    ax.bar(x - 0.2, p, 0.4, label="in-process loop")
    ax.bar(x + 0.2, t, 0.4, label="Temporal TrainingRun")
    for xi, a, b in zip(x, p, t, strict=True):
        ax.text(xi + 0.2, b, f"{b / a:.2f}×", ha="center", va="bottom", fontsize=9)
    ax.set_xticks(x, [f"{n}\n{r['scenarios'][n]['total_steps']} steps" for n in names])
    ax.set_ylabel("wall seconds (median)")
    ax.set_title("same run, default cadence: Temporal vs in-process")
    ax.legend()
    fig.tight_layout()
    path = folder / "orchestration.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


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
