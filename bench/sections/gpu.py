# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 12 of ``BENCHMARKS.md`` (checkpoints from GPU memory; no plot: the table says it),
from the results of ``bench.suites.gpu``: save and restore next to torch.save and DCP."""

from __future__ import annotations

from typing import Any

from bench.sections import Targets, spread


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    mach, gb = r["machine"], r["bytes"] / 1e9
    out = [
        f"Measured on {mach['gpu']} (CUDA {mach['cuda']}), {mach['cpu']}, {r['measured_at']}: a {gb:.2f} GB state "
        "(float32 parameters and AdamW moments) on the GPU; saves to local disk (fsync'd), restores onto the GPU "
        f"from the device. Median (min–max) of {r['reps']} interleaved reps; ratio = peer / Cairn. Staging alone "
        f"(device -> reused pinned host buffers): {r['staging_seconds']:.3f} s, {gb / r['staging_seconds']:.1f} GB/s.",
        "",
        "| op | Cairn | torch.save | DCP | torch.save / Cairn | DCP / Cairn |",
        "|---|---|---|---|---|---|",
    ]
    for op in ("save", "restore"):
        x = r[op]
        c = x["cairn"]["median"]
        out.append(
            f"| {op} | {spread(x['cairn'])} | {spread(x['torch.save'])} | {spread(x['dcp'])} | "
            f"{x['torch.save']['median'] / c:.2f}× | {x['dcp']['median'] / c:.2f}× |"
        )
    return [*out, ""]
