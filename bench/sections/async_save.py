# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Section 3 of ``BENCHMARKS.md`` (async save; no plot), from the results of
``bench.suites.async_save``: blocked time and step-time overhead; the blocked-time and RSS targets."""

from __future__ import annotations

from typing import Any

from bench.harness.measure import MiB
from bench.sections import Targets, spread


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    b, loop = r["blocked"], r["loop"]
    state = b["bytes"]
    out = [
        f"Blocked time per checkpoint ({state / MiB:.0f} MiB state, local disk, {r['reps']} interleaved reps): a sync "
        "`save_training` blocks the trainer for the whole save; `AsyncCheckpointer.save_async` blocks it for the "
        "snapshot copy only (the background save is awaited, untimed, before the next case). The third row is "
        "the snapshot as it was taken before this round's fix (`TrainState.copy()`: fresh allocations, one "
        "thread).",
        "",
        "| case | trainer blocked |",
        "|---|---|",
    ]
    for name, x in b["cases"].items():
        out.append(f"| {name} | {spread(x, 'ms', 1e3, 1)} |")
    rss = b["peak_extra_rss"]
    out += [
        "",
        f"Blocked / sync save: **{b['blocked_fraction']:.1%}** (before the fix {b['blocked_fraction_before_fix']:.1%}); "
        f"the first async save of a checkpointer also allocates its snapshot buffer: {b['first_async_call_s'] * 1e3:.0f} ms. "
        f"Peak extra RSS: sync {rss['sync'] / MiB:.0f} MiB ({rss['sync'] / state:.2f}× state), async "
        f"{rss['async'] / MiB:.0f} MiB ({rss['async'] / state:.2f}× state: the snapshot buffer).",
        "",
        f"Step-time overhead: `TrainingSession.run` of {loop['steps']} steps of a {loop['bytes'] / MiB:.0f} MiB model "
        f"(batch 32), a checkpoint every {loop['every']} steps, {r['reps']} interleaved reps:",
        "",
        "| checkpoints | wall time | per step | overhead vs none |",
        "|---|---|---|---|",
    ]
    for mode, x in loop["cases"].items():
        out.append(
            f"| {mode} | {spread(x)} | {loop['seconds_per_step'][mode] * 1e3:.1f} ms | {loop['overhead'][mode]:+.1%} |"
        )
    targets.add(
        "async blocked time ≤ 5% of a sync save",
        f"{b['blocked_fraction']:.1%} (was {b['blocked_fraction_before_fix']:.1%})",
        b["blocked_fraction"] <= 0.05,
        "a memory copy of the state vs a save at disk bandwidth: the ratio is memory bandwidth / disk "
        "bandwidth on this machine (see 'where the time goes')",
    )
    targets.add(
        "peak extra RSS ≤ 1× the state for async",
        f"{rss['async'] / state:.2f}×",
        rss["async"] <= 1.05 * state,
        "one snapshot buffer per save in flight (1 by default), reused",
    )
    targets.add(
        "peak extra RSS near zero for sync",
        f"{rss['sync'] / MiB:.0f} MiB ({rss['sync'] / state:.2f}×)",
        rss["sync"] <= 0.05 * state,
        "zero-copy byte views streamed to the store",
    )
    return out + [""]
