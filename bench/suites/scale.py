"""Scale: ``ckpt list``, ``latest`` and ``gc`` with 10,000 checkpoints in a run.

1. Checkpoints: real committed training checkpoints (shards + manifest, through the commit
   protocol, each valid for ``load_training``: the example model's state at step k with a
   history of k entries) are written into one run on a local store, bypassing the trainer.
   At 1,000 and then 10,000 checkpoints: ``latest_committed`` with the run's latest pointer
   (``cairn.checkpoint.latest``) beside the full listing it replaced (the latest of
   ``list_checkpoints``), ``list_checkpoints`` (the library), ``cairn ckpt list`` and ``cairn
   ckpt gc --dry-run`` (the CLI, a fresh process, interpreter start included), N reps each;
   finally one real ``gc --keep-last 3``.
(The history's cost per save, which this section measured while every checkpoint carried the
whole history, is ``bench.suites.history``'s section now: history lives in run-level segments.)
Rendered by ``bench.sections.scale``.
Run: ``python -m bench.suites.scale [--checkpoints 10000] [--reps 5] [--quick] [--latest-only]``
(``--latest-only``: the library rows of part 1 alone, results to the temp dir).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.machine import machine
from bench.harness.measure import interleaved, stats
from bench.harness.results import REPO, write_result
from bench.harness.states import UNSIGNED, state_at
from cairn.checkpoint import CheckpointKind, CheckpointRef, latest_committed, list_checkpoints, read_manifest
from cairn.checkpoint.latest import advance_latest
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage
from cairn.config import load_config
from cairn.session import TrainingSession
from cairn.state import TrainState
from cairn.stores import LocalStore, MemoryStore
from cairn.training import load_training, save_training

RUN = "scale"


def generate(store: LocalStore, base: TrainState, steps: range, history: dict[str, np.ndarray]) -> float:
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=8) as pool:  # fsync-bound: overlap them
        for _ in pool.map(lambda k: save_training(store, RUN, state_at(base, k, history), options=UNSIGNED), steps):
            pass
    return time.perf_counter() - start


def cli(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args, "--json"], check=True, capture_output=True, text=True, cwd=REPO
    )
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def point_latest(store: LocalStore, step: int) -> None:
    """The pointer at the latest step, as a commit leaves it (concurrent saves may leave it behind)."""
    ref = CheckpointRef(store.url, RUN, CheckpointKind.TRAINING, step)
    advance_latest(store, ref, read_manifest(store, ref, expect_kind=None, options=UNSIGNED).fingerprint)
    assert latest_committed(store, RUN) == ref


def measure_listing(store: LocalStore, reps: int, *, library_only: bool = False) -> dict[str, Any]:
    root = str(store.root)
    cases: dict[str, Any] = {
        "latest_committed, with the latest pointer (library)": lambda: latest_committed(store, RUN),
        "latest by listing the run (library, before the pointer)": lambda: list_checkpoints(
            store, RUN, CheckpointKind.TRAINING
        )[-1],
        "list_checkpoints (library)": lambda: list_checkpoints(store, RUN),
    }
    if library_only:
        return {"cases": {n: stats(t) for n, t in interleaved(cases, reps).items()}}
    counted = {"list": len(cli("ckpt", "list", root, "--run", RUN)["checkpoints"])}
    cases["cairn ckpt list (CLI process)"] = lambda: cli("ckpt", "list", root, "--run", RUN)
    cases["cairn ckpt gc --dry-run (CLI process)"] = lambda: cli(
        "ckpt", "gc", root, "--run", RUN, "--keep-last", "3", "--grace-seconds", "0", "--dry-run"
    )
    times = interleaved(cases, reps)
    baseline = interleaved({"python -m workers.cli --help (interpreter + imports)": _cli_startup}, reps)
    return {"listed": counted["list"], "cases": {n: stats(t) for n, t in {**times, **baseline}.items()}}


def _cli_startup() -> None:
    subprocess.run([sys.executable, "-m", "workers.cli", "--help"], check=True, capture_output=True, cwd=REPO)


def bench_checkpoints(total: int, reps: int, workdir: Path, *, library_only: bool = False) -> dict[str, Any]:
    config = load_config(REPO / "examples" / "config.json")
    base = TrainingSession.fresh(RUN, MemoryStore("base"), config).state
    rng = np.random.default_rng(0)
    history = {"loss": rng.random(total + 1), "lr": np.full(total + 1, 0.02)}
    store = LocalStore(workdir / "store")
    out: dict[str, Any] = {"points": {}}
    done = 0
    for count in sorted({min(1000, total), total}):
        seconds = generate(store, base, range(done + 1, count + 1), history)
        point_latest(store, count)
        out["points"][str(count)] = {
            "generate_seconds": seconds,
            **measure_listing(store, reps, library_only=library_only),
        }
        done = count
        print(f"{count} checkpoints (written in {seconds:.1f}s):", flush=True)
        for name, s in out["points"][str(count)]["cases"].items():
            print(f"   {name:<55} {s['median'] * 1e3:8.1f} ms (min {s['min'] * 1e3:.1f}, max {s['max'] * 1e3:.1f})")
    ref = latest_committed(store, RUN)
    assert ref is not None and ref.step == total
    if library_only:
        return out
    load_training(store, ref, options=UNSIGNED)  # the newest is a valid training checkpoint
    start = time.perf_counter()
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=3, grace_seconds=0))
    out["gc"] = {"seconds": time.perf_counter() - start, "deleted": len(plan.delete), "kept": len(plan.keep)}
    print(f"gc --keep-last 3: deleted {len(plan.delete)} checkpoints in {out['gc']['seconds']:.2f}s", flush=True)
    assert [r.step for r in list_checkpoints(store, RUN)] == [total - 2, total - 1, total]
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoints", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="300 checkpoints: a smoke run")
    parser.add_argument(
        "--latest-only", action="store_true", help="only latest and list in the library (results to the temp dir)"
    )
    args = parser.parse_args()
    total = 300 if args.quick else args.checkpoints
    reps = 3 if args.quick else args.reps
    if args.latest_only:
        with tempfile.TemporaryDirectory(prefix="cairn-bench-scale-") as tmp:
            checkpoints = bench_checkpoints(total, reps, Path(tmp), library_only=True)
        write_result(
            "scale-latest",
            {"machine": machine(), "reps": reps, "checkpoints": total, "listing": checkpoints},
            quick=True,
        )
        return 0
    with tempfile.TemporaryDirectory(prefix="cairn-bench-scale-") as tmp:
        checkpoints = bench_checkpoints(total, reps, Path(tmp))
    write_result(
        "scale",
        {"machine": machine(), "reps": reps, "checkpoints": total, "listing": checkpoints},
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
