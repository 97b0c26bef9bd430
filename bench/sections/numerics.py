"""Section 8 of ``BENCHMARKS.md`` (the cost of pinning a numerics profile; no plot), from the
results of ``bench.suites.numerics``: each profile against native (no target)."""

from __future__ import annotations

from typing import Any

from bench.sections import Targets


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    lines = [
        f"`cairn train` in a fresh process per rep, the profiles interleaved rep by rep, on this "
        f"{r['native_level']} machine; the command's own training time (initialise, updates, commits), median "
        "and ratio to `native` (no pins) in the same run. A profile above the machine's level cannot run here.",
        "",
        "| model | steps | profile | median s | min-max s | vs native |",
        "|---|---|---|---|---|---|",
    ]
    for model, m in r["models"].items():
        for profile, st in m["profiles"].items():
            lines.append(
                f"| {model} | {m['steps']} | `{profile}` | {st['median']:.3f} | {st['min']:.3f}-{st['max']:.3f} | "
                f"{st['ratio_to_native']:.2f}x |"
            )
    lines += [
        "",
        "`x86-64-v3` is the default: on an AVX2 machine it is the machine's own dispatch (numpy's AVX2 loops, "
        "OpenBLAS's Haswell kernel), so it costs what one BLAS thread instead of all cores costs; on an AVX-512 "
        "machine it gives up the AVX-512 loops in exchange for bits that every AVX2 machine reproduces. "
        "`x86-64-v2` gives up AVX2 and FMA as well.",
        "",
    ]
    return lines
