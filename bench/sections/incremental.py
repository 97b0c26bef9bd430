# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 17 of ``BENCHMARKS.md`` (incremental checkpoints) and ``incremental.png``, from the
results of ``bench.suites.incremental``: bytes written and save time per regime, beside the
floors; the targets."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.sections import Targets, spread


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    fine, full = r["regimes"]["fine-tuning, frozen base"], r["regimes"]["full training"]
    out = [
        f"A {fine['state_bytes'] / 2**20:.0f} MiB training state (theta, m, v of the tanh MLP) saved to local disk, "
        f"{r['reps']} consecutive saves per case, interleaved rep by rep (medians, min–max). Fine-tuning: `W1` and its "
        f"moments are frozen ({1 - fine['changing_bytes'] / fine['state_bytes']:.1%} of the bytes), the rest changes "
        "before every save; full training: everything changes. *Incremental*: `CheckpointOptions(incremental=True)` "
        "after the run's previous save in the same process (blocks of 1 MiB); *full*: the same state saved as today "
        "(incremental off). Floors: the bytes the incremental save wrote, and the whole state, written to one new "
        "file + fsync. *Hash all*: BLAKE3 over the whole state in one thread — what any save pays to know which blocks "
        "changed (Cairn hashes every block it saves, referenced or not).",
        "",
        "| regime | bytes written (incremental) | full checkpoint | incremental save | full save | floor, bytes written | floor, whole state | hash all |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, x in r["regimes"].items():
        out.append(
            f"| {name} | {x['written_bytes']['median'] / 2**20:.2f} MiB | {x['full_checkpoint_bytes'] / 2**20:.1f} MiB | "
            f"{spread(x['incremental'])} | {spread(x['full'])} | {spread(x['floor_written'])} | {spread(x['floor_full'])} | "
            f"{spread(x['hash_all'])} |"
        )
    share = fine["written_bytes"]["median"] / fine["full_checkpoint_bytes"]
    targets.add(
        "fine-tuning with a frozen base: bytes written per checkpoint ≤ 1/10 of a full checkpoint (issue 27)",
        f"{share:.3f} of it ({fine['written_bytes']['median'] / 2**20:.2f} of {fine['full_checkpoint_bytes'] / 2**20:.0f} MiB)",
        share <= 0.1,
        "",
    )
    ratio = fine["incremental"]["median"] / fine["floor_written"]["median"]
    targets.add(
        "fine-tuning: save time within 1.2× of the floor for the bytes actually written (issue 27)",
        f"{ratio:.1f}× ({fine['incremental']['median']:.3f} s vs {fine['floor_written']['median']:.3f} s)",
        ratio <= 1.2,
        f"every block is hashed to find what changed: {fine['hash_all']['median']:.3f} s for the whole state in one thread; "
        f"still {fine['full']['median'] / fine['incremental']['median']:.1f}× faster than a full save ({fine['full']['median']:.3f} s)",
    )
    slower = full["incremental"]["median"] / full["full"]["median"]
    targets.add(
        "full training: incremental saves no slower than today's (issue 27)",
        f"{slower:.2f}× today's save time",
        slower <= 1.05,
        "the same bytes written; every block is hashed up front for the lookup, not overlapped with the writes as a full save's hashing is",
    )
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``incremental.png``: per regime, MiB written and seconds of each case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(r["regimes"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    written = [r["regimes"][n]["written_bytes"]["median"] / 2**20 for n in names]
    full = [r["regimes"][n]["full_checkpoint_bytes"] / 2**20 for n in names]
    x = range(len(names))
    left.bar([i - 0.2 for i in x], full, 0.4, label="full checkpoint")
    left.bar([i + 0.2 for i in x], written, 0.4, label="incremental: written")
    left.set_xticks(list(x), names, fontsize=8)
    left.set_ylabel("MiB per checkpoint (median)")
    left.legend(fontsize=8)
    cases = ("incremental", "full", "floor_written", "hash_all")
    for k, case in enumerate(cases):
        right.bar([i + (k - 1.5) * 0.2 for i in x], [r["regimes"][n][case]["median"] for n in names], 0.2, label=case)
    right.set_xticks(list(x), names, fontsize=8)
    right.set_ylabel("seconds per save (median)")
    right.legend(fontsize=8)
    fig.tight_layout()
    path = folder / "incremental.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
