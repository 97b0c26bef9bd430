# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 1 of ``BENCHMARKS.md`` (save and restore vs the floor) and ``store.png``, from the
results of ``bench.suites.store``: every store, size and op against the floor; one target per store."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.measure import MiB
from bench.sections import Targets, spread


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    out = [
        "Floor = the same bytes moved by plain sequential I/O on the same store, measured in the same "
        "run, interleaved rep by rep with Cairn: one file written + fsync / read into one fresh buffer "
        "(local disk); one boto3 multipart upload / parallel ranged download with the same part size "
        "(16 MiB), concurrency (8) and unsigned bodies as Cairn's S3 store (SeaweedFS on loopback; bodies "
        "signed on both sides in runs before 2026-12-04). Restores read from the "
        "device on local disk (every file's pages evicted first, both sides). Cairn's save hashes every "
        "byte (BLAKE3) and commits a manifest; its restore checks every checksum, finiteness, v ≥ 0 and "
        "the invariants. Ratio = floor seconds / Cairn seconds (≥ 1: at least as fast as the floor). "
        f"Median (min–max) of {r['reps']} interleaved reps. Peak extra RSS: one untimed call, sampled "
        "every 2 ms, above the process's RSS before the call; a restore's includes the restored state "
        "itself (1× is the minimum for any restore into fresh memory).",
        "",
        "| store | state | op | floor | floor MB/s | Cairn | Cairn MB/s | ratio | before the fix | peak extra RSS floor / Cairn |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    misses: list[str] = []
    for store, sizes in r["results"].items():
        for mib, res in sizes.items():
            nbytes = res["bytes"]
            for op in ("save", "restore"):
                x = res[op]
                f, c = x["floor"], x["cairn"]
                before = f"{x['ratio_before_fix']:.2f}×" if "ratio_before_fix" in x else "–"
                rss = x["peak_extra_rss"]
                out.append(
                    f"| {'local disk' if store == 'local' else 'SeaweedFS S3'} | {mib} MiB | {op} | {spread(f)} | "
                    f"{nbytes / 1e6 / f['median']:.0f} | {spread(c)} | {nbytes / 1e6 / c['median']:.0f} | "
                    f"**{x['ratio']:.2f}×** | {before} | {rss['floor'] / MiB:.0f} / {rss['cairn'] / MiB:.0f} MiB "
                    f"({rss['cairn'] / nbytes:.2f}× state) |"
                )
                if x["ratio"] < 0.9:
                    misses.append(f"{store} {mib} MiB {op} {x['ratio']:.2f}×")
    split_rows = [(mib, res) for mib, res in r["results"].get("s3", {}).items() if res.get("restore_split")]
    if split_rows:
        out += [
            "",
            "Where an S3 restore's time goes: the floor's download keeps this many of the machine's cores busy "
            "(the client and SeaweedFS on the same machine, from `/proc/stat`), and Cairn's checks alone take this "
            "long — the same `load_training` from a copy of the checkpoint in memory (every checksum, the value "
            "checks, the copy into fresh arrays; no network). Overlapping the checks with the download needs idle "
            "cores; where the download already keeps them busy, the checks add to it.",
            "",
            "| state | floor | cores busy during the floor (of N) | Cairn's checks alone | Cairn | Cairn − floor |",
            "|---|---|---|---|---|---|",
        ]
        for mib, res in split_rows:
            sp, x = res["restore_split"], res["restore"]
            gap = x["cairn"]["median"] - x["floor"]["median"]
            out.append(
                f"| {mib} MiB | {x['floor']['median']:.3f} s | {sp['floor_busy_cores']['median']:.2f} of {sp['cores']} | "
                f"{spread(sp['checks_only'])} | {x['cairn']['median']:.3f} s | {gap:+.3f} s |"
            )
    for store, sizes in r["results"].items():
        if not sizes:
            continue
        where = "local disk" if store == "local" else "S3"
        ratios = [res[op]["ratio"] for res in sizes.values() for op in ("save", "restore")]
        mine = [m.removeprefix(store + " ") for m in misses if m.startswith(store + " ")]
        targets.add(
            f"save and restore ≥ 0.9× the floor on {where}, {', '.join(f'{m} MiB' for m in sizes)}",
            f"{min(ratios):.2f}×–{max(ratios):.2f}× over {len(ratios)} cases",
            not mine,
            ("missed in: " + ", ".join(mine)) if mine else "every size, save and restore",
        )
        restores = {mib: res["restore"]["ratio"] for mib, res in sizes.items()}
        under = [f"{mib} MiB {ratio:.2f}×" for mib, ratio in restores.items() if ratio < 1.0]
        targets.add(
            f"restore ≥ 1.0× the floor with every check on, {where}, {', '.join(f'{m} MiB' for m in sizes)} (issue 42)",
            ", ".join(f"{mib} MiB {ratio:.2f}×" for mib, ratio in restores.items()),
            not under,
            ("under it: " + ", ".join(under)) if under else "every size",
        )
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``store.png``: MB/s of the floor and of Cairn, per store, size and op."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    stores = [k for k in ("local", "s3") if r["results"].get(k)]
    fig, axes = plt.subplots(1, len(stores), figsize=(6 * len(stores), 4), squeeze=False)
    for ax, store in zip(axes[0], stores, strict=True):
        sizes = list(r["results"][store])
        labels, floor, ours = [], [], []
        for mib in sizes:
            res = r["results"][store][mib]
            for op in ("save", "restore"):
                labels.append(f"{mib} MiB\n{op}")
                floor.append(res["bytes"] / 1e6 / res[op]["floor"]["median"])
                ours.append(res["bytes"] / 1e6 / res[op]["cairn"]["median"])
        x = np.arange(len(labels))
        ax.bar(x - 0.2, floor, 0.4, label="floor (plain I/O)")
        ax.bar(x + 0.2, ours, 0.4, label="Cairn (hashed, validated)")
        for xi, f, o in zip(x, floor, ours, strict=True):
            ax.text(xi + 0.2, o, f"{o / f:.2f}×", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_ylabel("MB/s (median)")
        ax.set_ylim(0, max(floor + ours) * 1.3)  # headroom for the legend
        ax.set_title("local disk" if store == "local" else "SeaweedFS S3 (loopback)")
        ax.legend(fontsize=8, loc="upper center", ncol=2)
    fig.tight_layout()
    path = folder / "store.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
