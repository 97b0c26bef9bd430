# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 19 of ``BENCHMARKS.md`` (fine-tuning) and ``finetune.png``, from the results of
``bench.suites.finetune``: trainer build and ``ckpt verify`` time vs dataset size, LoRA bytes
per checkpoint, loader throughput; the targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.sections import Targets, spread


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    fp, sizes = r["fingerprint"], r["fingerprint"]["sizes_mib"]
    out = [
        "The fine-tuning example's config (a small pretrained Llama from `examples/finetune.py`, an instruction JSONL "
        "streamed by `trainer.options.data`), in one process, the sizes interleaved rep by rep "
        f"({r['reps']} reps; medians, min–max). *Build*: the trainer built (what a segment's cold start, `ckpt verify` "
        "and `ckpt export` pay); *cold*: the file's content hash not cached yet (its bytes read once); *warm*: hashes "
        "cached by path, size and mtime (no data byte read). *Verify*: `cairn ckpt verify` of a one-step checkpoint, "
        "warm.",
        "",
        "| JSONL | records | build, cold | build, warm | `ckpt verify`, warm |",
        "|---|---|---|---|---|",
    ]
    for mib in sizes:
        out.append(
            f"| {fp['bytes'][str(mib)] / 2**20:,.0f} MiB | {fp['records'][str(mib)]:,} | {spread(fp[f'build_cold_{mib}'])} | "
            f"{spread(fp[f'build_warm_{mib}'])} | {spread(fp[f'verify_warm_{mib}'])} |"
        )
    lo, hi = sizes[0], sizes[-1]
    growth = max(fp[f"{k}_{hi}"]["median"] / fp[f"{k}_{lo}"]["median"] for k in ("build_warm", "verify_warm"))
    targets.add(
        f"trainer build and `ckpt verify` do not grow with the dataset ({lo} MiB → {hi:,} MiB of JSONL; issue 40)",
        f"{growth:.2f}× the smallest's time at the largest",
        growth <= 1.5,
        f"cold, the first build hashes the file once: {fp[f'build_cold_{hi}']['median']:.2f} s at {hi:,} MiB",
    )
    lora, full = r["lora"]["lora"], r["lora"]["full"]
    share = lora["later"]["median"] / full["later"]["median"]
    out += [
        "",
        f"Bytes written per incremental checkpoint after the first (the first writes the frozen base too: LoRA "
        f"{lora['first'] / 2**20:.2f} MiB, full {full['first'] / 2**20:.2f} MiB): LoRA rank 8 "
        f"{lora['later']['median']:,.0f} B, a full fine-tune {full['later']['median']:,.0f} B ({share:.3f} of it).",
    ]
    targets.add(
        "LoRA bytes written per checkpoint ≤ 1/10 of a full fine-tune's (rank 8, small Llama; issue 40)",
        f"{share:.3f}",
        share <= 0.1,
        "",
    )
    ld = r["loader"]
    per = ld["batches"] * ld["batch_size"]
    out += [
        "",
        f"The streamed loader, {ld['batches']} batches of {ld['batch_size']} sequences from two {ld['files_mib']} MiB files "
        f"(a fresh iterator each rep, so worker start-up counts): 0 workers {spread(ld['workers_0'])} "
        f"({per / ld['workers_0']['median']:,.0f} sequences/s), 2 workers {spread(ld['workers_2'])} "
        f"({per / ld['workers_2']['median']:,.0f} sequences/s); the same batches, bit for bit.",
    ]
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``finetune.png``: build and verify seconds vs dataset size, cold and warm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fp, sizes = r["fingerprint"], r["fingerprint"]["sizes_mib"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (
        ("build_cold", "build, cold"),
        ("build_warm", "build, warm"),
        ("verify_warm", "ckpt verify, warm"),
    ):
        ax.plot(sizes, [fp[f"{key}_{m}"]["median"] for m in sizes], marker="o", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("JSONL MiB")
    ax.set_ylabel("seconds (median)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = folder / "finetune.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
