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
``section`` renders section 18 of ``BENCHMARKS.md``. Run: ``python bench/bench_tier.py [--reps 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_store import floor_read_file, floor_write_file  # noqa: E402
from common import (  # noqa: E402
    UNSIGNED,
    MiB,
    big_state,
    drop_cache,
    interleaved,
    machine,
    seaweedfs,
    state_arrays,
    state_bytes,
    stats,
    write_result,
)
from render import Targets, spread  # noqa: E402

from cairn.checkpoint import CheckpointKind, CheckpointRef, load_training, save_training  # noqa: E402
from cairn.checkpoint.async_save import AsyncCheckpointer, SaveHandle  # noqa: E402
from cairn.checkpoint.tier import NodeTier  # noqa: E402
from cairn.stores.s3 import S3Store  # noqa: E402

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


# -- section 18 of BENCHMARKS.md --------------------------------------------------------------------


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    """Section 18: blocked time and same-host restore, per state size; the tier's targets."""
    out = [
        "## 18. A fast local tier in front of S3",
        "",
        f"The node-local tier on local disk ({r['tier_disk']}) in front of SeaweedFS S3 on loopback; {r['reps']} "
        "interleaved reps per case, medians (min–max). *Blocked*: what the trainer waits for per checkpoint — a "
        "synchronous save to S3 (the durable commit), the tier in sync mode (the local commit: every byte written "
        "and fsynced), the tier in async mode (the snapshot copy; the local commit follows in the background). "
        "The upload to S3 runs in the background (objects, then the manifest) and is awaited untimed before the "
        "next case. *Restore*: page cache dropped before every rep; the tier's restore verifies every block "
        "checksum, the floor reads the same bytes raw from one file.",
        "",
        "| state | case | trainer blocked | / S3 sync save |",
        "|---|---|---|---|",
    ]
    for size in r["sizes"]:
        for name, x in size["save"].items():
            frac = size["blocked_fraction"].get(name)
            out.append(
                f"| {size['bytes'] / MiB:.0f} MiB | {name} | {spread(x, 'ms', 1e3, 1)} | {'-' if frac is None else f'{frac:.1%}'} |"
            )
    out += ["", "| state | restore from | seconds | vs the tier |", "|---|---|---|---|"]
    for size in r["sizes"]:
        tier = size["restore"][RESTORE_TIER]["median"]
        for name, x in size["restore"].items():
            out.append(f"| {size['bytes'] / MiB:.0f} MiB | {name} | {spread(x)} | {x['median'] / tier:.2f}× |")
    out.append("")
    for size in r["sizes"]:
        up = size["upload_seconds"]
        out.append(
            f"- {size['bytes'] / MiB:.0f} MiB: background upload {spread(up) if up else '-'} per checkpoint; "
            f"same-host restore at {size['restore_vs_floor']:.2f}× the local-disk floor's speed, "
            f"{size['restore_speedup_vs_s3']:.1f}× faster than from S3."
        )
    big = max(r["sizes"], key=lambda s: s["bytes"])
    sync_frac, async_frac = big["blocked_fraction"][SAVE_TIER], big["blocked_fraction"][SAVE_ASYNC]
    worst_floor = min(s["restore_vs_floor"] for s in r["sizes"])
    targets.add(
        "trainer blocked with the local tier ≤ 5% of a sync S3 save",
        f"async {async_frac:.1%}, sync {sync_frac:.1%} ({big['bytes'] / MiB:.0f} MiB)",
        async_frac <= 0.05,
        "async: a memory copy; sync mode pays local-disk bandwidth (fsync), which on this machine's one "
        "virtual disk is not far from a loopback S3 server on the same disk",
    )
    targets.add(
        "same-host restore from the local tier ≥ 0.9× the local-disk floor",
        f"{worst_floor:.2f}×",
        worst_floor >= 0.9,
        "the full validated import (every block checksum, finiteness, invariants) vs a raw read, on 2 cores: the "
        "same code path as any local-disk restore (section 1)",
    )
    return out + [""]


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """Section 18 has no plot."""
    return []


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
