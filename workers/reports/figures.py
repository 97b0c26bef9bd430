"""A run report's figures as data (``workers.reports.plots``), from the run's whole history.

Progress over wall time comes from Temporal's segment attempts (each from its start at the
step it resumed from, flat until it trains, to its end; a lost one to its last sign of life)
with the commits retention kept dotted on it; loss, lr and evaluations come from the latest
checkpoint's history, which holds every step from 0 whatever retention deleted. Each fault
(``workers.reports.faults``) is marked at the lost attempt's last sign of life, its detection by
a line named for its detector, and its stall (last sign of life to training again) is shaded on
the timeline and left out of the throughput, where it is a gap. Pure: (``RunRecord``) ->
``Figure``; ``workers.reports.run`` draws them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from cairn.runs import RunRecord, SegmentAttempt
from workers.reports.faults import DETECTORS, Fault, fault_of
from workers.reports.plots import GAP, Figure, Marker, Panel, Series, Span, VLine, moving_mean, spans_decades

__all__ = [
    "Rate",
    "origin",
    "faults",
    "stalls",
    "rates",
    "timeline_figure",
    "throughput_figure",
    "loss_figure",
    "WALL",
    "STEP",
    "STALL",
]

WALL = "wall time since the run started (s)"
STEP = "step (optimizer updates)"
STALL = "stall: last sign of life -> training again"


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


def faults(record: RunRecord) -> list[Fault]:
    """The run's faults in time order (``workers.reports.faults``)."""
    found = [fault_of(e) for e in record.events]
    return sorted((f for f in found if f is not None), key=lambda f: f.at)


def stalls(record: RunRecord, t0: datetime) -> list[tuple[Fault, float, float]]:
    """(fault, from, to) for each fault: from the lost attempt's last sign of life to when the
    next attempt trained again (to its start, or the detection, where that is not known)."""
    return [(f, _x(f.at, t0), _x(f.stall_end, t0)) for f in faults(record)]


def _stall_spans(record: RunRecord, t0: datetime) -> tuple[Span, ...]:
    return tuple(Span(x0, x1, STALL, "tab:red", 0.12) for _, x0, x1 in stalls(record, t0) if x1 > x0)


def _training_start(record: RunRecord, a: SegmentAttempt) -> datetime | None:
    """When ``a`` began training (its restore or start-up done), where it measured it."""
    if a.started_at is None or a.ended_at is None:
        return None
    starts = [e.at for e in record.events if e.kind == "training" and a.started_at <= e.at <= a.ended_at]
    return min(starts) if starts else None


def rates(record: RunRecord, t0: datetime) -> list[Rate]:
    """Steps (and samples) per second of every segment attempt with a start, an end and steps,
    over the time it trained (from when it measured its training began: a restore is recovery,
    not throughput); without Temporal's history, between consecutive kept commits."""
    batch = record.batch_size
    out = []
    for a in _timed(record):
        steps = a.steps
        if a.ended_at is None or a.started_at is None or steps is None:
            continue
        began = _training_start(record, a) or a.started_at
        seconds = (a.ended_at - began).total_seconds()
        if seconds <= 0:
            continue
        r = steps / seconds
        out.append(Rate(_x(began, t0), _x(a.ended_at, t0), r, r * batch if batch else None, a.outcome, a.attempt))
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
            training = _training_start(record, a)
            if training is not None:  # flat while it restores
                points.append((training, a.from_step))
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
    title = f"run {record.run_id}: progress, commits, faults and restores"
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
    markers, vlines, notes = [], [], []
    for number, f in enumerate(faults(record), start=1):
        how = DETECTORS.get(f.detector, DETECTORS["error"])
        markers.append(Marker(_x(f.at, t0), float(f.step or 0), f.label, how.color, "x", str(number)))
        if f.detected_at is not None:
            vlines.append(VLine(_x(f.detected_at, t0), f"detected by {how.name}", how.color, ":"))
        notes.append(f"{number}. {f.describe(t0)}")
    for e in record.events:
        step = float(e.step or 0)
        if e.kind == "restore":
            markers.append(Marker(_x(e.at, t0), step, "retry started (restore)", "tab:green", "^"))
        elif e.kind == "interrupted":
            markers.append(Marker(_x(e.at, t0), step, "interrupted on request", "tab:orange", "s"))
    hb = f", heartbeat timeout {record.heartbeat_timeout_seconds:g} s" if record.heartbeat_timeout_seconds else ""
    panel = Panel(
        WALL, STEP, tuple(series), _stall_spans(record, t0), tuple(markers), tuple(vlines), legend="upper left"
    )
    subtitle = f"(started {t0:%Y-%m-%d %H:%M:%S} UTC{hb}; shaded: stalls, last sign of life -> training again)"
    return Figure(f"{title}\n{subtitle}", (panel,), panel_height=4.4, notes=tuple(notes))


def throughput_figure(record: RunRecord) -> Figure:
    t0 = origin(record)
    title = f"run {record.run_id}: throughput per segment attempt"
    if t0 is None:
        return Figure(title, (Panel(WALL, "throughput (steps/s)", empty_note="no timed commits or history"),))
    found = rates(record, t0)
    spans = _stall_spans(record, t0)
    colors = {
        "completed": "tab:blue",
        "lost": "tab:red",
        "failed": "tab:red",
        "handed back": "tab:orange",
        "interrupted": "tab:orange",
    }
    labels = {
        "completed": "segment attempt (while it trained)",
        "lost": "lost attempt (to its last sign of life)",
        "failed": "failed attempt (to its error)",
        "handed back": "attempt handed back on SIGTERM",
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
    return Figure(title + "\n(shaded: stalls, last sign of life -> training again: no throughput)", tuple(panels))


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
    panels += _metric_panels(record)
    panels.append(
        Panel(STEP, "learning rate (per step)", (Series("learning rate", steps, tuple(record.lr), color="tab:purple"),))
    )
    return Figure(f"run {record.run_id}: loss, evaluations and learning rate, every step from 0", tuple(panels))


def _metric_unit(name: str) -> str:
    """The unit a validation metric is read in: accuracies are fractions (0-1), the rest
    (perplexity, losses) are unitless values each on its own scale."""
    return "fraction" if "accuracy" in name else "unitless"


def _metric_panels(record: RunRecord) -> list[Panel]:
    """Validation metrics, one axis per scale: the accuracies together (fractions, 0-1), every
    other metric on an axis of its own, so that none flattens another."""
    xs = tuple(record.val_step)
    accuracies = {k: v for k, v in record.metrics.items() if _metric_unit(k) == "fraction"}
    panels = []
    if accuracies:
        series = tuple(Series(k, xs, tuple(v), marker="o") for k, v in accuracies.items())
        panels.append(Panel(STEP, "validation accuracy (fraction)", series))
    for name, values in record.metrics.items():
        if name in accuracies:
            continue
        log = spans_decades(values)
        unit = _metric_unit(name) + (", log scale" if log else "")
        panels.append(
            Panel(
                STEP,
                f"{name} ({unit})",
                (Series(name, xs, tuple(values), marker="o", color="tab:olive"),),
                yscale="log" if log else "linear",
            )
        )
    return panels
