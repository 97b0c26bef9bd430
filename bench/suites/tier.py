# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""A fast local tier in front of S3: how long a checkpoint blocks the trainer, and how fast the
same host restores.

1. Blocked time per checkpoint, interleaved rep by rep (64 and 256 MiB states): a synchronous
   ``save_training`` to SeaweedFS S3 (the trainer waits for the durable commit) vs the same
   save through the node-local tier (``cairn.checkpoint.tier``), sync mode (the trainer waits
   for the local commit: every byte written and fsynced on local disk) and async mode
   (``AsyncCheckpointer`` over the tier: the trainer waits for the snapshot copy). The upload
   to S3 runs in the background and is awaited, untimed, before the next case.
2. Restore on the same host, page cache dropped before every rep: the verified restore from
   the local tier (``load_training``: every block checksum) vs the local-disk floor (the same
   bytes read raw from one file) vs the verified restore from S3, interleaved.
Rendered by ``bench.sections.tier``. Run: ``python -m bench.suites.tier [--reps 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from bench.harness.floor import floor_read_file, floor_write_file
from bench.harness.machine import machine
from bench.harness.measure import drop_cache, interleaved, stats
from bench.harness.results import write_result
from bench.harness.servers import seaweedfs
from bench.harness.states import UNSIGNED, big_state, state_arrays, state_bytes
from cairn.checkpoint import CheckpointKind, CheckpointRef
from cairn.checkpoint.tier import NodeTier
from cairn.stores.s3 import S3Store
from cairn.training import AsyncCheckpointer, SaveHandle, load_training, save_training

SAVE_S3, SAVE_TIER, SAVE_ASYNC = (
    "sync save to S3",
    "local tier, sync mode (local commit)",
    "local tier, async mode (snapshot)",
)
RESTORE_TIER, RESTORE_FLOOR, RESTORE_S3 = "local tier (verified)", "local-disk floor (raw read)", "S3 (verified)"


def bench_size(mib: int, reps: int, workdir: Path, s3: S3Store, weed: Path) -> dict[str, Any]:
    state = big_state(mib)
    nbytes = state_bytes(state)
    node = NodeTier(workdir / f"tier-{mib}", 64 << 30)
    tiered = node.tiered(s3.url, s3)
    saver = AsyncCheckpointer(tiered, "async", options=UNSIGNED)
    pending: list[SaveHandle] = []
    count = iter(range(10**6))
    uploads: list[float] = []

    def settle(_name: str) -> None:  # untimed: the background work of the case before
        for handle in pending:
            handle.result()
        pending.clear()
        before = node.stats.upload_seconds, node.stats.uploaded_checkpoints
        assert node.flush_all(600), "uploads did not finish"
        if node.stats.uploaded_checkpoints > before[1]:
            uploads.append(node.stats.upload_seconds - before[0])
        os.sync()

    def save_async() -> None:
        saver.run_id = f"async-{mib}-{next(count)}"
        pending.append(saver.save_async(state))

    def save_tier() -> None:
        run = f"tier-{mib}-{next(count)}"
        save_training(tiered.save_target(run, nbytes), run, state, options=UNSIGNED)

    save_async()  # the first async save allocates its snapshot buffer: not part of the reps
    settle("")
    saves = interleaved(
        {
            SAVE_S3: lambda: save_training(s3, f"s3-{mib}-{next(count)}", state, options=UNSIGNED),
            SAVE_TIER: save_tier,
            SAVE_ASYNC: save_async,
        },
        reps,
        before=settle,
    )
    settle("")
    saver.close()
    save_training(tiered, f"restore-{mib}", state, options=UNSIGNED)
    settle("")
    floor = workdir / f"floor-{mib}.bin"
    floor_write_file(state_arrays(state), floor)
    local_ref = CheckpointRef(tiered.url, f"restore-{mib}", CheckpointKind.TRAINING, state.step)
    s3_ref = CheckpointRef(s3.url, f"restore-{mib}", CheckpointKind.TRAINING, state.step)

    def cold(_name: str) -> None:
        for root in (node.root, floor.parent, weed):
            drop_cache(root)

    restores = interleaved(
        {
            RESTORE_TIER: lambda: load_training(tiered, local_ref, options=UNSIGNED),
            RESTORE_FLOOR: lambda: floor_read_file(floor, floor.stat().st_size),
            RESTORE_S3: lambda: load_training(s3, s3_ref, options=UNSIGNED),
        },
        reps,
        before=cold,
    )
    node.close()
    save = {name: stats(t) for name, t in saves.items()}
    restore = {name: stats(t) for name, t in restores.items()}
    s3_save = save[SAVE_S3]["median"]
    return {
        "bytes": nbytes,
        "save": save,
        "restore": restore,
        "upload_seconds": stats(uploads) if uploads else None,
        "blocked_fraction": {name: save[name]["median"] / s3_save for name in (SAVE_TIER, SAVE_ASYNC)},
        "restore_vs_floor": restore[RESTORE_FLOOR]["median"] / restore[RESTORE_TIER]["median"],
        "restore_speedup_vs_s3": restore[RESTORE_S3]["median"] / restore[RESTORE_TIER]["median"],
        "fallbacks": node.stats.fallbacks,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="64,256", help="state sizes in MiB")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="8 and 16 MiB, 2 reps: a smoke run")
    args = parser.parse_args()
    sizes = [8, 16] if args.quick else [int(s) for s in args.sizes.split(",")]
    reps = 2 if args.quick else args.reps
    results = []
    with tempfile.TemporaryDirectory(prefix="cairn-bench-tier-") as tmp, seaweedfs(Path(tmp)) as endpoint:
        s3 = S3Store(f"bench-{uuid.uuid4().hex[:6]}", "cairn", endpoint_url=endpoint)
        s3.ensure_bucket()
        for mib in sizes:
            size = bench_size(mib, reps, Path(tmp), s3, Path(tmp) / "weed")
            results.append(size)
            for name, s in {**size["save"], **size["restore"]}.items():
                print(
                    f"{mib:4d} MiB  {name:<40} {s['median'] * 1e3:9.1f} ms  (min {s['min'] * 1e3:.1f}, max {s['max'] * 1e3:.1f})"
                )
            print(
                f"{mib:4d} MiB  blocked / S3 sync: "
                + ", ".join(f"{k} {v:.1%}" for k, v in size["blocked_fraction"].items())
                + f"; restore vs floor {size['restore_vs_floor']:.2f}x, vs S3 {size['restore_speedup_vs_s3']:.1f}x faster",
                flush=True,
            )
    m = machine()
    write_result("tier", {"machine": m, "reps": reps, "tier_disk": m["disk"], "sizes": results}, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
