# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Async save: how long the trainer is blocked per checkpoint, and what checkpoints cost a
training loop (none / sync / async, a checkpoint every K steps).

1. Blocked time, interleaved rep by rep on local disk: a sync ``save_training`` (the trainer
   waits for all of it) vs ``AsyncCheckpointer.save_async`` (the trainer waits for the snapshot
   copy only; the background save is then awaited untimed), next to ``TrainState.copy()`` (how
   the snapshot was taken before its buffers were reused). Peak extra RSS of each.
2. Step-time overhead: the same ``TrainingSession.run`` (N steps, a checkpoint every K steps)
   with no checkpoints, sync and async checkpoints; wall time per step and overhead vs none.
Rendered by ``bench.sections.async_save``.
Run: ``python -m bench.suites.async_save [--mib 256] [--reps 5] [--quick]``.

"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.machine import machine
from bench.harness.measure import interleaved, measure_rss, stats
from bench.harness.results import write_result
from bench.harness.states import UNSIGNED, big_state, state_bytes
from cairn.config import TrainConfig
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.training import AsyncCheckpointer, save_training


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
