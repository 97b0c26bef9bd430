# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 7 of ``BENCHMARKS.md`` (distributed checkpoints) and ``distributed.png``, from the
results of ``bench.suites.distributed``: saves and restores per W, the reductions, where the
time goes (no target)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.harness.measure import MiB
from bench.harness.ranks import SAVE_CASES
from bench.sections import Targets, spread


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    ck, cm = r["checkpoint"], r["comm"]
    first = next(iter(ck.values()))
    worlds = ", ".join(ck)
    out = [
        f"A {first['bytes'] / MiB:.0f} MiB MLP training state (theta + Adam m + v, float64, {first['elements']:,} "
        f"parameters, {first['blocks']} blocks of {r['block_bytes'] / MiB:g} MiB per group) ZeRO-1 sharded over W = "
        f"{worlds} real rank processes (spawned, gloo over loopback): each rank owns the block-aligned slice "
        "`flat_layout(...).slices(W)[rank]` of theta, m and v (`ZeroMLP`). One gang per W; within it the cases are "
        f"interleaved rep by rep ({r['reps']} reps, median (min–max)) and each is timed on rank 0 between two "
        "barriers (all ranks released together, the time ends when the last rank is done). Local disk, temp dir; "
        "every save writes fresh files and is durable, every restore reads from the device (pages evicted first).",
        "",
        "- **Cairn**: save = `ZeroMLP.save` (finiteness agreed, then `coordinated_save`: every rank streams its "
        "blocks into its own shard files, BLAKE3 of every byte, fsync; an all-gather barrier; rank 0 commits the "
        "manifest). Restore = `read_manifest` + the metadata check, then `read_blocks` of the rank's own blocks of "
        "theta, m, v into fresh buffers (ranged reads, every block checksummed and value-checked), agreed by all "
        "ranks. The theta all-gather that `ZeroMLP.load` does after the read is not timed here.",
        "- **DCP**: `torch.distributed.checkpoint.save` / `load` with `FileSystemWriter` / `FileSystemReader` at "
        "their defaults (one file per rank, fsync, one I/O thread per rank) of the same slices as three "
        "`ShardedTensor`s (`theta`, `adam.m`, `adam.v`) of the whole flat length, each rank's local shard at its "
        "slice's offset (uneven, block-aligned shards: DTensor's even `Shard(0)` cannot express them). The load "
        "fills freshly allocated shards (built inside the timed load). DCP checksums and checks no value.",
        "- **floor (1 writer)**: the same bytes by one writer, as in section 1: rank 0 writes one file + fsync / "
        "reads it into one fresh buffer while the other ranks wait at the barrier.",
        "- **W writers, plain I/O**: every rank writes its own slice's bytes to its own file + fsync / reads them "
        "back — the sharded save's concurrency without any format, hashing or commit.",
        "",
        "Ratios are the other's seconds / Cairn's seconds of the medians (> 1: Cairn is faster). CPU s: user + "
        "system seconds of every rank's process (all its threads) during one call, the closing barrier excluded, "
        "summed over the ranks (each rank's median call). W = 1 runs the same code in a gloo group of one. Both "
        "restores were checked bit-exact against the saved slices on every rank.",
        "",
        "| W | op | Cairn | Cairn MB/s | DCP | floor (1 writer) | W writers, plain I/O | DCP / Cairn | floor / Cairn | W writers / Cairn | CPU s, all ranks: Cairn / DCP / floor / W writers |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for w, c in ck.items():
        for op in ("save", "restore"):
            x = c[op]
            ours = x["cairn"]["median"]
            out.append(
                f"| {w} | {op} | {spread(x['cairn'])} | {c['bytes'] / 1e6 / ours:.0f} | {spread(x['dcp'])} | {spread(x['floor'])} | "
                f"{spread(x['floor_parallel'])} | **{x['dcp']['median'] / ours:.2f}×** | "
                f"**{x['floor']['median'] / ours:.2f}×** | {x['floor_parallel']['median'] / ours:.2f}× | "
                + " / ".join(f"{c['cpu_seconds'][op][n]:.2f}" for n in SAVE_CASES)
                + " |"
            )
    out += [
        "",
        "Bytes on disk (W = "
        + ", ".join(ck)
        + "): Cairn "
        + " / ".join(f"{c['bytes_on_disk']['cairn']:,}" for c in ck.values())
        + f" ({' / '.join(str(c['cairn_files']) for c in ck.values())} files), DCP "
        + " / ".join(f"{c['bytes_on_disk']['dcp']:,}" for c in ck.values())
        + f"; the state itself is {first['bytes']:,} bytes.",
        "",
        "### The canonical reduction vs a plain all-reduce",
        "",
        f"Per update, {r['comm_reps']} interleaved reps, timed on rank 0 between barriers; every rank holds a "
        "random gradient vector (its subtree sum). **canonical** is `ZeroMLP.step`'s path (`SliceReducer`): one "
        "all-to-all of slices (each rank receives every rank's partial sums of the slice it owns — a "
        "reduce-scatter's traffic), the top of the tree summed in place on the owned slice, then the all-gather of "
        "the slices (an all-to-all of the slice tiled W times), on buffers kept across updates. **canonical, raw** "
        "is the same two `all_to_all_single` calls and the same tree (the same bits, checked) written directly on "
        "torch tensors, without Cairn's `Comm` layer. **all-reduce** is one in-place `dist.all_reduce` (gloo, "
        "SUM) of the same vector, nothing else — its result's bits depend on W and on gloo's algorithm; the "
        "canonical one's do not. Rank 0's split of the canonical path: exchange / combine / all-gather.",
        "",
        "| W | gradient | canonical | canonical, raw | all-reduce | canonical / all-reduce | raw / all-reduce | split (rank 0) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for w, sizes in cm.items():
        for x in sizes.values():
            split = x["phases_rank0"]["canonical"]
            out.append(
                f"| {w} | {x['elements'] / 2**20:g} Mi float64 ({x['bytes'] / MiB:g} MiB) | "
                f"{spread(x['canonical'], 'ms', 1e3, 1)} | {spread(x['canonical_reused'], 'ms', 1e3, 1)} | "
                f"{spread(x['all_reduce'], 'ms', 1e3, 1)} | **{x['ratio']:.2f}×** | {x['ratio_reused']:.2f}× | "
                + " / ".join(f"{split[p]['median'] * 1e3:.1f}" for p in ("exchange", "combine", "all_gather"))
                + " ms |"
            )
    out += ["", *time_notes(r)]
    return out


def time_notes(r: dict[str, Any]) -> list[str]:
    """Where the time goes, from the measured numbers."""
    ck, cm = r["checkpoint"], r["comm"]
    cores = r["machine"]["cores"]

    def span(values: list[float], unit: str = "×") -> str:
        lo, hi = min(values), max(values)
        return f"{lo:.2f}{unit}" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}{unit}"

    def ratio(op: str, other: str, mine: str = "cairn", worlds: Any = None) -> list[float]:
        return [c[op][other]["median"] / c[op][mine]["median"] for w, c in ck.items() if worlds is None or w in worlds]

    multi = [w for w in ck if w != "1"]
    cpu = {op: {n: [c["cpu_seconds"][op][n] for c in ck.values()] for n in SAVE_CASES} for op in ("save", "restore")}
    out = [
        "**Where the time goes.**",
        "",
        f"- *One disk, {cores} cores.* Every rank writes to and reads from the same disk, and the W rank processes "
        f"share the machine's {cores} cores (W = 4 puts two ranks on each core): nothing here can get faster with W "
        f"beyond what one disk and {cores} cores give, so **W = 4 cannot be faster than W = 2 on this machine**, and "
        "the rows per W show what coordination costs at each W, not scaling. The gangs ran one after another "
        "(compare W's with their min–max in mind); the ratios are within one gang, side by side.",
    ]
    if "1" in ck:
        one = ck["1"]
        out.append(
            "- *Noise.* At W = 1 the two floors are the same operation (one process, one file of the same size); "
            "in this run the one's median over the other's is "
            f"{span([one['save']['floor']['median'] / one['save']['floor_parallel']['median']])} on save and "
            f"{span([one['restore']['floor']['median'] / one['restore']['floor_parallel']['median']])} on restore — "
            "the scale of what the machine's other work and where a file lands on the disk do to a median "
            "of a few reps. Read differences of that size as noise."
        )
    if multi:
        writes = ratio("save", "floor", "floor_parallel", multi)
        reads = ratio("restore", "floor", "floor_parallel", multi)
        out.append(
            f"- *The device.* At W > 1, W plain writers are {span(writes)} as fast as one writer and W plain "
            f"readers {span(reads)} as fast as one reader (floor s / W-writers s). Sharding adds no disk: what W "
            "concurrent streams buy is the one disk's own parallelism"
            + (
                ", and it buys more on reads than on writes."
                if sum(reads) / len(reads) > 1.2 * sum(writes) / len(writes)
                else "."
            )
        )
    out += [
        f"- *Save.* Cairn's sharded save runs at {span(ratio('save', 'floor'))} the single-writer floor's speed "
        f"(floor s / Cairn s) and {span(ratio('save', 'dcp'))} DCP's (DCP s / Cairn s) over W = {', '.join(ck)}. Beyond the plain writes "
        "it agrees on finiteness (one collective), hashes every byte (BLAKE3), all-gathers the shard indexes and has "
        f"rank 0 commit one manifest: {span(cpu['save']['cairn'], ' CPU s')} over all ranks per save, vs "
        f"{span(cpu['save']['dcp'], ' CPU s')} for DCP and {span(cpu['save']['floor_parallel'], ' CPU s')} for the "
        "plain writers (user + system time of every rank's process, the barrier excluded).",
        f"- *Restore.* Cairn's coordinated restore runs at {span(ratio('restore', 'floor'))} the single-reader "
        f"floor's speed and {span(ratio('restore', 'dcp'))} DCP's. It does CPU work the plain reads do not — every block's BLAKE3, "
        f"the finiteness and v ≥ 0 checks: {span(cpu['restore']['cairn'], ' CPU s')} over all ranks vs "
        f"{span(cpu['restore']['floor_parallel'], ' CPU s')} for the plain readers (DCP: "
        f"{span(cpu['restore']['dcp'], ' CPU s')}). On {cores} cores that is at least "
        f"{span([c / cores for c in cpu['restore']['cairn']], ' s')} of wall time whatever W is; the plain readers "
        "do none of it.",
    ]
    if cm:
        rows = [x for sizes in cm.values() for x in sizes.values()]
        largest = max(rows, key=lambda x: x["elements"])
        w_largest = next(w for w, sizes in cm.items() for x in sizes.values() if x is largest)
        split = largest["phases_rank0"]["canonical"]
        gather_share = split["all_gather"]["median"] / largest["canonical"]["median"]
        out.append(
            f"- *Reduction.* ZeroMLP's canonical path costs {span([x['ratio'] for x in rows])} a plain all-reduce "
            f"(written raw on torch tensors: {span([x['ratio_reused'] for x in rows])}). Both move what a ring "
            "all-reduce moves — (W−1)/W of the vector out and in per rank for the reduce-scatter half (the all-to-all "
            "of slices), and again for the all-gather half. In the first run of this benchmark `ZeroMLP.step` "
            "allocated its exchange output, the combined slice and the tiled slice on every update and cost 2.0–6.7× "
            "an all-reduce: every first touch of a fresh large buffer is a page fault, expensive in this VM. It now "
            "keeps them across updates (`SliceReducer`, the tree summed in place, the same bits). At the largest size "
            f"the all-gather step is {gather_share:.0%} of the canonical time on rank 0 (W = {w_largest}). What remains "
            "is the top of the tree ((W−1)/W of the vector in additions, one thread, memory-bound), the tile copy, and "
            "gloo's all-to-all against its ring all-reduce, which overlaps the additions with the transfer."
        )
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``distributed.png``: save and restore per W and case; the reductions per W and size."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    ck, cm = r["checkpoint"], r["comm"]
    labels = {"cairn": "Cairn", "dcp": "DCP", "floor": "floor (1 writer)", "floor_parallel": "W writers, plain I/O"}
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.2))
    for ax, op in zip(axes[:2], ("save", "restore"), strict=True):
        x = np.arange(len(ck))
        width = 0.8 / len(SAVE_CASES)
        for i, case in enumerate(SAVE_CASES):
            ys = [c[op][case]["median"] for c in ck.values()]
            ax.bar(x + (i - (len(SAVE_CASES) - 1) / 2) * width, ys, width, label=labels[case])
        ax.set_xticks(x, [f"W={w}" for w in ck])
        ax.set_ylabel("seconds (median, lower is better)")
        ax.set_title(f"{op}, {next(iter(ck.values()))['bytes'] / MiB:.0f} MiB state, local disk")
        top = max(c[op][case]["median"] for c in ck.values() for case in SAVE_CASES)
        ax.set_ylim(0, top * 1.35)  # headroom for the legend
        ax.legend(fontsize=8, loc="upper center", ncol=2)
    ax = axes[2]
    rows = [(w, x) for w, sizes in cm.items() for x in sizes.values()]
    x = np.arange(len(rows))
    for i, (case, label) in enumerate(
        (
            ("canonical", "canonical (ZeroMLP.step)"),
            ("canonical_reused", "canonical, raw"),
            ("all_reduce", "all-reduce"),
        )
    ):
        ax.bar(x + (i - 1) * 0.27, [row[case]["median"] * 1e3 for _, row in rows], 0.27, label=label)
    ax.set_xticks(x, [f"W={w}\n{row['bytes'] / MiB:.0f} MiB" for w, row in rows])
    ax.set_yscale("log")
    values = [row[c]["median"] * 1e3 for _, row in rows for c in ("canonical", "canonical_reused", "all_reduce")]
    ax.set_ylim(min(values) / 2, max(values) * 8)  # headroom for the legend
    ax.set_ylabel("ms per update (median, log)")
    ax.set_title("gradient reduction, gloo on loopback")
    ax.legend(fontsize=8, loc="upper left", ncol=2)
    fig.tight_layout()
    path = folder / "distributed.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
