# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Async save: how long the trainer is blocked per checkpoint, and what checkpoints cost a
training loop (none / sync / async, a checkpoint every K steps).

1. Blocked time, interleaved rep by rep on local disk: a sync ``save_training`` (the trainer
   waits for all of it) vs ``AsyncCheckpointer.save_async`` (the trainer waits for the snapshot
   copy only; the background save is then awaited untimed), next to ``TrainState.copy()`` (how
   the snapshot was taken before its buffers were reused). Peak extra RSS of each.
2. Step-time overhead: the same ``TrainingSession.run`` (N steps, a checkpoint every K steps)
   with no checkpoints, sync and async checkpoints; wall time per step and overhead vs none.
``section`` renders section 3 of ``BENCHMARKS.md`` from the results (it has no plot).
Run: ``python bench/bench_async.py [--mib 256] [--reps 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    UNSIGNED,
    MiB,
    big_state,
    interleaved,
    machine,
    measure_rss,
    state_bytes,
    stats,
    write_result,
)
from render import Targets, spread  # noqa: E402

from cairn.checkpoint import save_training  # noqa: E402
from cairn.checkpoint.async_save import AsyncCheckpointer  # noqa: E402
from cairn.config import TrainConfig  # noqa: E402
from cairn.session import TrainingSession  # noqa: E402
from cairn.stores import LocalStore  # noqa: E402


def blocked_time(mib: int, reps: int, workdir: Path) -> dict[str, Any]:
    state = big_state(mib)
    store = LocalStore(workdir / "blocked")
    saver = AsyncCheckpointer(store, "async", options=UNSIGNED)
    pending: list[Any] = []

    def clear(_name: str) -> None:
        for handle in pending:  # the background save finishes untimed, before the next case
            handle.result()
        pending.clear()
        store.delete([o.key for o in store.list("")])
        os.sync()

    def save_async() -> None:
        pending.append(saver.save_async(state))

    # the first async save allocates its snapshot buffer: measured apart, untimed in the reps
    clear("")
    gc.collect()
    import time

    start = time.perf_counter()
    save_async()
    first_call = time.perf_counter() - start
    clear("")
    times = interleaved(
        {
            "sync save (blocked = whole save)": lambda: save_training(store, "sync", state, options=UNSIGNED),
            "async save (blocked = snapshot)": save_async,
            "snapshot by TrainState.copy() (before the fix)": state.copy,
        },
        reps,
        before=clear,
    )
    clear("")
    saver.close()
    rss: dict[str, int] = {}
    rss["sync"] = measure_rss(lambda: save_training(store, "rss-sync", state, options=UNSIGNED))

    def async_once() -> None:
        fresh = AsyncCheckpointer(store, "rss-async", options=UNSIGNED)
        fresh.save_async(state)
        fresh.close()

    rss["async"] = measure_rss(async_once)
    sync_med = stats(times["sync save (blocked = whole save)"])["median"]
    return {
        "bytes": state_bytes(state),
        "first_async_call_s": first_call,
        "cases": {name: stats(t) for name, t in times.items()},
        "blocked_fraction": stats(times["async save (blocked = snapshot)"])["median"] / sync_med,
        "blocked_fraction_before_fix": stats(times["snapshot by TrainState.copy() (before the fix)"])["median"]
        / sync_med,
        "peak_extra_rss": rss,
    }


def step_overhead(mib: int, steps: int, every: int, reps: int, workdir: Path) -> dict[str, Any]:
    features, classes = 1024, 8
    hidden = max(1, int(mib * (1 << 20) / 8 / 3 / (features + classes + 1)))
    config = TrainConfig.model_validate(
        {
            "batch_size": 32,
            "model": {"hidden": hidden},
            "data": {"n_examples": 512, "n_features": features, "n_classes": classes},
        }
    )
    store = LocalStore(workdir / "loop")
    base = TrainingSession.fresh("loop", store, config, options=UNSIGNED)

    def loop(mode: str) -> None:
        session = TrainingSession("loop-" + mode, store, base.state.copy(), base.trainer, options=UNSIGNED)
        session.run(
            steps,
            checkpoint_every=None if mode == "none" else every,
            async_save=mode == "async",
            checkpoint_at_end=False,
        )

    def clear(_name: str) -> None:
        store.delete([o.key for o in store.list("")])
        os.sync()

    times = interleaved({m: (lambda m=m: loop(m)) for m in ("none", "sync", "async")}, reps, before=clear)  # type: ignore[misc]
    clear("")
    none = stats(times["none"])["median"]
    return {
        "bytes": state_bytes(base.state),
        "steps": steps,
        "every": every,
        "checkpoints_per_run": steps // every,
        "cases": {m: stats(t) for m, t in times.items()},
        "seconds_per_step": {m: stats(t)["median"] / steps for m, t in times.items()},
        "overhead": {m: stats(t)["median"] / none - 1 for m, t in times.items()},
    }


# -- section 3 of BENCHMARKS.md -------------------------------------------------------------------


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    """Section 3: blocked time and step-time overhead; the blocked-time and RSS targets."""
    b, loop = r["blocked"], r["loop"]
    state = b["bytes"]
    out = [
        "## 3. Async save",
        "",
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


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """Section 3 has no plot."""
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256, help="state size for the blocked-time part")
    parser.add_argument("--loop-mib", type=int, default=64, help="state size of the training loop")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="16 MiB / 8 MiB, 3 reps: a smoke run")
    args = parser.parse_args()
    if args.quick:
        args.mib, args.loop_mib, args.reps, args.steps = 16, 8, 3, 20
    with tempfile.TemporaryDirectory(prefix="cairn-bench-async-") as tmp:
        blocked = blocked_time(args.mib, args.reps, Path(tmp))
        for name, s in blocked["cases"].items():
            print(f"{name:<48} {s['median'] * 1e3:8.1f} ms  (min {s['min'] * 1e3:.1f}, max {s['max'] * 1e3:.1f})")
        print(
            f"blocked / sync save: {blocked['blocked_fraction']:.1%} (before the fix "
            f"{blocked['blocked_fraction_before_fix']:.1%}); first async call {blocked['first_async_call_s']:.3f}s; "
            f"peak extra RSS sync {blocked['peak_extra_rss']['sync'] / 2**20:.0f} MiB, "
            f"async {blocked['peak_extra_rss']['async'] / 2**20:.0f} MiB of {blocked['bytes'] / 2**20:.0f} MiB",
            flush=True,
        )
        loop = step_overhead(args.loop_mib, args.steps, args.every, args.reps, Path(tmp))
        for mode, s in loop["cases"].items():
            print(
                f"loop {mode:<6} {s['median']:7.3f}s  {loop['seconds_per_step'][mode] * 1e3:7.1f} ms/step"
                f"  overhead {loop['overhead'][mode]:+.1%}"
            )
    write_result(
        "async",
        {"machine": machine(), "reps": args.reps, "blocked": blocked, "loop": loop},
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
