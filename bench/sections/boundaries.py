# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 16 of ``BENCHMARKS.md`` (segment boundaries on a timeline) and ``boundaries.png``,
from the results of ``bench.suites.boundaries``: per model, the step intervals by kind, the
boundary gaps and their parts, the cold start; the no-plateau target."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench.harness.measure import stats
from bench.sections import Targets, spread
from bench.suites.boundaries import PLATEAU_SLACK_S, STEP_FACTOR

PART_SHORT = {
    "segment end on the worker (last step → ActivityTaskCompleted)": "end",
    "workflow task (Completed → next Scheduled)": "workflow",
    "dispatch (Scheduled → Started)": "dispatch",
    "segment start on the worker (Started → resumed log line)": "start",
    "first step (resumed log line → first step)": "first step",
}


def _ms(x: float | None) -> str:
    return "–" if x is None else f"{x * 1e3:.1f} ms"


def findings(v: dict[str, Any]) -> str:
    """What one model's boundaries cost, what the largest part is, and how they compare with the
    slowest intervals inside the segments (all from the data)."""
    step = v["intervals"]["step"]["median"]
    excess = [b["gap_s"] - step for b in v["boundaries"]]
    medians = {
        part: statistics.median(vals)
        for part in PART_SHORT
        if (vals := [b["parts_s"][part] for b in v["boundaries"] if b["parts_s"].get(part) is not None])
    }
    biggest = max(medians, key=lambda k: medians[k]) if medians else None
    inside_kind, inside = max(((k, iv["max"]) for k, iv in v["intervals"].items()), key=lambda kv: kv[1])
    worst = max(v["boundaries"], key=lambda b: b["gap_s"])
    text = (
        f"a boundary costs {statistics.median(excess) * 1e3:.0f} ms more than a step (median; {min(excess) * 1e3:.0f}–{max(excess) * 1e3:.0f} ms), "
        f"{statistics.median(excess) / step:.1f} steps' worth"
    )
    if biggest:
        text += f"; its largest part is the {PART_SHORT[biggest]} ({medians[biggest] * 1e3:.1f} ms median)"
    text += (
        f". The slowest boundary (after segment {worst['after_segment']}, {worst['gap_s'] * 1e3:.0f} ms) is "
        f"{'shorter' if worst['gap_s'] < inside else 'longer'} than the slowest interval inside a segment ({inside * 1e3:.0f} ms, a {inside_kind} interval)"
    )
    can = [b for b in v["boundaries"] if b["continued_as_new"]]
    for b in can:
        wf = b["parts_s"]["workflow task (Completed → next Scheduled)"]
        text += f". Where the run continued as new (after segment {b['after_segment']}): {b['gap_s'] * 1e3:.0f} ms, the workflow task {wf * 1e3:.0f} ms of it (the new run's first)"
    cold = v["cold_start_s"]
    first = cold.get("submit → first step")
    opened = cold.get("open_run (Scheduled → Completed; it builds the trainer once to learn its epoch)")
    if first is not None and opened is not None:
        text += (
            f". Cold start: {first:.2f} s from `start_workflow` to the first step, {opened:.2f} s of it in `open_run`"
        )
    cold_segments = [i + 1 for i, s in enumerate(v["segments_detail"]) if not s["warm"]]
    return text + f"; segments that ran cold: {', '.join(map(str, cold_segments)) or 'none'}."


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    x = r["runs"]
    m = r["machine"]
    out = [
        f"One supervised `cairn worker` (warm runs kept in memory: `CAIRN_WARM_RUNS` {r.get('warm_runs', 2)}) on a real Temporal dev server, local-disk store; one run on {m['cpu']} ({m['cores']} cores, load average {m['loadavg_at_start'][0]:.1f} at the start). "
        "The run files as shipped except: "
        + "; ".join(f"{name} ({v['run_file']}): {v['changed']}" for name, v in x.items())
        + ". Every step's wall-clock time is recorded in the worker process by a bench-only probe (`bench/harness/step_probe/`: it wraps the `cairn_training_steps` counter that `train_segment` increments after each update and its checkpoint, if any; microsecond timestamps, one per step; nothing in Cairn changed). "
        "A *checkpoint step* is an interval that ends with a save, an *evaluation step* one whose update is followed by the validation pass. "
        "*Boundary gap*: the last step of segment k → the first step of segment k+1 (segments end on a checkpoint step, so the end-of-segment save is in the interval before the gap, not in it). "
        f"**No plateau** means every boundary gap ≤ max({STEP_FACTOR:g}× the median step, the median checkpoint step + {PLATEAU_SLACK_S * 1e3:.0f} ms), a threshold fixed before the run.",
        "",
        "| model | steps | segments (warm) | step | checkpoint step | evaluation step | boundary gap | threshold | plateaus |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in x.items():
        iv = v["intervals"]
        both = iv.get("checkpoint + evaluation")
        ck = spread(iv["checkpoint"], "ms", 1e3, 1) if "checkpoint" in iv else "–"
        ev = spread(iv["evaluation"], "ms", 1e3, 1) if "evaluation" in iv else "–"
        if both and "evaluation" not in iv:
            ev = f"{spread(both, 'ms', 1e3, 1)}, with a checkpoint"
        out.append(
            f"| {name} | {v['total_steps']} ({v['steps_per_segment']} a segment, checkpoint every {v['checkpoint_every']}, evaluation every {v['eval_interval']}) | "
            f"{v['segments']} ({v['warm_segments']}) | {spread(iv['step'], 'ms', 1e3, 1)} | {ck} | "
            f"{ev} | {spread(v['gap_s'], 'ms', 1e3, 1)} | {v['threshold_s'] * 1e3:.1f} ms | "
            f"{len(v['plateaus'])} of {len(v['boundaries'])} |"
        )
    out.append("")
    for name, v in x.items():
        out.append(f"- {name}: " + findings(v))
    out += [
        "",
        "Where a boundary's gap goes (median over its boundaries, min–max): the worker finishing the segment and reporting it "
        "(last step → ActivityTaskCompleted, server time), the workflow task that schedules the next segment (Completed → Scheduled), "
        "the dispatch to the worker's poll (Scheduled → Started), the worker's segment start up to its \"resumed from step\" log line "
        "(the store, the ownership check, the warm check: the latest commit's step and fingerprint), and from there the first step (its update). "
        "Worker log lines have 1 ms resolution.",
        "",
        "| model | " + " | ".join(PART_SHORT.values()) + " | gap |",
        "|---|" + "---|" * (len(PART_SHORT) + 1),
    ]
    for name, v in x.items():
        cells = []
        for part in PART_SHORT:
            vals = [b["parts_s"][part] for b in v["boundaries"] if b["parts_s"].get(part) is not None]
            cells.append(spread(stats(vals), "ms", 1e3, 1) if vals else "–")
        out.append(f"| {name} | " + " | ".join(cells) + f" | {spread(v['gap_s'], 'ms', 1e3, 1)} |")
    out += ["", "Every boundary (gap; the slowest part; what else happened there):", ""]
    out += ["| model | after segment | steps | gap | warm | slowest part | note |", "|---|---|---|---|---|---|---|"]
    for name, v in x.items():
        for b in v["boundaries"]:
            parts = {k: p for k, p in b["parts_s"].items() if p is not None}
            slow = max(parts, key=lambda k: parts[k]) if parts else None
            note = ", ".join(
                n
                for n, on in (
                    ("continued as new", b["continued_as_new"]),
                    ("plateau", b["gap_s"] > v["threshold_s"]),
                    ("a checkpoint in the gap", b["checkpoint_in_gap"]),
                    ("an evaluation in the gap", b["evaluation_in_gap"]),
                )
                if on
            )
            out.append(
                f"| {name} | {b['after_segment']} | {b['last_step']} → {b['first_step']} | {_ms(b['gap_s'])} | {'yes' if b['warm'] else 'no'} | "
                f"{PART_SHORT[slow] + ' ' + _ms(parts[slow]) if slow else '–'} | {note} |"
            )
    out += [
        "",
        f"The first (cold) segment, from the client's `start_workflow` ({' then '.join(x)} on the same worker process, "
        "just started for the first: the first run's `open_run` is where it imports PyTorch and the model's libraries):",
        "",
    ]
    keys = list(next(iter(x.values()))["cold_start_s"])
    out += ["| model | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name, v in x.items():
        c = v["cold_start_s"]
        out.append(f"| {name} | " + " | ".join("–" if c[k] is None else f"{c[k]:.2f} s" for k in keys) + " |")
    ok = all(not v["plateaus"] for v in x.values())
    targets.add(
        "digits CNN / LM: no plateau at segment boundaries (issue 26)",
        ", ".join(
            f"{n}: gap {v['gap_s']['median'] * 1e3:.0f} ms median, {v['gap_s']['max'] * 1e3:.0f} ms worst vs {v['threshold_s'] * 1e3:.0f} ms"
            for n, v in x.items()
        ),
        ok,
        f"threshold max({STEP_FACTOR:g}× median step, median checkpoint step + {PLATEAU_SLACK_S * 1e3:.0f} ms); "
        + ", ".join(
            f"{n}: {len(v['plateaus'])} of {len(v['boundaries'])} boundaries over it, {v['warm_segments']} of {v['segments']} segments warm"
            for n, v in x.items()
        )
        + "; section 16",
    )
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``boundaries.png``: per model, steps vs wall time and each step's interval, boundaries marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = r["runs"]
    fig, axes = plt.subplots(2, len(runs), figsize=(6.5 * len(runs), 7), squeeze=False)
    for col, (name, v) in enumerate(runs.items()):
        tl = v["timeline"]
        ts = [t for t, _ in tl]
        st = [s for _, s in tl]
        at = {s: t for t, s in tl}
        top, bottom = axes[0][col], axes[1][col]
        top.plot(ts, st, linewidth=0.9)
        for b in v["boundaries"]:
            t = at.get(b["last_step"])
            if t is not None:
                top.axvline(t, color="gray", linewidth=0.4, alpha=0.6)
        top.set_xlabel("wall seconds since the first step")
        top.set_ylabel("step")
        top.set_title(f"{name}: {v['segments']} segments ({v['warm_segments']} warm); gray: boundaries")
        saved, ev = set(v.get("checkpoint_steps", [])), v["eval_interval"]
        xs, ys, colors = [], [], []
        for (t0, s0), (t1, s1) in zip(tl, tl[1:], strict=False):
            if s1 != s0 + 1:
                continue
            xs.append(s1)
            ys.append((t1 - t0) * 1e3)
            colors.append("tab:orange" if s1 in saved else "tab:green" if ev and s1 % ev == 0 else "tab:blue")
        bx = [b["first_step"] for b in v["boundaries"]]
        by = [b["gap_s"] * 1e3 for b in v["boundaries"]]
        dense = [i for i, c in enumerate(colors) if c != "tab:blue" or xs[i] not in set(bx)]
        bottom.scatter([xs[i] for i in dense], [ys[i] for i in dense], s=3, c=[colors[i] for i in dense])
        bottom.scatter(bx, by, s=22, c="red", marker="x", label="boundary gap")
        bottom.axhline(
            v["threshold_s"] * 1e3, color="red", linewidth=0.7, linestyle="dashed", label="plateau threshold"
        )
        bottom.set_yscale("log")
        bottom.set_ylim(top=max([*ys, *by, v["threshold_s"] * 1e3]) * 5)  # room for the legend above the points
        bottom.set_xlabel("step")
        bottom.set_ylabel("interval before the step (ms)")
        bottom.set_title("blue: step, orange: checkpoint, green: evaluation, red ×: boundary")
        bottom.legend(loc="upper left", fontsize=8, ncol=2)
    fig.tight_layout()
    path = folder / "boundaries.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
