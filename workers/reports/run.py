"""Run reports: PNG plots and a short text summary of a run (``cairn report``, ``cairn run report``).

Writes into ``OUT``: ``loss_lr.png`` (training loss and learning rate per step),
``timeline.png`` (committed checkpoints as step over wall time, with segment failures, restores
and interruptions marked when Temporal's history is known), ``throughput.png`` (steps per second
between commits) and ``summary.txt`` (also printed, or returned as JSON).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from cairn.runs.record import RunRecord

__all__ = ["write_report", "summary"]

_MARKS = {"failure": ("x", "tab:red"), "restore": ("^", "tab:green"), "interrupted": ("s", "tab:orange")}


def _smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _rates(record: RunRecord) -> list[tuple[int, float]]:
    """(step, steps per second) between consecutive timed commits."""
    timed = [c for c in record.commits if c.at is not None]
    out = []
    for a, b in zip(timed, timed[1:], strict=False):
        assert a.at is not None and b.at is not None
        seconds = (b.at - a.at).total_seconds()
        if seconds > 0 and b.step > a.step:
            out.append((b.step, (b.step - a.step) / seconds))
    return out


def summary(record: RunRecord) -> dict[str, Any]:
    rates = [r for _, r in _rates(record)]
    kinds = [e.kind for e in record.events]
    return {
        "run_id": record.run_id,
        "store": record.store,
        "steps": record.steps,
        "latest_checkpoint": record.latest,
        "final_loss": record.loss[-1] if record.loss else None,
        "min_loss": min(record.loss) if record.loss else None,
        "final_lr": record.lr[-1] if record.lr else None,
        "committed_checkpoints": len(record.commits),
        "checkpoint_bytes": record.commits[-1].bytes if record.commits else 0,
        "median_steps_per_second": statistics.median(rates) if rates else None,
        "failures": kinds.count("failure"),
        "restores": kinds.count("restore"),
        "interruptions": kinds.count("interrupted"),
    }


def _summary_text(s: dict[str, Any], files: list[Path]) -> str:
    def num(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lines = [
        f"run {s['run_id']} in {s['store']}: {s['steps']} steps, latest checkpoint {s['latest_checkpoint']}",
        f"loss      final {num(s['final_loss'], '.6f')}, min {num(s['min_loss'], '.6f')}; "
        f"lr final {num(s['final_lr'], '.3g')}",
        f"commits   {s['committed_checkpoints']} kept in the store, {s['checkpoint_bytes']} bytes each (latest)",
        f"speed     median {num(s['median_steps_per_second'], '.1f')} steps/s between commits",
        f"events    {s['failures']} failure(s), {s['restores']} restore(s), {s['interruptions']} interruption(s)",
        "plots     " + ", ".join(str(f) for f in files),
    ]
    return "\n".join(lines)


def write_report(record: RunRecord, out: Path) -> tuple[dict[str, Any], str, list[Path]]:
    """Draw the PNGs and write summary.txt into ``out``; returns (summary, its text, files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    files = [out / "loss_lr.png", out / "timeline.png", out / "throughput.png"]

    fig, (ax_loss, ax_lr) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    steps = list(range(1, record.steps + 1))
    ax_loss.plot(steps, record.loss, lw=0.6, alpha=0.4, label="loss (per step)")
    ax_loss.plot(steps, _smooth(record.loss, max(1, record.steps // 50)), lw=1.5, label="loss (moving mean)")
    ax_loss.set_ylabel("training loss")
    ax_loss.legend(loc="upper right")
    ax_loss.set_title(f"run {record.run_id}: loss and learning rate")
    ax_lr.plot(steps, record.lr, color="tab:purple")
    ax_lr.set_ylabel("learning rate")
    ax_lr.set_xlabel("step")
    fig.tight_layout()
    fig.savefig(files[0], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 4))
    progress = sorted(
        [(c.at, c.step) for c in record.commits if c.at is not None]
        + [(e.at, e.step) for e in record.events if e.kind in ("segment-end", "restore") and e.step is not None]
    )
    if progress:
        ax.plot([t for t, _ in progress], [s for _, s in progress], "-", color="tab:gray", lw=1, label="progress")
    timed = [c for c in record.commits if c.at is not None]
    ax.plot([c.at for c in timed], [c.step for c in timed], "o", ms=4, label="committed checkpoint (kept)")
    for kind, (marker, color) in _MARKS.items():
        events = [e for e in record.events if e.kind == kind]
        if events:
            ys = [e.step if e.step is not None else 0 for e in events]
            ax.scatter([e.at for e in events], ys, marker=marker, color=color, s=60, label=kind, zorder=3)
    ax.set_xlabel("wall time (UTC)")
    ax.set_ylabel("step")
    ax.set_title(f"run {record.run_id}: progress, commits, failures and restores")
    ax.legend(loc="upper left")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(files[1], dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(8, 3))
    rates = _rates(record)
    if rates:
        ax.step([s for s, _ in rates], [r for _, r in rates], where="pre")
    else:
        ax.text(0.5, 0.5, "not enough timed commits", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("step")
    ax.set_ylabel("steps / second")
    ax.set_title(f"run {record.run_id}: throughput between commits")
    fig.tight_layout()
    fig.savefig(files[2], dpi=110)
    plt.close(fig)

    result = summary(record)
    text = _summary_text(result, files)
    (out / "summary.txt").write_text(text + "\n")
    return result, text, [*files, out / "summary.txt"]
