"""Run reports: PNG plots and a short text summary of a run (``cairn report``, ``cairn run report``).

Writes into ``OUT``: ``loss_lr.png`` (training loss per step from step 0 with its moving mean
and the validation loss, on a log scale when it spans more than a decade; validation metrics,
one axis per scale; learning rate), ``timeline.png`` (step over wall time: every segment
attempt, the commits retention kept, each fault at the lost attempt's last sign of life, its
detection named for its detector, restores, interruptions, stalls shaded, each fault told in
full under the plot), ``throughput.png`` (steps/s and samples/s of every segment attempt while
it trained, stalls as shaded gaps) and ``summary.txt`` (also printed, or returned as JSON).
Without Temporal's history (``cairn report``) the timeline and throughput come from the kept
commits alone. The figures are data first (``workers.reports.figures``), drawn by
``workers.reports.plots``.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from pathlib import Path
from typing import Any

from cairn.checkpoint_interval import IntervalChoice
from cairn.runs import RunRecord
from workers.reports.faults import Fault
from workers.reports.figures import faults, loss_figure, origin, rates, stalls, throughput_figure, timeline_figure
from workers.reports.plots import draw
from workers.reports.timeline import HistoryFacts, place_on_steps

__all__ = ["write_report", "summary", "attach_history"]


def attach_history(record: RunRecord, facts: HistoryFacts) -> RunRecord:
    """Add what Temporal's history says (events, attempts, the heartbeat timeout) to ``record``."""
    record.events, record.attempts = facts.timeline(record.commits)
    hb = facts.heartbeat_timeout_seconds or facts.input.get("heartbeat_timeout_seconds")
    record.heartbeat_timeout_seconds = float(hb) if isinstance(hb, int | float) else None
    place_on_steps(record)
    record.intervals = list(facts.intervals)
    record.interval_choices = list(facts.interval_choices)
    return record


def _fault_json(f: Fault, t0: datetime) -> dict[str, Any]:
    def s(t: datetime | None) -> float | None:
        return None if t is None else round((t - t0).total_seconds(), 3)

    return {
        "attempt": f.attempt,
        "detector": f.detector,
        "timing": f.timing,
        "last_sign_of_life_s": s(f.at),
        "step": f.step,
        "detected_s": s(f.detected_at),
        "retry_started_s": s(f.retry_at),
        "training_again_s": s(f.training_at),
        "stalled_seconds": round(f.stalled_seconds, 3),
        "resumed_from_step": f.resumed_from,
        "recomputed_steps": f.recomputed,
        "message": f.detail,
    }


def summary(record: RunRecord) -> dict[str, Any]:
    kinds = [e.kind for e in record.events]
    t0 = origin(record)
    found = rates(record, t0) if t0 is not None else []
    per_step = [r.steps_per_second for r in found]
    per_sample = [r.samples_per_second for r in found if r.samples_per_second is not None]
    stalled = [x1 - x0 for _, x0, x1 in stalls(record, t0)] if t0 is not None else []
    lost = faults(record)
    return {
        "run_id": record.run_id,
        "store": record.store,
        "steps": record.steps,
        "latest_checkpoint": record.latest,
        "final_loss": record.loss[-1] if record.loss else None,
        "min_loss": min(record.loss) if record.loss else None,
        "final_lr": record.lr[-1] if record.lr else None,
        "evaluations": len(record.val_loss),
        "final_val_loss": record.val_loss[-1] if record.val_loss else None,
        "committed_checkpoints": len(record.commits),
        "checkpoint_bytes": record.commits[-1].bytes if record.commits else 0,
        "median_steps_per_second": statistics.median(per_step) if per_step else None,
        "median_samples_per_second": statistics.median(per_sample) if per_sample else None,
        "segment_attempts": len(record.attempts),
        "stalled_seconds": round(sum(stalled), 3),
        "recomputed_steps": sum(f.recomputed or 0 for f in lost),
        "heartbeat_timeout_seconds": record.heartbeat_timeout_seconds,
        "failures": sum(f.detector != "hand-back" for f in lost),
        "hand_backs": sum(f.detector == "hand-back" for f in lost),
        "faults": [_fault_json(f, t0) for f in lost] if t0 is not None else [],
        "fault_lines": [f"{i}. {f.describe(t0)}" for i, f in enumerate(lost, 1)] if t0 is not None else [],
        "restores": kinds.count("restore"),
        "interruptions": kinds.count("interrupted"),
        "checkpoint_intervals": [{"from_step": step, "every": every} for step, every in record.intervals],
        "checkpoint_interval_why": [IntervalChoice.model_validate(c).why() for c in record.interval_choices],
    }


def _summary_text(s: dict[str, Any], files: list[Path]) -> str:
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    where = "per segment attempt" if s["segment_attempts"] else "between kept commits"
    lines = [
        f"run {s['run_id']} in {s['store']}: {s['steps']} steps, latest checkpoint {s['latest_checkpoint']}",
        f"loss      final {num(s['final_loss'], '.6f')}, min {num(s['min_loss'], '.6f')}; "
        f"lr final {num(s['final_lr'], '.3g')}; {s['evaluations']} evaluation(s), "
        f"final validation loss {num(s['final_val_loss'], '.6f')}",
        f"commits   {s['committed_checkpoints']} kept in the store, {s['checkpoint_bytes']} bytes each (latest)",
        f"speed     median {num(s['median_steps_per_second'], '.1f')} steps/s, "
        f"{num(s['median_samples_per_second'], '.1f')} samples/s {where}",
        f"events    {s['segment_attempts']} segment attempt(s), {s['failures']} failure(s), "
        f"{s['hand_backs']} hand-back(s): {s['stalled_seconds']:.1f} s stalled (last sign of life -> training "
        f"again), {s['recomputed_steps']} step(s) recomputed; {s['restores']} restore(s), "
        f"{s['interruptions']} interruption(s)",
    ]
    lines += [f"          {line}" for line in s["fault_lines"]]
    if s["checkpoint_intervals"]:
        changes = ", ".join(f"{i['every']} from step {i['from_step']}" for i in s["checkpoint_intervals"])
        lines.append(f"interval  checkpoint every {changes}")
        lines += [f"          {why}" for why in s["checkpoint_interval_why"][-3:]]
    lines.append("plots     " + ", ".join(str(f) for f in files))
    return "\n".join(lines)


def write_report(record: RunRecord, out: Path) -> tuple[dict[str, Any], str, list[Path]]:
    """Draw the PNGs and write summary.txt into ``out``; returns (summary, its text, files)."""
    out.mkdir(parents=True, exist_ok=True)
    files = [
        draw(loss_figure(record), out / "loss_lr.png"),
        draw(timeline_figure(record), out / "timeline.png"),
        draw(throughput_figure(record), out / "throughput.png"),
    ]
    result = summary(record)
    text = _summary_text(result, files)
    (out / "summary.txt").write_text(text + "\n")
    return result, text, [*files, out / "summary.txt"]
