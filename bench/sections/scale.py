"""Section 6 of ``BENCHMARKS.md`` (scale) and ``scale.png``, from the results of
``bench.suites.scale``: listing, latest and gc by checkpoint count, and the history's cost as it
was measured before history segments (no target)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.sections import Targets, spread


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    lst = r["listing"]
    out = [
        "Real committed training checkpoints (shards + manifest through the commit protocol, each valid for "
        "`load_training`: the example model at step k with k history entries), written into one run on local "
        f"disk bypassing the trainer; {r['reps']} interleaved reps of each operation at 1,000 and at "
        f"{r['checkpoints']:,} checkpoints. The CLI rows are fresh processes (`python -m workers.cli`), so they "
        "include the interpreter and imports, shown on their own in the last row.",
        "",
        "| operation | " + " | ".join(f"{int(n):,} checkpoints" for n in lst["points"]) + " |",
        "|---|" + "---|" * len(lst["points"]),
    ]
    names = list(next(iter(lst["points"].values()))["cases"])
    for name in names:
        cells = [spread(p["cases"][name], "ms", 1e3, 1) for p in lst["points"].values()]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    gen = " / ".join(f"{p['generate_seconds']:.1f} s" for p in lst["points"].values())
    out += [
        "",
        f"Writing them took {gen} (8 threads). Then one real `gc --keep-last 3`: deleted {lst['gc']['deleted']:,} "
        f"checkpoints in {lst['gc']['seconds']:.2f} s, kept {lst['gc']['kept']}.",
        "",
    ]
    if "history" in r:  # results from before history segments (section 13 measures today's format)
        out += [
            "### History in every checkpoint (before history segments)",
            "",
            "Measured when every training checkpoint carried its whole loss/lr history (16 bytes per step); "
            "checkpoints now keep their history in run-level segments and a save writes only what is new "
            f"(section 13). The example model's state at step N with its full history, {r['reps']} interleaved reps:",
            "",
            "| step N | history bytes | checkpoint bytes (tensors + manifest) | history share | save | load |",
            "|---|---|---|---|---|---|",
        ]
        for n, x in r["history"].items():
            total = x["total_bytes"] + x["manifest_bytes"]
            out.append(
                f"| {int(n):,} | {x['history_bytes']:,} | {total:,} | {x['history_bytes'] / total:.1%} | "
                f"{spread(x['save'], 'ms', 1e3, 1)} | {spread(x['load'], 'ms', 1e3, 1)} |"
            )
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``scale.png``: listing times by checkpoint count; history bytes and save time by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = r.get("history")
    fig, axes = plt.subplots(1, 2 if hist else 1, figsize=(11 if hist else 6, 4), squeeze=False)
    a = axes[0][0]
    pts = r["listing"]["points"]
    counts = [int(n) for n in pts]
    for name in next(iter(pts.values()))["cases"]:
        a.plot(counts, [pts[str(n)]["cases"][name]["median"] * 1e3 for n in counts], marker="o", label=name)
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("checkpoints in the run")
    a.set_ylabel("ms (median)")
    a.set_title("listing, latest, gc")
    a.legend(fontsize=7)
    if hist:
        b = axes[0][1]
        steps = [max(1, int(n)) for n in hist]
        b.plot(steps, [hist[n]["history_bytes"] / 1e6 for n in hist], marker="o", label="history MB per checkpoint")
        b2 = b.twinx()
        b2.plot(steps, [hist[n]["save"]["median"] * 1e3 for n in hist], marker="s", color="C1", label="save ms")
        b.set_xscale("log")
        b.set_xlabel("step (history entries)")
        b.set_ylabel("MB of history per checkpoint")
        b2.set_ylabel("save ms (median)")
        b.set_title("before history segments: all history in every checkpoint")
    fig.tight_layout()
    path = folder / "scale.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
