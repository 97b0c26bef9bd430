"""A drill's report: a table for people, one JSON object for scripts, a PNG timeline.

The timeline is the run's step over wall time (the server's view of the running segment), with
each fault marked where it fired, server outages shaded, commits dotted and worker starts
ticked (data: ``timeline_figure``; drawn by ``workers.reports.plots``, as the run report is).
The report also measures what the faults cost (wall-time overhead, steps recomputed: per fault
the step the lost attempt reached minus the step its retry resumed from) and sets it beside the
Young/Daly prediction for the same save cost and failure rate. The header names the heartbeat
timeout the run used; a Web UI link is printed only for a stack that outlives the drill.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from cairn.checkpoint_interval import IntervalAdvice, advise
from workers.reports.plots import Figure, Panel, Series, Span, VLine, draw

__all__ = ["write_report", "recovery_stats", "interval_advice", "timeline_figure", "heartbeat_timeout"]

_COLORS = {
    "worker-kill": "tab:red",
    "kill-in-upload": "tab:purple",
    "kill-after-effect": "tab:brown",
    "sigterm": "tab:orange",
    "temporal-restart": "tab:blue",
    "s3-restart": "tab:cyan",
    "service-restart": "tab:olive",
    "storage-brownout": "tab:pink",
}
RECOVERY_TARGET_S = 2.0
"""Training resumes within this long after the loss of a worker is detected."""


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def recovery_stats(result: Any) -> dict[str, Any]:
    """p50/max of detection, fault -> progress, and progress after detection (worker losses)."""
    kills = [f for f in result.faults if f.kind in ("worker-kill", "kill-in-upload", "sigterm", "kill-after-effect")]
    detect = [f.detection_s for f in kills if f.detection_s is not None]
    recover = [f.recovery_s for f in result.faults if f.recovery_s is not None]
    after = [f.after_detection_s for f in kills if f.after_detection_s is not None]

    def pm(xs: list[float]) -> dict[str, float | None]:
        return {"p50": _pct(xs, 0.5), "max": max(xs) if xs else None, "n": float(len(xs))}

    return {
        "detection_s": pm(detect),
        "recovery_s": pm(recover),
        "resumed_after_detection_s": pm(after),
        "target_after_detection_s": RECOVERY_TARGET_S,
        "within_target": all(a <= RECOVERY_TARGET_S for a in after),
    }


def _step_seconds(result: Any) -> float:
    """Seconds per training step, measured between consecutive commits of one worker."""
    rates: list[float] = []
    commits = sorted((c for c in result.logs.commits if c.created), key=lambda c: (c.worker, c.at))
    for a, b in zip(commits, commits[1:], strict=False):
        if a.worker == b.worker and b.step > a.step and 0 < b.at - a.at < 60:
            rates.append((b.at - a.at - b.seconds) / (b.step - a.step))
    rates = [r for r in rates if r > 0]
    return float(statistics.median(rates)) if rates else max(float(result.spec.step_seconds), 1e-3)


def interval_advice(result: Any) -> tuple[IntervalAdvice | None, dict[str, Any]]:
    """Young/Daly from this drill's measurements, and what the drill measured beside it.

    Measured overhead, in the model's terms: time spent saving (commits x their cost), waiting
    for recovery (fault -> progress) and redoing lost steps, over the run's useful training time.
    """
    saves = [c.seconds for c in result.logs.commits if c.created and c.seconds > 0]
    fired = [f for f in result.faults if f.fired_at is not None]
    wall = result.finished_at - result.t0
    step_s = _step_seconds(result)
    useful = result.total_steps * step_s
    recomputed = [f.recomputed for f in fired if f.recomputed is not None]
    recoveries = [f.recovery_s for f in fired if f.recovery_s is not None]
    measured: dict[str, Any] = {
        "wall_seconds": round(wall, 3),
        "step_seconds": step_s,
        "useful_seconds": round(useful, 3),
        "save_seconds_median": statistics.median(saves) if saves else None,
        "commits": len(saves),
        "faults": len(fired),
        "mtbf_seconds": wall / len(fired) if fired else None,
        "recomputed_steps": sum(recomputed),
        "lost_steps_per_failure": (sum(recomputed) / len(recomputed)) if recomputed else None,
        "recovery_seconds": round(sum(recoveries), 3),
    }
    spent = sum(saves) + sum(recoveries) + sum(recomputed) * step_s
    measured["overhead"] = spent / useful if useful > 0 else None
    if not saves or not fired:
        return None, measured
    advice = advise(
        save_seconds=max(statistics.median(saves), 1e-6),
        mtbf_seconds=measured["mtbf_seconds"],
        step_seconds=step_s,
        current_every=result.checkpoint_every,
        restart_seconds=statistics.median(recoveries) if recoveries else 0.0,
    )
    return advice, measured


def _fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def heartbeat_timeout(result: Any) -> float:
    """The heartbeat timeout the drilled run used: its input's (a run file's own), not the
    spec's default."""
    used = getattr(result, "heartbeat_timeout_seconds", None)
    return float(used if used is not None else result.spec.heartbeat_timeout_seconds)


def _table(result: Any) -> list[str]:
    """One line per fault. ``recomputed`` is measured: the step the lost attempt reached minus
    the step its retry resumed from (both columns beside it), as ``drill.json`` records them."""
    head = (
        f"{'#':>2}  {'fault':<18}{'at s':>7}{'step':>7}{'detect s':>10}{'resume s':>10}{'after det.':>11}"
        f"{'reached':>9}{'resumed':>9}{'recomputed':>12}  note"
    )
    lines = [head, "-" * len(head)]
    for f in result.faults:
        at = None if f.fired_at is None else f.fired_at - result.t0
        rec = "-" if f.recomputed is None else str(f.recomputed)
        kind = f.kind + (f"({f.param})" if f.param and f.kind == "kill-after-effect" else "")
        note = f.note
        if f.restart is not None:
            note = (f"down {f.restart.seconds:.1f} s" + ("; " + note if note else "")).strip()
        reached = "-" if f.reached is None else str(f.reached)
        resumed = "-" if f.resumed_from is None else str(f.resumed_from)
        lines.append(
            f"{f.index:>2}  {kind:<18}{_fmt(at, '.1f'):>7}{f.step_at_fault if f.step_at_fault is not None else '-':>7}"
            f"{_fmt(f.detection_s):>10}{_fmt(f.recovery_s):>10}{_fmt(f.after_detection_s):>11}"
            f"{reached:>9}{resumed:>9}{rec:>12}  {note}"
        )
    return lines


def timeline_figure(result: Any) -> Figure:
    """The drill's timeline as data: the running segment's step over wall time, restores and
    commits, each fault's line and its fault -> progress span, server outages shaded."""
    t0 = result.t0
    resumes = [(r.at, r.step) for r in result.logs.resumes]
    committed = [(c.at, c.step) for c in result.logs.commits]
    progress = sorted([*result.samples, *resumes, *committed])  # heartbeats lag; commits and restores do not
    series = []
    if progress:
        xs, ys = tuple(t - t0 for t, _ in progress), tuple(float(s) for _, s in progress)
        series.append(Series("step (running segment)", xs, ys, style="steps", color="tab:gray"))
    if resumes:
        xs, ys = tuple(t - t0 for t, _ in resumes), tuple(float(s) for _, s in resumes)
        series.append(Series("segment resumed (restore)", xs, ys, style="points", color="tab:green", marker="^"))
    commits = [c for c in result.logs.commits if c.created]
    if commits:
        xs, ys = tuple(c.at - t0 for c in commits), tuple(float(c.step) for c in commits)
        series.append(Series("checkpoint committed", xs, ys, style="points", color="tab:green", size=3))
    spans = [Span(r.down_at - t0, r.up_at - t0, "server down", "tab:blue", 0.12) for r in result.restarts]
    vlines = []
    for f in result.faults:
        if f.fired_at is None:
            continue
        color = _COLORS.get(f.kind, "black")
        vlines.append(VLine(f.fired_at - t0, f.kind, color, "--", str(f.index)))
        if f.resumed_at is not None:
            spans.append(Span(f.fired_at - t0, f.resumed_at - t0, "fault -> progress", color, 0.08))
    starts = tuple(t - t0 for t, _ in result.worker_starts if t - t0 > 0.5)
    if starts:
        series.append(
            Series("worker started", starts, (0.0,) * len(starts), style="points", color="black", marker="|", size=14)
        )
    title = (
        f"drill {result.run_id}: seed {result.spec.seed}, {len(result.faults)} faults, "
        f"heartbeat timeout {heartbeat_timeout(result):g} s\n(shaded: fault -> progress; blue: server down)"
    )
    panel = Panel(
        "wall time since the run started (s)",
        "step (optimizer updates)",
        tuple(series),
        tuple(spans),
        vlines=tuple(vlines),
        legend="lower right",
    )
    return Figure(title, (panel,), panel_height=4.8)


def write_report(result: Any, out: Path) -> dict[str, Any]:
    """Write ``drill.json``, ``timeline.png`` and ``report.txt`` into ``out``; return the JSON
    report (with ``text``, the table for people)."""
    checks = result.checks
    passed = all(c.passed for c in checks)
    stats = recovery_stats(result)
    advice, measured = interval_advice(result)
    png = draw(timeline_figure(result), out / "timeline.png")
    wall = result.finished_at - result.t0
    lines = [
        f"cairn drill — seed {result.spec.seed}, {len(result.faults)} fault(s), {result.spec.workers} worker(s); "
        f"run {result.run_id}: {result.total_steps} steps, checkpoint every {result.checkpoint_every}, "
        f"heartbeat timeout {heartbeat_timeout(result):g} s; {wall:.1f} s",
    ]
    lines += ["", *_table(result), ""]
    d, r, a = stats["detection_s"], stats["recovery_s"], stats["resumed_after_detection_s"]
    lines.append(
        f"recovery: detection p50 {_fmt(d['p50'])} s, max {_fmt(d['max'])} s; "
        f"fault -> progress p50 {_fmt(r['p50'])} s, "
        f"max {_fmt(r['max'])} s; progress after detection p50 {_fmt(a['p50'])} s, max {_fmt(a['max'])} s "
        f"(target <= {RECOVERY_TARGET_S:g} s: {'met' if stats['within_target'] else 'MISSED'})"
    )
    lines.append("")
    for c in checks:
        lines.append(f"{'PASS' if c.passed else 'FAIL'}  {c.name:<12} {c.detail}")
    lines.append("")
    if advice is not None:
        lines.append("checkpoint interval (Young/Daly, from this drill's measurements):")
        lines += ["  " + line for line in advice.lines()]
        lines.append(
            f"  measured: overhead {_fmt(measured['overhead'], '.1%')} "
            f"of {measured['useful_seconds']:.1f} s of training "
            f"({measured['commits']} saves, {measured['recovery_seconds']:.1f} s waiting for recovery), "
            f"lost work {_fmt(measured['lost_steps_per_failure'], '.1f')} steps/failure "
            f"({measured['recomputed_steps']} recomputed in all)"
        )
        lines.append("")
    verdict = "PASS" if passed else "FAIL"
    failed = [c for c in checks if not c.passed]
    reason = "" if passed else " — " + "; ".join(f"{c.name}: {c.detail}" for c in failed)
    lines.append(f"VERDICT: {verdict}{reason}")
    lines.append(f"report: {out / 'drill.json'}, {png}")
    kept = result.extra.get("kept_stack")
    if kept:
        lines.append(
            f"stack kept running (--keep-stack): Temporal {kept['temporal']}, S3 {kept['s3']}, "
            f"service {kept['service']}"
        )
        if result.web_ui:
            lines.append(f"Web UI: {result.web_ui}")
        lines.append(f"stop it with: {kept['stop']}")
    elif result.web_ui:
        lines.append(f"Web UI: {result.web_ui}")
    text = "\n".join(lines)
    report: dict[str, Any] = {
        "passed": passed,
        "verdict": verdict,
        "run_id": result.run_id,
        "store": result.store,
        "status": result.status,
        "seed": result.spec.seed,
        "spec": result.spec.model_dump(mode="json"),
        "schedule": [f.to_json() for f in result.schedule],
        "total_steps": result.total_steps,
        "checkpoint_every": result.checkpoint_every,
        "heartbeat_timeout_seconds": heartbeat_timeout(result),
        "wall_seconds": round(wall, 3),
        "faults": [f.to_json(result.t0) for f in result.faults],
        "checks": [c.to_json() for c in checks],
        "recovery": stats,
        "interval": {"advice": advice.to_json() if advice else None, "measured": measured},
        "summary": result.summary,
        "web_ui": result.web_ui,
        "kept_stack": result.extra.get("kept_stack"),
        "unanswered_polls": result.extra.get("unanswered_polls"),
        "files": [str(out / "drill.json"), str(png), str(out / "report.txt")],
    }
    (out / "drill.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.txt").write_text(text + "\n")
    report["text"] = text
    return report
