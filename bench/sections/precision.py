# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 9 of ``BENCHMARKS.md`` (bfloat16 vs float32 checkpoints) and ``precision.png``, from
the results of ``bench.suites.precision``: each precision against the floor of its bytes, peak
RSS in fresh processes; the ratio and RSS targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.measure import MiB
from bench.sections import Targets, spread

RSS_TARGET = 1.10
"""Peak RSS above the process's after imports, in state bytes: the model (or the restored state) + 10%."""


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    m, mach = r["model"], r["machine"]
    res = r["results"]
    out = [
        f"The weights of a GPT-2-style model of {m['params'] / 1e6:.1f}M parameters ({m['layers']} layers, "
        f"d_model {m['d_model']}, vocabulary {m['vocab']}, context {m['context']}, head tied; {m['tensors']} tensors), "
        "built with numpy, in bfloat16 (tag `bfloat16`, stored natively at 2 bytes an element) and in float32. "
        "Cairn: `write_checkpoint` (BLAKE3 of every byte, shards, manifest commit) / `read_manifest` + "
        "`read_logical` with every checksum and every value's finiteness checked (what `load_training` runs, "
        "minus a trainer's metadata rules). Floor: the same bytes by plain sequential I/O on the same disk, as in "
        "section 1 (one file + fsync / read into one fresh buffer; restores from the device, pages evicted "
        f"first). All four cases interleaved rep by rep, median (min–max) of {r['reps']} reps, in one run on "
        f"{mach['cpu']} ({mach['cores']} cores, load average {mach['loadavg_at_start'][0]:.1f} at the start; "
        f"{mach['disk']}). Ratio = floor seconds / Cairn seconds. Peak RSS: one save and one restore, each in a "
        "fresh process, above that process's RSS after its imports (a save's includes the model, built before "
        "it; a restore's the restored state), in state bytes.",
        "",
        "| precision | state | op | floor | floor MB/s | Cairn | Cairn MB/s | ratio to the floor | peak RSS, fresh process |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p, x in res.items():
        for op in ("save", "restore"):
            f, c, rss = x[op]["floor"], x[op]["cairn"], x[op]["rss"]
            out.append(
                f"| {p} (`{x['dtype']}`) | {x['bytes'] / 1e6:.0f} MB | {op} | {spread(f)} | {x['bytes'] / 1e6 / f['median']:.0f} | "
                f"{spread(c)} | {x['bytes'] / 1e6 / c['median']:.0f} | **{x[op]['ratio']:.2f}×** | "
                f"{rss['peak_over_imports'] / MiB:.0f} MiB ({rss['ratio_to_state']:.2f}×) |"
            )
    b, f = res["bf16"], res["fp32"]
    out += [
        "",
        f"bfloat16 holds {b['bytes'] / f['bytes']:.2f}× the bytes of float32; its save takes "
        f"{b['save']['cairn']['median'] / f['save']['cairn']['median']:.2f}× the time of float32's and its restore "
        f"{b['restore']['cairn']['median'] / f['restore']['cairn']['median']:.2f}× (Cairn medians, same run). "
        "The CPU work a restore adds to the reads, measured alone in memory: "
        + "; ".join(
            f"{p} BLAKE3 {x['cpu_s']['blake3'] * 1e3:.0f} ms, finite check {x['cpu_s']['finite'] * 1e3:.0f} ms"
            for p, x in res.items()
        )
        + f" — for bf16 {(b['cpu_s']['blake3'] + b['cpu_s']['finite']) / b['restore']['floor']['median']:.2f}× the "
        "floor's whole read, which a restore can hide behind its reads only on an idle core (this machine has "
        "two, shared with other work). A 16-bit float's finite check is an exact test on its bits, not a sum "
        "in float32.",
    ]
    ratios = [b[op]["ratio"] for op in ("save", "restore")]
    targets.add(
        f"bf16 save and restore ≥ 0.9× the floor for its bytes (local disk, {m['params'] / 1e6:.0f}M params)",
        f"save {ratios[0]:.2f}×, restore {ratios[1]:.2f}×",
        min(ratios) >= 0.9,
        "the same run, interleaved with fp32 (fp32: save "
        f"{f['save']['ratio']:.2f}×, restore {f['restore']['ratio']:.2f}×)",
    )
    peaks = {f"{p} {op}": x[op]["rss"]["ratio_to_state"] for p, x in res.items() for op in ("save", "restore")}
    over = [k for k, v in peaks.items() if v > RSS_TARGET]
    targets.add(
        "peak RSS of a save / a restore in a fresh process ≤ the state + 10%",
        ", ".join(f"{k} {v:.2f}×" for k, v in peaks.items()),
        not over,
        ("over in: " + ", ".join(over)) if over else "bf16 and fp32, save and restore",
    )
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``precision.png``: MB/s of the floor and of Cairn, per precision and op."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    labels, floor, ours = [], [], []
    for p, x in r["results"].items():
        for op in ("save", "restore"):
            labels.append(f"{p}\n{op}")
            floor.append(x["bytes"] / 1e6 / x[op]["floor"]["median"])
            ours.append(x["bytes"] / 1e6 / x[op]["cairn"]["median"])
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = np.arange(len(labels))
    ax.bar(xs - 0.2, floor, 0.4, label="floor (plain I/O)")
    ax.bar(xs + 0.2, ours, 0.4, label="Cairn (hashed, validated)")
    for xi, f, o in zip(xs, floor, ours, strict=True):
        ax.text(xi + 0.2, o, f"{o / f:.2f}×", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(xs, labels, fontsize=8)
    ax.set_ylabel("MB/s (median)")
    ax.set_ylim(0, max(floor + ours) * 1.3)
    ax.set_title(f"GPT weights, {r['model']['params'] / 1e6:.0f}M params, local disk")
    ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    path = folder / "precision.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
