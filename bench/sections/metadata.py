# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 14 of ``BENCHMARKS.md`` (metadata at scale, in simulation) and ``metadata.png``, from
the results of ``bench.suites.metadata``: the root and the rank indexes of a 70B-class
checkpoint at 1,024 ranks, a restore at 512, what coordination costs on paper; the targets."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.harness.measure import MiB
from bench.sections import Targets, spread

ROOT_TARGET = 1 << 20
"""The issue's bound on the root manifest of a 1,024-rank checkpoint."""
PAPER = {  # the assumptions of the on-paper column
    "rtt_s": 0.030,  # one request to an S3-class store (first byte), small objects
    "store_gbps": 1.0,  # one client's stream for a metadata object
    "net_gbps": 10.0,  # one cluster link
    "hop_s": 30e-6,  # one step of a collective
}


def _mb(n: float) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} KB"


def paper(r: dict[str, Any]) -> dict[str, float]:
    """What coordination costs a 1,024-rank cluster, from the measured sizes and CPU times."""
    s, p, a = r["save"], r["restore"][0], PAPER

    def put(nbytes: float) -> float:
        return a["rtt_s"] + nbytes / (a["store_gbps"] * 1e9)

    gather = math.log2(max(2, s["ranks"])) * a["hop_s"] + s["gathered_bytes"] / (a["net_gbps"] * 1e9)
    save_s = (
        s["rank_write"]["p99"]
        + put(s["index_bytes"]["max"])  # every rank's index, in parallel: the slowest
        + gather
        + s["commit_s"]
        + put(s["root_bytes"])
        + put(s["root_bytes"])
        + put(200)  # commit: PUT, read back, latest
    )
    restore_s = put(s["root_bytes"]) + p["root_read"]["median"] + put(s["index_bytes"]["max"]) + p["plan"]["p99"]
    return {"gather_s": gather, "save_s": save_s, "restore_s": restore_s}


def gb(x: dict[str, Any]) -> str:
    """median (p99, max) in ms"""
    return f"{x['median'] * 1e3:.2f} ms (p99 {x['p99'] * 1e3:.2f}, max {x['max'] * 1e3:.2f})"


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    """Section 14: the metadata of a 70B-class checkpoint at 1,024 ranks, restored at 512."""
    m, s, v2, fine = r["model"], r["save"], r["v2"], r["fine_blocks"]
    p = r["restore"][0]
    total, ranks = s["total_bytes"], s["ranks"]
    floor = total / (r["floor_gbps"] * 1e9)
    pp = paper(r)
    v2_fine = fine["blocks"] * v2["bytes_per_entry"]
    groups = ", ".join(f"{g} {d}" for g, d in m["groups"].items())
    out = [
        f"The real tensor names and shapes of a Llama-3-70B-class transformer (hidden {m['hidden']}, {m['layers']} "
        f"layers, {m['heads']} heads / {m['kv_heads']} KV heads (k/v proj {m['hidden'] // m['heads'] * m['kv_heads']}×{m['hidden']}), "
        f"intermediate {m['intermediate']}, vocabulary {m['vocab']:,}, RMSNorm weights, untied embedding and `lm_head`, HF "
        f"names such as `model.layers.N.self_attn.q_proj.weight`): **{m['params']:,} parameters**, each stored in "
        f"{len(m['groups'])} groups ({groups}) = **{m['bytes_per_param']} bytes a parameter, {total:,} bytes "
        f"({total / 1e12:.2f} TB, {total / 2**40:.2f} TiB)**, {m['tensors']:,} logical tensors, cut into **64 MiB blocks: "
        f"{s['blocks']:,} blocks**. (A 70B model does not reach the issue's 2 TB honestly: this is the largest "
        "composition we would defend — gradients included, as for a save mid-accumulation; without them it is 14 B a "
        f"parameter, 0.99 TB. At 2 TB the per-rank indexes would grow by the ratio of blocks, ×{2e12 / total:.2f}; the root, "
        "O(ranks + tensors), would not.)",
        "",
        f"{ranks:,} simulated ranks each write their contiguous byte-balanced share of the blocks (`zero_rank`: shards declared, "
        "every block's real BLAKE3 checksum of zeros, the rank's index object written) into one `SparseStore` (metadata "
        "objects kept whole, shard files as sizes); the coordinator commits the root (`commit_indexed`, every check "
        f"included); then each of {p['world']} new ranks plans its restore: the root read and checked "
        "(`read_manifest(..., expand_index=False)`), then `expand` over the blocks of its new slice, which reads and "
        "checks only the rank indexes covering it (reads counted by the store). The ranks run one after another in one "
        "process here; on a cluster they run in parallel, so a rank's time is what the cluster waits for. Memory: the "
        "peak bytes Python allocates during the call (tracemalloc); while timing, the simulated store's objects (every "
        "rank's metadata, which one rank's process would not hold) are frozen out of the garbage collector's scans. Beside it, the format-v2 manifest of the same "
        "checkpoint (every block entry listed in the one manifest), really committed by `commit_manifest` and read back.",
        "",
        "| | format v3 (measured) | format v2, the same checkpoint |",
        "|---|---|---|",
        f"| root / manifest bytes | **{s['root_bytes']:,}** ({s['root_bytes'] / MiB:.2f} MiB, as written; of which parts {s['root_parts_bytes']:,}) | {v2['bytes']:,} ({v2['bytes'] / MiB:.2f} MiB, {v2['entries']:,} entries, {v2['bytes_per_entry']:.0f} B each) |",
        f"| per-rank index bytes (median / max) | {s['index_bytes']['median']:,.0f} / {s['index_bytes']['max']:,} ({s['index_entries']['median']:.0f} / {s['index_entries']['max']} entries) | – |",
        f"| metadata written in all | {s['metadata_written']:,} B (indexes {s['index_bytes']['total']:,} + root + latest pointer) | {v2['bytes']:,} B + the latest pointer |",
        f"| planning the shares (every rank, the same answer) | {s['plan_shares_s'] * 1e3:.0f} ms for {s['blocks']:,} blocks | the same |",
        f"| one rank: its share's entries + index written (`zero_rank`) | {gb(s['rank_write'])}; the max is the first BLAKE3 of a zero block | – |",
        f"| refs all-gathered to the coordinator | {s['gathered_bytes']:,} B ({s['gathered_bytes'] / ranks:.0f} B a rank) | – (v2: every rank's full entry list) |",
        f"| commit (`commit_indexed`, incl. checks; `check_index_refs` alone) | {s['commit_s'] * 1e3:.0f} ms ({s['check_refs_s'] * 1e3:.0f} ms) | – |",
        f"| root read + checked (once a rank) | {spread(p['root_read'], 'ms', 1e3, 1)}; {p['root_read_peak_alloc'] / MiB:.1f} MiB allocated at peak | {spread(v2['read'], 'ms', 1e3, 0)} (every entry checked); {v2['read_peak_alloc'] / MiB:.0f} MiB at peak |",
        f"| restore plan of one new rank (`expand`, {p['ranks_planned']} of {p['world']} ranks) | {gb(p['plan'])}; {p['plan_peak_alloc'] / 1e3:.0f} KB allocated at peak | nothing more (the whole manifest is already read, by every rank) |",
        f"| rank indexes read by one new rank | {', '.join(f'{k} ({n} ranks)' for k, n in p['index_reads'].items())} of {ranks:,} | 1 manifest of {v2['bytes'] / MiB:.1f} MiB |",
    ]
    for q in r["restore"][1:]:
        out.append(
            f"| … restored at {q['world']} instead | plan {gb(q['plan'])}; index reads {', '.join(f'{k} ({n} ranks)' for k, n in q['index_reads'].items())} | |"
        )
    fr = fine["restore"]
    out += [
        f"| **1 MiB blocks** ({fine['blocks']:,} blocks) | root {fine['root_bytes']:,} B; index median {fine['index_bytes']['median']:,.0f} B / max {fine['index_bytes']['max']:,} ({fine['index_entries']['median']:.0f} entries); a rank's `zero_rank` {gb(fine['rank_write'])}; commit {fine['commit_s'] * 1e3:.0f} ms; restore plan ({fr['ranks_planned']} of {fr['world']} new ranks) {gb(fr['plan'])}, {fr['plan_peak_alloc'] / MiB:.1f} MiB at peak, {', '.join(f'{k} index reads' for k in fr['index_reads'])} | ≈ {v2_fine / 1e6:,.0f} MB estimated ({fine['blocks']:,} × {v2['bytes_per_entry']:.0f} B): past the 16 MiB manifest cap and the 65,536-entry cap — not committable |",
        "",
        f"**Beside the floor.** Moving {total / 1e12:.2f} TB at the seed's 20 GB/s takes **{floor:.1f} s** (the seed's 2 TB: 100 s). "
        "What coordination adds on top, on paper for a 1,024-rank cluster (assumptions: "
        f"{PAPER['rtt_s'] * 1e3:.0f} ms a request to an S3-class store, {PAPER['store_gbps']:.0f} GB/s for one metadata object, "
        f"{PAPER['net_gbps']:.0f} GB/s links and {PAPER['hop_s'] * 1e6:.0f} µs a collective step; CPU times as measured here):",
        "",
        "| phase | on paper (1,024 ranks in parallel) | measured in the simulation |",
        "|---|---|---|",
        f"| every rank writes its index: 1 PUT of ≤ {_mb(s['index_bytes']['max'])}, in parallel | one request, ~{PAPER['rtt_s'] * 1e3:.0f} ms | {s['rank_write']['p99'] * 1e3:.2f} ms p99 CPU a rank |",
        f"| all-gather of the refs ({_mb(s['gathered_bytes'])}) | {pp['gather_s'] * 1e3:.2f} ms | (one process: no network) |",
        f"| coordinator: checks, one conditional PUT of {_mb(s['root_bytes'])}, read back, latest pointer | 3 requests + {s['commit_s'] * 1e3:.0f} ms CPU | {s['commit_s'] * 1e3:.0f} ms |",
        f"| **save: on top of the floor** | **≈ {pp['save_s']:.2f} s ({pp['save_s'] / floor:.2%} of {floor:.1f} s)** | {(s['rank_write']['p99'] + s['commit_s']) * 1e3:.0f} ms (a p99 rank + commit) |",
        f"| restore: every new rank GETs and checks the root, then GETs its {p['index_reads_max']} indexes | 2 requests + {(p['root_read']['median'] + p['plan']['p99']) * 1e3:.0f} ms CPU | {(p['root_read']['median'] + p['plan']['p99']) * 1e3:.0f} ms (root + a p99 plan) |",
        f"| **restore: on top of the floor** | **≈ {pp['restore_s']:.2f} s ({pp['restore_s'] / floor:.2%})** | |",
        f"| for comparison, v2: every rank reads and checks the whole manifest | 1 GET of {_mb(v2['bytes'])} + {v2['read']['median'] * 1e3:.0f} ms CPU, {v2['read_peak_alloc'] / MiB:.0f} MiB a rank | {v2['read']['median'] * 1e3:.0f} ms |",
        "",
        "The root grows with the ranks (and the tensors), not with the blocks: "
        + ", ".join(f"{int(w):,} ranks {x['root_bytes'] / MiB:.2f} MiB" for w, x in r["sweep"].items())
        + f" at 64 MiB blocks; {fine['root_bytes'] / MiB:.2f} MiB at 1 MiB blocks (64× the blocks). "
        + (
            "The root is written compact (no indentation). "
            if s["root_compact_bytes"] == s["root_bytes"]
            else f"The root is written indented: {1 - s['root_compact_bytes'] / s['root_bytes']:.0%} of its bytes are "
            "whitespace. "
        )
        + f"Bench wall time: {r['bench_seconds']:.0f} s.",
    ]
    ok = s["root_bytes"] <= ROOT_TARGET
    targets.add(
        "root manifest of a 1,024-rank, 70B-class checkpoint ≤ 1 MiB (issue 24)",
        f"{s['root_bytes'] / MiB:.2f} MiB, as written",
        ok,
        f"{ranks:,} ranks, {s['blocks']:,} blocks of 64 MiB, {m['tensors']:,} tensors; v2 would be {v2['bytes'] / MiB:.1f} MiB",
    )
    targets.add(
        "a restore at 512 reads only the rank indexes covering its slice (issue 24)",
        f"{p['index_reads_max']} of {ranks:,} indexes a rank, {p['plan']['median'] * 1e3:.1f} ms median",
        p["index_reads_max"] <= 3,
        f"+ the root, {p['root_read']['median'] * 1e3:.0f} ms; v2: {v2['read']['median'] * 1e3:.0f} ms and {v2['read_peak_alloc'] / MiB:.0f} MiB a rank",
    )
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``metadata.png``: root manifest bytes and per-rank index bytes by rank count, v3 vs v2."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = r["sweep"]
    ranks = [int(w) for w in sweep]
    fine = r["fine_blocks"]
    v2 = r["v2"]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    a.plot(ranks, [sweep[str(w)]["root_bytes"] / MiB for w in ranks], marker="o", label="v3 root (as written)")
    a.plot(
        ranks,
        [sweep[str(w)]["root_compact_bytes"] / MiB for w in ranks],
        marker=".",
        ls=":",
        label="v3 root, no indentation",
    )
    a.axhline(v2["bytes"] / MiB, color="C3", label=f"v2 manifest, 64 MiB blocks ({v2['entries']:,} entries)")
    a.axhline(
        fine["blocks"] * v2["bytes_per_entry"] / MiB, color="C3", ls="--", label="v2 manifest, 1 MiB blocks (estimate)"
    )
    a.scatter(
        [fine["ranks"]], [fine["root_bytes"] / MiB], marker="x", color="C0", zorder=3, label="v3 root, 1 MiB blocks"
    )
    a.axhline(ROOT_TARGET / MiB, color="grey", ls="-.", lw=1, label="target: 1 MiB")
    a.set_xscale("log", base=2)
    a.set_yscale("log")
    a.set_xticks(ranks, [str(w) for w in ranks])
    a.set_xlabel("ranks that wrote the checkpoint")
    a.set_ylabel("MiB")
    a.set_title(f"root manifest, 70B-class ({r['save']['total_bytes'] / 1e12:.2f} TB)")
    a.set_ylim(0.3, 1e6)  # headroom for the legend
    a.legend(fontsize=7, loc="upper center", ncol=2)
    b.plot(ranks, [sweep[str(w)]["index_bytes_median"] / 1e3 for w in ranks], marker="o", label="64 MiB blocks")
    b.scatter(
        [fine["ranks"]], [fine["index_bytes"]["median"] / 1e3], marker="x", color="C1", zorder=3, label="1 MiB blocks"
    )
    b.set_xscale("log", base=2)
    b.set_yscale("log")
    b.set_xticks(ranks, [str(w) for w in ranks])
    b.set_xlabel("ranks")
    b.set_ylabel("KB (median)")
    b.set_title("one rank's index object")
    b.legend(fontsize=7)
    fig.tight_layout()
    path = folder / "metadata.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]
