# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 20 of ``BENCHMARKS.md`` (FSDP2 checkpoints and steps) and ``fsdp.png``, from the
results of ``bench.suites.fsdp``: saves and restores per rank against the floor for the rank's
shard, peak RSS per rank, resharding W = 4 → 2 against DCP's own, FSDP vs replicated steps."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from bench.harness.measure import MiB
from bench.sections import Targets, spread


def _floors(w: dict[str, Any], op: str) -> list[float]:
    """Seconds of the floor for each rank's shard: its bytes at the bandwidth one writer (one
    reader) of the whole state reached in the same gang."""
    bandwidth = w["bytes"] / w[op]["floor"]["median"]
    return [b / bandwidth for b in w["shard_bytes"]]


def _own(w: dict[str, Any], op: str, case: str) -> list[float]:
    """Each rank's median of its own clock."""
    return [r["median"] for r in w[f"{op}_per_rank"][case]]


def _span(values: list[float], unit: str = "×", digits: int = 2) -> str:
    lo, hi = min(values), max(values)
    return (
        f"{lo:.{digits}f}{unit}"
        if f"{lo:.{digits}f}" == f"{hi:.{digits}f}"
        else f"{lo:.{digits}f}–{hi:.{digits}f}{unit}"
    )


def _mib(n: float) -> str:
    return f"{n / MiB:.1f}"


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    worlds = r["worlds"]
    first = next(iter(worlds.values()))
    m = r["model"]
    block = r["block_bytes"]
    params = m["layers"] * (m["width"] ** 2 + m["width"])
    loads = ", ".join(f"W = {k}: {v['loadavg_before'][0]:.1f} → {v['loadavg_after'][0]:.1f}" for k, v in worlds.items())
    out = [
        f"The PyTorch adapter under `distributed.strategy: fsdp` (FSDP2 `fully_shard`, gloo on CPU) on `WideMLP` "
        f"(`bench/suites/fsdp.py`: {m['layers']} `Linear({m['width']}, {m['width']})` layers, each its own "
        f"`fully_shard` unit, AdamW, built from its config): {params:,} float32 parameters, "
        f"{first['bytes'] / MiB:.0f} MiB of parameters and both Adam moments, {first['tensors']} state tensors, "
        f"blocks of {block / MiB:g} MiB. One gang of W real rank processes per W (spawned, gloo over loopback), "
        f"largest first; each rank takes the adapter's own engine (`trainer.data_parallel`), one update done. "
        f"Within a gang every case is interleaved rep by rep ({r['reps']} reps of each save and restore, "
        f"{r['step_reps']} of each update; median (min–max)); each is timed "
        "between two barriers (the gang's time) and each rank also clocks its own call. Local disk, temp dir; "
        "every save writes fresh files and is durable, every restore reads from the device (pages evicted first). "
        "**Load:** this 2-core machine was shared with other work; the load average (1 min) before → after "
        f"each gang was {loads} (`os.getloadavg()`; the gang itself adds W).",
        "",
        "### Save and restore per rank vs the floor for its shard",
        "",
        "**floor for the shard** = the rank's shard bytes at the disk's sustained bandwidth, measured in the same "
        "gang as one writer (one reader) of the whole state's bytes (one file + fsync / read into a fresh buffer, "
        "as section 1's floor). The W ranks share that one disk and its bandwidth, so against its own shard's "
        "floor a rank can expect about 1/W, not 1 (more where W concurrent streams get more from the disk than "
        "one does). **W writers** = every "
        "rank writes (reads) its shard's bytes to (from) its own file at once, plain I/O. Per rank: the median of "
        "each rank's own clock, the range over the ranks. Ratios are floor seconds / Cairn seconds (> 1: Cairn "
        "is faster).",
        "",
        "| W | op | shard per rank | Cairn, per rank | floor for the shard | floor / Cairn per rank | W writers, per rank | gang: Cairn | gang: floor of the whole state | whole-state floor / Cairn (gang) | CPU s, all ranks: Cairn / floor / W writers |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for k, w in worlds.items():
        for op in ("save", "restore"):
            ours, floors = _own(w, op, "cairn"), _floors(w, op)
            out.append(
                f"| {k} | {op} | {_span([b / MiB for b in w['shard_bytes']], ' MiB', 1)} | {_span(ours, ' s', 3)} | "
                f"{_span(floors, ' s', 3)} | **{_span([f / o for f, o in zip(floors, ours, strict=True)])}** | "
                f"{_span(_own(w, op, 'floor_parallel'), ' s', 3)} | {spread(w[op]['cairn'])} | {spread(w[op]['floor'])} | "
                f"{w[op]['floor']['median'] / w[op]['cairn']['median']:.2f}× | "
                + " / ".join(f"{w['cpu_seconds'][op][n]:.2f}" for n in ("cairn", "floor", "floor_parallel"))
                + " |"
            )
    out += [
        "",
        "### Peak RSS per rank during a save and a restore",
        "",
        "One more save and one more restore per gang, each rank's resident set sampled every 2 ms "
        "(`measure.peak_rss`) and reported above its level at the call's start (the live model, its optimizer "
        "state and the engine's export are already resident). Against **its shard + one block**: the issue's "
        "figure for a save (the engine's own docstring allows a block per shard boundary of each tensor).",
        "",
        "| W | rank | shard | shard + one block | save: peak above the start | save / (shard + block) | restore: peak above the start | restore / (shard + block) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for k, w in worlds.items():
        for rank, (shard, rss) in enumerate(zip(w["shard_bytes"], w["rss"], strict=True)):
            bound = shard + block
            out.append(
                f"| {k} | {rank} | {_mib(shard)} MiB | {_mib(bound)} MiB | {_mib(rss['save']['peak_extra'])} MiB | "
                f"{rss['save']['peak_extra'] / bound:.2f}× | {_mib(rss['restore']['peak_extra'])} MiB | "
                f"**{rss['restore']['peak_extra'] / bound:.2f}×** |"
            )
    out += ["", *_reshard(worlds), *_steps(worlds), *_notes(r)]
    return out


def _reshard(worlds: dict[str, Any]) -> list[str]:
    w = next((w for w in worlds.values() if "dcp_w4" in w["restore"]), None)
    if w is None:
        return []
    x = w["restore"]
    ours = x["cairn_w4"]["median"]
    rows = (
        ("Cairn, the W = 4 checkpoint (resharded)", "cairn_w4"),
        ("DCP, the same state saved by `dcp.save` at W = 4 (resharded)", "dcp_w4"),
        ("Cairn, the W = 2 gang's own checkpoint", "cairn"),
    )
    return [
        "### Resharding: a W = 4 checkpoint restored at W = 2, Cairn vs PyTorch DCP",
        "",
        "The W = 4 gang saved its state twice: a Cairn checkpoint (`engine.save`) and PyTorch DCP's own "
        "(`get_state_dict` of the live FSDP model and optimizer, `dcp.save`: one file per rank). The W = 2 gang "
        "restores each into its live model, interleaved with the cases above: **Cairn** = `engine.load` (manifest "
        "and config checks, only the blocks overlapping the rank's new shard, BLAKE3 and value checks, installed "
        "in the DTensors and the optimizer); **DCP** = `get_state_dict`, `dcp.load` (default `FileSystemReader`), "
        "`set_state_dict` (DCP verifies no checksum and no value). Both were checked to give the same bits on every "
        "rank.",
        "",
        "| restore at W = 2 | gang | per rank | DCP / this |",
        "|---|---|---|---|",
        *(
            f"| {label} | {spread(x[case])} | {_span(_own(w, 'restore', case), ' s', 3)} | "
            f"{x['dcp_w4']['median'] / x[case]['median']:.2f}× |"
            for label, case in rows
        ),
        "",
        f"DCP's resharded restore over Cairn's: **{x['dcp_w4']['median'] / ours:.2f}×** (> 1: Cairn is faster); "
        f"CPU seconds over both ranks: Cairn {w['cpu_seconds']['restore']['cairn_w4']:.2f}, DCP "
        f"{w['cpu_seconds']['restore']['dcp_w4']:.2f}.",
        "",
    ]


def _steps(worlds: dict[str, Any]) -> list[str]:
    out = [
        "### FSDP vs replicated: one update of the same model",
        "",
        "Each gang also builds the same model under `strategy: replicated` (`TorchDP`: the whole state on every "
        "rank, gradients reduced in Cairn's canonical tree) and times one update of each, interleaved. On CPU "
        "with gloo this is **the cost of sharding**: FSDP2 all-gathers every unit's parameters for each "
        "microbatch's forward and again for its backward and reduce-scatters its gradients, over loopback, "
        "with the ranks sharing 2 cores; there is no device memory to save here.",
        "",
        "| W | FSDP | replicated | FSDP / replicated |",
        "|---|---|---|---|",
    ]
    for k, w in worlds.items():
        s = w["steps"]
        out.append(
            f"| {k} | {spread(s['fsdp'])} | {spread(s['replicated'])} | **{s['fsdp']['median'] / s['replicated']['median']:.2f}×** |"
        )
    return [*out, ""]


def _notes(r: dict[str, Any]) -> list[str]:
    worlds = r["worlds"]
    block = r["block_bytes"]
    save_extra = [q["save"]["peak_extra"] for w in worlds.values() for q in w["rss"]]
    restore_over = [
        q["restore"]["peak_extra"] / s for w in worlds.values() for s, q in zip(w["shard_bytes"], w["rss"], strict=True)
    ]
    multi = [w for k, w in worlds.items() if k != "1"]
    shards = [s for w in worlds.values() for s in w["shard_bytes"]]
    pairs = [(s, q) for w in worlds.values() for s, q in zip(w["shard_bytes"], w["rss"], strict=True)]
    saves_within = all(q["save"]["peak_extra"] <= s + block for s, q in pairs)
    restores_within = sum(q["restore"]["peak_extra"] <= s + block for s, q in pairs)
    out = [
        "**What the numbers say.**",
        "",
        f"- *A save holds no gather.* A rank's save rose at most {max(save_extra) / MiB:.1f} MiB "
        f"({max(save_extra) / block:.1f} blocks) above its resident set at the start, for shards of "
        f"{min(shards) / MiB:.0f}–{max(shards) / MiB:.0f} MiB: the blocks it writes are views of its live "
        "shards; only the blocks that straddle a shard boundary are completed in new buffers (or sent to "
        "their owner), one per sharded tensor whose boundary falls inside a block, all held until written "
        f"(`TorchFSDP.my_blocks`). {'Every save stayed within' if saves_within else 'Not every save stayed within'} "
        "its shard + one block; a save holds more than one block wherever several tensors' boundaries straddle "
        "blocks.",
        f"- *A restore holds the shard about {statistics.median(restore_over):.1f} times over, above its start* "
        f"({_span(restore_over)} per rank); {restores_within} of {len(pairs)} ranks stayed within the shard + one "
        "block. What a rank reads (its blocks, then its rows assembled from them, `TorchFSDP.tensors_read`) becomes "
        "its optimizer state and buffers as it is (`ShardedTensors.install` adopts the restore's own buffers) and "
        "is copied only into the parameters' FSDP2 storage; the rest, at W > 1, is the blocks that overlap a "
        "neighbour's rows, read whole and cut (at most two per sharded tensor). No whole buffer is reserved for a "
        "sharded tensor, not even as untouched address space.",
    ]
    if multi:
        gang = [w["save"]["floor"]["median"] / w["save"]["cairn"]["median"] for w in multi]
        writers = [
            statistics.median(_own(w, "save", "floor_parallel")) / statistics.median(_own(w, "save", "cairn"))
            for w in multi
        ]
        out.append(
            f"- *One disk.* At W > 1 the ranks write to one disk at once: against the whole state's floor the "
            f"gang's save runs at {_span(gang)}, and against W plain writers of the same shards at {_span(writers)} "
            "(median rank); the floor for a rank's own shard assumes the disk to itself, which no rank has here."
        )
    return [*out, ""]


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``fsdp.png``: per-rank save and restore vs the floor for the shard; peak RSS per rank vs
    shard + block; the resharded restore vs DCP; FSDP vs replicated update time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    worlds = r["worlds"]
    keys = list(worlds)
    fig, axes = plt.subplots(1, 4, figsize=(20, 4.4))
    ax = axes[0]
    x = np.arange(len(keys))
    series = [
        ("save, Cairn", lambda w: statistics.median(_own(w, "save", "cairn"))),
        ("save, floor for the shard", lambda w: statistics.median(_floors(w, "save"))),
        ("restore, Cairn", lambda w: statistics.median(_own(w, "restore", "cairn"))),
        ("restore, floor for the shard", lambda w: statistics.median(_floors(w, "restore"))),
    ]
    for i, (label, value) in enumerate(series):
        ax.bar(x + (i - 1.5) * 0.2, [value(worlds[k]) for k in keys], 0.2, label=label)
    ax.set_xticks(x, [f"W={k}" for k in keys])
    ax.set_ylabel("seconds per rank (median rank)")
    ax.set_title(f"{next(iter(worlds.values()))['bytes'] / MiB:.0f} MiB state: per rank vs its shard's floor")
    ax.legend(fontsize=8)
    ax = axes[1]
    labels, saves, restores, bounds = [], [], [], []
    for k, w in worlds.items():
        for rank, (shard, q) in enumerate(zip(w["shard_bytes"], w["rss"], strict=True)):
            labels.append(f"W={k}\nr{rank}")
            saves.append(q["save"]["peak_extra"] / MiB)
            restores.append(q["restore"]["peak_extra"] / MiB)
            bounds.append((shard + r["block_bytes"]) / MiB)
    x = np.arange(len(labels))
    ax.bar(x - 0.2, saves, 0.4, label="save")
    ax.bar(x + 0.2, restores, 0.4, label="restore")
    ax.scatter(x, bounds, marker="_", s=300, color="black", label="shard + one block", zorder=3)
    ax.set_xticks(x, labels, fontsize=7)
    ax.set_ylabel("peak RSS above the call's start, MiB")
    ax.set_title("peak RSS per rank")
    ax.legend(fontsize=8)
    ax = axes[2]
    w2 = next((w for w in worlds.values() if "dcp_w4" in w["restore"]), None)
    if w2 is not None:
        cases = [("cairn_w4", "Cairn, W=4 ckpt"), ("dcp_w4", "DCP, W=4 ckpt"), ("cairn", "Cairn, own W=2 ckpt")]
        ax.bar(range(3), [w2["restore"][c]["median"] for c, _ in cases], color=["C0", "C1", "C2"])
        ax.set_xticks(range(3), [label for _, label in cases], fontsize=8)
    ax.set_ylabel("seconds (median, gang)")
    ax.set_title("restore at W=2: resharding from W=4")
    ax = axes[3]
    x = np.arange(len(keys))
    ax.bar(x - 0.2, [worlds[k]["steps"]["fsdp"]["median"] for k in keys], 0.4, label="FSDP")
    ax.bar(x + 0.2, [worlds[k]["steps"]["replicated"]["median"] for k in keys], 0.4, label="replicated")
    ax.set_xticks(x, [f"W={k}" for k in keys])
    ax.set_ylabel("seconds per update (median)")
    ax.set_title("one update, CPU gloo (the cost of sharding)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = folder / "fsdp.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
