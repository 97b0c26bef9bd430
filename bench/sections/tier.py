# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 18 of ``BENCHMARKS.md`` (a fast local tier in front of S3; no plot), from the results
of ``bench.suites.tier``: blocked time and same-host restore per state size; the tier's targets."""

from __future__ import annotations

from typing import Any

from bench.harness.measure import MiB
from bench.sections import Targets, spread
from bench.suites.tier import RESTORE_TIER, SAVE_ASYNC, SAVE_TIER


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    out = [
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
