"""Section 2 of ``BENCHMARKS.md`` (peers on the same bytes) and ``peers.png``, from the results
of ``bench.suites.peers``: every library's save and load; the targets against torch.save and DCP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.measure import MiB
from bench.sections import Targets, spread


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    res = r["results"]
    out = [
        f"The equivalent state dict (parameters and both Adam moments, float64, {r['bytes'] / MiB:.0f} MiB; torch "
        "tensors sharing the numpy arrays' memory) saved and loaded by each library on the same local disk, "
        f"interleaved rep by rep ({r['reps']} reps). Every save is made durable (the peers' files are fsynced "
        "after `torch.save` / `save_file`; DCP and Cairn fsync themselves); every load reads from the device "
        "(pages evicted first) and touches one byte per page of what it returns (safetensors maps the file "
        "lazily). DCP runs in its non-distributed mode (one process, no process group) and loads into freshly "
        "allocated tensors. Ratio = peer seconds / Cairn seconds (> 1: Cairn is faster). Cairn's load is its "
        "full validated import (every checksum, finiteness, v ≥ 0, invariants); the peers verify no checksum "
        "and no value.",
        "",
        "| library | save | save ratio | load | load ratio | bytes on disk | peak extra RSS save / load |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, x in res.items():
        rss = x["peak_extra_rss"]
        size = f"{x['bytes_on_disk']:,}" if x.get("bytes_on_disk") else "–"
        out.append(
            f"| {name} | {spread(x['save'])} | {x['save_ratio']:.2f}× | {spread(x['load'])} | {x['load_ratio']:.2f}× | "
            f"{size} | {rss['save'] / MiB:.0f} / {rss['load'] / MiB:.0f} MiB |"
        )
    if r.get("adapter_skipped"):
        out += ["", f"Cairn PyTorch adapter save/restore: **skipped** — {r['adapter_skipped']}."]
    ts, dcp = res["torch.save / torch.load"], res["torch.distributed.checkpoint"]
    targets.add(
        "save ≥ 1.25× torch.save",
        f"{ts['save_ratio']:.2f}×",
        ts["save_ratio"] >= 1.25,
        f"by {ts['save_ratio'] / 1.25 - 1:+.0%}",
    )
    targets.add(
        "save ≥ 1.25× DCP save",
        f"{dcp['save_ratio']:.2f}×",
        dcp["save_ratio"] >= 1.25,
        f"by {dcp['save_ratio'] / 1.25 - 1:+.0%}",
    )
    targets.add(
        "load ≥ 2× DCP load",
        f"{dcp['load_ratio']:.2f}×",
        dcp["load_ratio"] >= 2.0,
        f"by {dcp['load_ratio'] / 2 - 1:+.0%}",
    )
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``peers.png``: save and load seconds per library."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(r["results"])
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(8, 4))
    save = [r["results"][n]["save"]["median"] for n in names]
    load_ = [r["results"][n]["load"]["median"] for n in names]
    ax.bar(x - 0.2, save, 0.4, label="save (durable)")
    ax.bar(x + 0.2, load_, 0.4, label="load (from the device)")
    ax.set_xticks(x, [n.replace(" / ", "\n") for n in names], fontsize=8)
    ax.set_ylabel("seconds (median, lower is better)")
    ax.set_title(f"{r['bytes'] / MiB:.0f} MiB state dict: Cairn vs peers, same disk, same run")
    ax.legend()
    fig.tight_layout()
    path = folder / "peers.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
