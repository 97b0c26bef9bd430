# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Distributed checkpoints and the canonical reduction at W = 1, 2, 4 ranks, side by side.

W real rank processes (``torch.multiprocessing``, spawned; gloo over loopback, as
``cairn.distributed.comm.init_torch_comm`` joins it) hold a large MLP training state ZeRO-1
sharded by ``cairn.trainers.mlp.zero.ZeroMLP``: every rank owns the block-aligned slice
``flat_layout(...).slices(W)[rank]`` of theta, Adam's m and v (random, non-trivial moments).
One gang per W; within it every case is timed on rank 0 between two barriers (all ranks start
together; the time ends when the last rank is done), the cases interleaved rep by rep:

Saves (every save made durable, into fresh files) and restores (from the device: every file's
pages evicted first), on local disk in a temp dir:
- ``cairn``: ``ZeroMLP.save`` — finiteness agreed, then ``coordinated_save``: every rank writes
  its own blocks as its own shard files (BLAKE3 of every byte, fsync), an all-gather barrier,
  rank 0 commits one manifest. Restore: ``read_manifest`` + the metadata check, then
  ``read_blocks`` of the rank's own blocks of theta, m and v into fresh buffers (ranged reads,
  every block checksummed and value-checked), the outcome agreed by all ranks.
- ``dcp``: ``torch.distributed.checkpoint.save`` / ``load`` (``FileSystemWriter`` /
  ``FileSystemReader``, their defaults: one file per rank, fsync) of the same slices as three
  ``ShardedTensor``s (``theta``, ``adam.m``, ``adam.v``) of the whole flat length, each rank's
  local shard at its slice's offset (uneven, block-aligned shards); the load fills freshly
  allocated shards (built inside the timed load, as DCP requires targets).
- ``floor``: the same bytes by one writer, as ``bench.suites.store`` measures it: rank 0 writes one
  file + fsync / reads it into one fresh buffer while the other ranks wait at the barrier.
- ``floor_parallel``: every rank writes its own slice's bytes to its own file + fsync / reads
  them back: plain I/O with the same concurrency as the sharded save.
Ratio = the other's seconds / Cairn's seconds (> 1: Cairn is faster).

Communication, per update, at W = 2 and 4 for a few gradient lengths (float64): the canonical
reduction as ``ZeroMLP.step`` does it (``SliceReducer``) — one all-to-all of the subtree sums'
slices, the top of the tree summed in place on the owned slice, the all-gather of the slices,
on buffers kept across updates — and the same collectives and arithmetic written directly on
``all_to_all_single`` (the same bits), vs one
``dist.all_reduce`` (SUM) of the same vector, nothing else. Ratio = canonical / all-reduce
(> 1: the canonical order costs more). Rank 0 also reports the split of the canonical paths.

This module is the driver (one gang per W, the results file); what every rank runs is in
``bench.harness.ranks``. Rendered by ``bench.sections.distributed``.

Run: ``python -m bench.suites.distributed [--mib 256] [--reps 5] [--worlds 1,2,4]
[--comm-sizes 1048576,16777216] [--comm-reps 7] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness.machine import machine
from bench.harness.measure import MiB, stats
from bench.harness.ranks import BLOCK_BYTES, SAVE_CASES, bench_config, rank_main
from bench.harness.results import write_result
from cairn.gang import free_port


def run_gang(world: int, job: dict[str, Any], tmp: Path) -> dict[str, Any]:
    import json

    import torch.multiprocessing as mp

    result_path = tmp / f"result-{world}.json"
    job = {**job, "workdir": str(tmp / f"w{world}")}
    Path(job["workdir"]).mkdir()
    mp.spawn(rank_main, args=(world, free_port(), job, str(result_path)), nprocs=world, join=True)
    doc: dict[str, Any] = json.loads(result_path.read_text())
    return doc


def report(world: int, r: dict[str, Any]) -> None:
    c = r.get("checkpoint")
    if c:
        for op in ("save", "restore"):
            x = c[op]
            ours = x["cairn"]["median"]
            print(
                f"W={world} {c['bytes'] / MiB:5.0f} MiB {op:<7} cairn {ours:6.3f}s {c['bytes'] / 1e6 / ours:5.0f} MB/s"
                + "".join(f"  {n} {x[n]['median']:6.3f}s ({x[n]['median'] / ours:.2f}x)" for n in SAVE_CASES[1:])
                + "  cpu s "
                + " ".join(f"{c['cpu_seconds'][op][n]:.2f}" for n in SAVE_CASES),
                flush=True,
            )
    for n, x in r.get("comm", {}).items():
        split = x["phases_rank0"]["canonical"]
        print(
            f"W={world} {int(n) * 8 / MiB:5.0f} MiB reduce: canonical {x['canonical']['median'] * 1e3:7.1f} ms"
            f"  reused buffers {x['canonical_reused']['median'] * 1e3:7.1f} ms"
            f"  all_reduce {x['all_reduce']['median'] * 1e3:7.1f} ms"
            f"  ratio {x['ratio']:.2f}x ({x['ratio_reused']:.2f}x)"
            + "  (rank 0: "
            + ", ".join(f"{p} {v['median'] * 1e3:.1f}" for p, v in split.items())
            + " ms)",
            flush=True,
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="theta + m + v, MiB")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--worlds", default="1,2,4")
    parser.add_argument("--comm-sizes", default=f"{1 << 20},{1 << 24}", help="gradient lengths (float64 elements)")
    parser.add_argument("--comm-reps", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="16 MiB, 3 reps, 64 Ki and 1 Mi elements: a smoke run")
    args = parser.parse_args()
    mib, reps = (16, 3) if args.quick else (args.mib, args.reps)
    comm_sizes = [1 << 16, 1 << 20] if args.quick else [int(n) for n in args.comm_sizes.split(",")]
    comm_reps = 5 if args.quick else args.comm_reps
    worlds = [int(w) for w in args.worlds.split(",")]
    job = {"mib": mib, "reps": reps, "comm_sizes": comm_sizes, "comm_reps": comm_reps}
    host = machine()
    started = time.monotonic()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-distributed-") as tmp:
        for world in worlds:
            t0 = time.monotonic()
            results[str(world)] = r = run_gang(world, job, Path(tmp))
            r["gang_seconds"] = time.monotonic() - t0
            report(world, r)
            print(f"W={world}: gang of {world} processes done in {r['gang_seconds']:.0f} s", flush=True)
    checkpoint = {w: r["checkpoint"] for w, r in results.items() if "checkpoint" in r}
    for c in checkpoint.values():
        for op in ("save", "restore"):
            ours = c[op]["cairn"]["median"]
            c[f"{op}_ratio"] = {n: c[op][n]["median"] / ours for n in SAVE_CASES[1:]}
            # per rep (the same rep: adjacent in time), as the store benchmark reports it
            c[f"{op}_ratio_per_rep"] = {
                n: stats([o / m for o, m in zip(c[op][n]["samples"], c[op]["cairn"]["samples"], strict=True)])
                for n in SAVE_CASES[1:]
            }
    write_result(
        "distributed",
        {
            "machine": host,
            "reps": reps,
            "comm_reps": comm_reps,
            "mib": mib,
            "block_bytes": BLOCK_BYTES,
            "hidden": bench_config(mib)["model"]["hidden"],
            "dcp_setup": (
                "torch.distributed.checkpoint save/load, FileSystemWriter/FileSystemReader defaults "
                "(single_file_per_rank, sync_files, 1 thread); three ShardedTensors (theta, adam.m, adam.v) "
                "of the whole flat length, each rank's local shard = its ZeRO-1 slice at its offset"
            ),
            "checkpoint": checkpoint,
            "comm": {w: r["comm"] for w, r in results.items() if "comm" in r},
            "gang_seconds": {w: r["gang_seconds"] for w, r in results.items()},
            "wall_seconds": time.monotonic() - started,
            "cores": os.cpu_count(),
        },
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
