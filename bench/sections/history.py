"""Section 13 of ``BENCHMARKS.md`` (history per save at a million steps; no plot: the table says
it all), from the results of ``bench.suites.history``: bytes and save/load time, before and after."""

from __future__ import annotations

from typing import Any

from bench.sections import Targets, spread
from bench.suites.history import CASES


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    n = r["steps"]
    cases = r["cases"]
    out = [
        f"The example model's state at step {n:,} with its full loss/lr history ({16 * n:,} bytes), saved to "
        f"local disk in one process; {r['reps']} interleaved reps. Before: the history as `history/KEY` tensors "
        "in every checkpoint. After: run-level history segments (`cairn.checkpoint.history`) — aligned blocks "
        "written once when complete, a short tail every save — in the steady state of a run saving every "
        f"1,000 steps (the save at {n - 1000:,} untimed, just before), and as the first save of a process "
        f"that knew no segment. The checkpoint references {sum(r['segments'].values())} segments "
        f"({', '.join(f'{k}: {v}' for k, v in r['segments'].items())}).",
        "",
        "The steady-state save writes its 1,000 new entries per key and what completed with them (here a block "
        "of 4,096 and two of 256: near the most any save between chunk boundaries writes). Its time is still "
        "linear in the step on the CPU: reading each key's Python list into an array (about 15 ms per million "
        "entries) is what verifying by value that the reused blocks hold the values in memory costs; the bytes "
        "are not. A load reads every segment (concurrently) and checks each checksum and each key's digest.",
        "",
        "| save at step N | history bytes written | other bytes (tensors, manifest) | save | load |",
        "|---|---|---|---|---|",
    ]
    for name, x in cases.items():
        load = spread(x["load"], "ms", 1e3, 1) if "load" in x else "—"
        out.append(
            f"| {name} | {x['history_bytes']:,} | {x['other_bytes']:,} | {spread(x['save'], 'ms', 1e3, 1)} | {load} |"
        )
    steady, old = cases[CASES[1]], cases[CASES[0]]
    targets.add(
        "a save at 1,000,000 steps writes O(new steps) of history",
        f"{steady['history_bytes']:,} B (was {old['history_bytes']:,} B)",
        steady["history_bytes"] <= 16 * (1000 + 4096 + 256),
        "the 1,000 new entries per key plus the blocks that completed with them (at most 4,096 + 256 entries)",
    )
    return out + [""]
