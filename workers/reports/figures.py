"""A run report's figures as data (``workers.reports.plots``), from the run's whole history.

Progress over wall time comes from Temporal's segment attempts (each from its start at the
step it resumed from to its end, a lost one to its last heartbeat) with the commits retention
kept dotted on it; loss, lr and evaluations come from the latest checkpoint's history, which
holds every step from 0 whatever retention deleted. A stall (a lost attempt's last heartbeat
to its retry's start) is shaded on the timeline and the throughput figure; the failure is
marked at the last heartbeat, its detection (a heartbeat timeout later) by a line of its own.
Pure: (``RunRecord``) -> ``Figure``; ``workers.reports.run`` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cairn.runs.record import RunRecord, SegmentAttempt, TimelineEvent
from workers.reports.plots import GAP, Figure, Marker, Panel, Series, Span, VLine, moving_mean, spans_decades

__all__ = ["Rate", "origin", "stalls", "rates", "timeline_figure", "throughput_figure", "loss_figure", "WALL", "STEP"]

WALL = "wall time since the run started (s)"
STEP = "step (optimizer updates)"
STALL = "stall: last heartbeat -> retry started"


@dataclass(frozen=True)
class Rate:
    """Throughput of one stretch of training (a segment attempt, or between two commits)."""

    x0: float
    x1: float
    steps_per_second: float
    samples_per_second: float | None
    outcome: str
    attempt: int


def origin(record: RunRecord) -> datetime | None:
    """The run's first known moment: its first attempt's start, else its first event or commit."""
    times = [a.started_at for a in record.attempts if a.started_at is not None]
    times += [e.at for e in record.events] + [c.at for c in record.commits if c.at is not None]
    return min(times) if times else None


def _x(t: datetime, t0: datetime) -> float:
    return (t - t0).total_seconds()


def _timed(record: RunRecord) -> list[SegmentAttempt]:
    return sorted((a for a in record.attempts if a.started_at is not None), key=lambda a: a.started_at)  # type: ignore[arg-type, return-value]


def stalls(record: RunRecord, t0: datetime) -> list[tuple[TimelineEvent, float, float]]:
    """(failure, from, to) for each failure: from the lost attempt's last sign of life to the
    start of the first attempt after its detection (to its detection if none followed)."""
    starts = sorted(a.started_at for a in record.attempts if a.started_at is not None)
    out = []
    for e in record.events:
        if e.kind != "failure":
            continue
        detected = e.detected_at or e.at
        after = [s for s in starts if s >= detected]
        end = after[0] if after else detected
        out.append((e, _x(e.at, t0), _x(max(end, e.at), t0)))
    return out


def _stall_spans(record: RunRecord, t0: datetime) -> tuple[Span, ...]:
    return tuple(Span(x0, x1, STALL, "tab:red", 0.12) for _, x0, x1 in stalls(record, t0) if x1 > x0)


def rates(record: RunRecord, t0: datetime) -> list[Rate]:
    """Steps (and samples) per second of every segment attempt with a start, an end and steps;
    without Temporal's history, between consecutive kept commits."""
    batch = record.batch_size
    out = []
    for a in _timed(record):
        seconds, steps = a.seconds, a.steps
        if seconds is None or steps is None or seconds <= 0 or a.ended_at is None or a.started_at is None:
            continue
        r = steps / seconds
        out.append(
            Rate(_x(a.started_at, t0), _x(a.ended_at, t0), r, r * batch if batch else None, a.outcome, a.attempt)
        )
    if out or record.attempts:
        return out
    timed = [c for c in record.commits if c.at is not None]
    for c0, c1 in zip(timed, timed[1:], strict=False):
        assert c0.at is not None and c1.at is not None
        seconds = (c1.at - c0.at).total_seconds()
        if seconds > 0 and c1.step > c0.step:
            r = (c1.step - c0.step) / seconds
            out.append(Rate(_x(c0.at, t0), _x(c1.at, t0), r, r * batch if batch else None, "commits", 0))
    return out


def _progress(record: RunRecord, t0: datetime) -> tuple[list[float], list[float]]:
    """Each attempt from (start, resumed step) through its kept commits to (end, end step); a
    break between attempts (a retry falls back to the step it resumed from)."""
    xs: list[float] = []
    ys: list[float] = []
    commits = [c for c in record.commits if c.at is not None]
    for a in _timed(record):
        assert a.started_at is not None
        points = []
        if a.from_step is not None:
            points.append((a.started_at, a.from_step))
        end = a.ended_at or a.started_at
        points += [(c.at, c.step) for c in commits if c.at is not None and a.started_at <= c.at <= end]
        if a.ended_at is not None and a.end_step is not None:
            points.append((a.ended_at, a.end_step))
        if xs and points:
            xs.append(GAP)
            ys.append(GAP)
        for t, step in sorted(points):
            xs.append(_x(t, t0))
            ys.append(float(step))
    return xs, ys


def timeline_figure(record: RunRecord) -> Figure:
    t0 = origin(record)
    title = f"run {record.run_id}: progress, commits, failures and restores"
    if t0 is None:
        return Figure(title, (Panel(WALL, STEP, empty_note="no timed commits or history"),))
    series = []
    xs, ys = _progress(record, t0)
    if xs:
        series.append(Series("progress (segment attempts)", tuple(xs), tuple(ys), color="tab:gray"))
    timed = [c for c in record.commits if c.at is not None]
    if timed:
        label = "checkpoint committed (kept by retention)"
        cx = tuple(_x(c.at, t0) for c in timed if c.at is not None)
        series.append(Series(label, cx, tuple(float(c.step) for c in timed), style="points", color="tab:green"))
    markers, vlines = [], []
    for e in record.events:
        step = float(e.step or 0)
        if e.kind == "failure":
            markers.append(Marker(_x(e.at, t0), step, "failure (last heartbeat)", "tab:red", "x", e.detail[:40]))
            if e.detected_at is not None:
                vlines.append(VLine(_x(e.detected_at, t0), "failure detected (heartbeat timeout)", "tab:red", ":"))
        elif e.kind == "restore":
            markers.append(Marker(_x(e.at, t0), step, "retry started (restore)", "tab:green", "^"))
        elif e.kind == "interrupted":
            markers.append(Marker(_x(e.at, t0), step, "interrupted on request", "tab:orange", "s"))
    hb = f", heartbeat timeout {record.heartbeat_timeout_seconds:g} s" if record.heartbeat_timeout_seconds else ""
    panel = Panel(
        WALL, STEP, tuple(series), _stall_spans(record, t0), tuple(markers), tuple(vlines), legend="upper left"
    )
    return Figure(f"{title}\n(started {t0:%Y-%m-%d %H:%M:%S} UTC{hb}; shaded: stalls)", (panel,), panel_height=4.4)


def throughput_figure(record: RunRecord) -> Figure:
    t0 = origin(record)
    title = f"run {record.run_id}: throughput per segment attempt"
    if t0 is None:
        return Figure(title, (Panel(WALL, "throughput (steps/s)", empty_note="no timed commits or history"),))
    found = rates(record, t0)
    spans = _stall_spans(record, t0)
    colors = {"completed": "tab:blue", "lost": "tab:red", "failed": "tab:red", "interrupted": "tab:orange"}
    labels = {
        "lost": "lost attempt (to its last heartbeat)",
        "failed": "failed attempt",
        "commits": "between kept commits",
    }
    steps, samples = [], []
    for r in found:
        color, label = colors.get(r.outcome, "tab:blue"), labels.get(r.outcome, f"segment ({r.outcome})")
        steps.append(Series(label, (r.x0, r.x1), (r.steps_per_second,) * 2, color=color, width=2.5))
        if r.samples_per_second is not None:
            samples.append(Series(label, (r.x0, r.x1), (r.samples_per_second,) * 2, color=color, width=2.5))
    note = "no segment with a start, an end and steps"
    panels = [Panel(WALL, "throughput (steps/s)", tuple(steps), spans, empty_note=note)]
    if record.batch_size:
        panels.append(
            Panel(WALL, f"throughput (samples/s, batch {record.batch_size})", tuple(samples), spans, empty_note=note)
        )
    if not record.attempts:
        title += " (no Temporal history: between the commits retention kept)"
    return Figure(title + "\n(shaded: stalls)", tuple(panels))


def loss_figure(record: RunRecord) -> Figure:
    steps = tuple(float(s) for s in range(1, record.steps + 1))
    train = tuple(record.loss)
    series = [
        Series("training loss (per step)", steps, train, color="tab:blue", width=0.6, alpha=0.35),
        Series(
            "training loss (moving mean)",
            steps,
            tuple(moving_mean(train, max(1, record.steps // 50))),
            color="tab:blue",
            width=1.6,
        ),
    ]
    if record.val_loss:
        vx = tuple(record.val_step[: len(record.val_loss)])
        series.append(Series("validation loss", vx, tuple(record.val_loss), color="tab:orange", marker="o"))
    log = spans_decades([*train, *record.val_loss])
    loss_label = "loss (objective, unitless" + (", log scale)" if log else ")")
    panels = [Panel(STEP, loss_label, tuple(series), yscale="log" if log else "linear", legend="upper right")]
    if record.metrics:
        metric_series = tuple(
            Series(name, tuple(record.val_step), tuple(values), marker="o") for name, values in record.metrics.items()
        )
        unit = "fraction" if all("accuracy" in k for k in record.metrics) else "value"
        panels.append(Panel(STEP, f"validation metric ({unit})", metric_series))
    panels.append(
        Panel(STEP, "learning rate (per step)", (Series("learning rate", steps, tuple(record.lr), color="tab:purple"),))
    )
    return Figure(f"run {record.run_id}: loss, evaluations and learning rate, every step from 0", tuple(panels))
