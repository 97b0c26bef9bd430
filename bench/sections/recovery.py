# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 5 of ``BENCHMARKS.md`` (recovery after SIGKILL) and ``recovery.png``, from the results
of ``bench.suites.recovery``: each scenario and every kill; one target per heartbeat timeout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.sections import Targets, spread


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    out = [
        "Two `cairn worker` processes; a `TrainingRun` with 20 ms steps and long segments (400 steps). Each rep "
        "SIGKILLs the worker holding the segment at a random point, starts a replacement, and polls the server "
        "every 50 ms. *Retry started*: the segment's next attempt is started (server timestamp). *Progress*: "
        "that attempt's heartbeat shows a step past the one it resumed from (seen through the heartbeat path, up "
        "to ~0.3 s late: an upper bound). *Caught up*: it is back at the step the killed attempt had reported. "
        "Recomputed = the killed attempt's last reported step − the latest committed step at the kill.",
        "",
        "| heartbeat timeout | checkpoint every | kill → retry started | kill → progress | kill → caught up | steps recomputed | target (timeout + 2 s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for x in r["scenarios"].values():
        out.append(
            f"| {x['heartbeat_timeout_s']:g} s | {x['checkpoint_every']} steps ({x['checkpoint_interval_s']:.1f} s) | "
            f"{spread(x['kill_to_retry_started_s'], 's', 1, 2)} | {spread(x['kill_to_progress_s'], 's', 1, 2)} | "
            f"{spread(x['kill_to_caught_up_s'], 's', 1, 2)} | {spread(x['recomputed_steps'], '', 1, 0)} | {x['target_s']:g} s |"
        )
    out += [
        "",
        "Every kill (attempt = the attempt that was killed):",
        "",
        "| scenario | attempt | retry started | progress | recomputed |",
        "|---|---|---|---|---|",
    ]
    worst_margin = None
    for name, x in r["scenarios"].items():
        for k in x["kills"]:
            out.append(
                f"| {name} | {k['killed_attempt']} | {k['kill_to_retry_started_s']:.2f} s | {k['kill_to_progress_s']:.2f} s | "
                f"{k['recomputed_steps']} |"
            )
            margin = x["target_s"] - k["kill_to_progress_s"]
            worst_margin = margin if worst_margin is None else min(worst_margin, margin)
        ok = x["kill_to_progress_s"]["max"] <= x["target_s"]
        targets.add(
            f"recovery ≤ heartbeat timeout + 2 s ({x['heartbeat_timeout_s']:g} s timeout)",
            f"median {x['kill_to_progress_s']['median']:.2f} s, worst {x['kill_to_progress_s']['max']:.2f} s",
            ok,
            f"worst kill {x['target_s'] - x['kill_to_progress_s']['max']:+.2f} s vs the target; recomputed ≤ "
            f"{x['recomputed_steps']['max']:.0f} steps (interval {x['checkpoint_every']})",
        )
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``recovery.png``: every kill's kill → progress against its target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for i, (name, x) in enumerate(r["scenarios"].items()):
        ys = [k["kill_to_progress_s"] for k in x["kills"]]
        ax.scatter([i] * len(ys), ys, label=f"{name}: kill → progress")
        ax.hlines(x["target_s"], i - 0.3, i + 0.3, colors="red")
        ax.hlines(x["heartbeat_timeout_s"], i - 0.3, i + 0.3, colors="gray", linestyles="dashed")
    ax.set_xticks(range(len(r["scenarios"])), [n.replace(", ", "\n") for n in r["scenarios"]])
    ax.set_ylabel("seconds after SIGKILL")
    ax.set_title("recovery (red: timeout + 2 s target; dashed: heartbeat timeout)")
    fig.tight_layout()
    path = folder / "recovery.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
