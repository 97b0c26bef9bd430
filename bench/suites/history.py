"""History per save at a million steps: the loss/lr history as tensors in every checkpoint
(before) vs as run-level segments shared by the run's checkpoints (``cairn.checkpoint.history``).

The example model's state at step 1,000,000 with its full history (random loss, constant lr),
saved to local disk in one process, median of N interleaved reps:

- before: the history as ``history/KEY`` tensors in the checkpoint (``training_tensors`` +
  ``write_checkpoint``: what every save wrote before segments);
- after, steady state: ``save_training`` at 1,000,000 right after the run's save at 999,000 in
  the same process (untimed), as a periodic save every 1,000 steps does;
- after, first save of a process: ``save_training`` at 1,000,000 in a run nothing was saved to
  (every block written once);

and ``load_training`` of the before and after checkpoints. Bytes are counted by the store.
Rendered by ``bench.sections.history``.
Run: ``python -m bench.suites.history [--steps 1000000] [--reps 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from bench.harness.machine import machine
from bench.harness.measure import interleaved, stats
from bench.harness.results import REPO, write_result
from bench.harness.states import UNSIGNED, state_at
from cairn.checkpoint import write_checkpoint
from cairn.checkpoint.layout import history_prefix
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.training import training_content, training_tensors
from cairn.config import load_config
from cairn.session import TrainingSession
from cairn.stores import LocalStore, MemoryStore
from cairn.stores.base import Chunk
from cairn.training import load_training, save_training

CASES = ("before: history tensors", "after: segments, steady state", "after: segments, first save")


class CountingStore(LocalStore):
    """Local disk, counting the bytes each save writes: history segments and everything else."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.history = 0
        self.other = 0

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        data = [memoryview(c).cast("B") for c in chunks]
        n = sum(len(d) for d in data)
        if key.startswith(history_prefix(key.split("/", 1)[0])):
            self.history += n
        else:
            self.other += n
        super().write_object(key, data, size)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.other += len(data)
        return super().put_if_absent(key, data)


def bench(steps: int, reps: int, workdir: Path) -> dict[str, Any]:
    config = load_config(REPO / "examples" / "config.json")
    base = TrainingSession.fresh("hist", MemoryStore("base"), config).state
    rng = np.random.default_rng(0)
    history = {"loss": rng.random(steps), "lr": np.full(steps, 0.02)}
    previous, final = state_at(base, steps - 1000, history), state_at(base, steps, history)
    stores: dict[str, CountingStore] = {}
    refs: dict[str, CheckpointRef] = {}
    written: dict[str, list[tuple[int, int]]] = {name: [] for name in CASES}
    rep = [0]

    def setup(name: str) -> None:
        rep[0] += 1
        store = stores[name] = CountingStore(workdir / f"{CASES.index(name)}-{rep[0]}")
        if name == CASES[1]:
            save_training(store, "run", previous, options=UNSIGNED)  # the save before, untimed
        store.history = store.other = 0

    def before() -> None:
        store = stores[CASES[0]]
        refs[CASES[0]] = write_checkpoint(
            store, training_content("run", final), training_tensors(final), options=UNSIGNED
        ).ref
        written[CASES[0]].append((store.history, store.other))

    def after(name: str) -> None:
        store = stores[name]
        refs[name] = save_training(store, "run", final, options=UNSIGNED).ref
        written[name].append((store.history, store.other))

    saves = interleaved(
        {CASES[0]: before, CASES[1]: lambda: after(CASES[1]), CASES[2]: lambda: after(CASES[2])}, reps, before=setup
    )
    loads = interleaved(
        {name: (lambda name=name: load_training(stores[name], refs[name], options=UNSIGNED)) for name in CASES[:2]},  # type: ignore[misc]
        reps,
    )
    legacy_state, _ = load_training(stores[CASES[0]], refs[CASES[0]], options=UNSIGNED)
    new_state, manifest = load_training(stores[CASES[1]], refs[CASES[1]], options=UNSIGNED)
    assert legacy_state.history == new_state.history == final.history
    assert manifest.history is not None
    out: dict[str, Any] = {
        "steps": steps,
        "segments": {k: len(s.segments) for k, s in manifest.history.series.items()},
        "cases": {},
    }
    for name in CASES:
        hist, other = written[name][-1]
        if name == CASES[0]:  # the history tensors are inside the checkpoint's shard
            hist = 16 * steps
            other -= hist
        out["cases"][name] = {
            "history_bytes": hist,
            "other_bytes": other,
            "save": stats(saves[name]),
            **({"load": stats(loads[name])} if name in loads else {}),
        }
        r = out["cases"][name]
        print(
            f"{name:<32} history {hist:>11,} B  other {other:>8,} B  save {r['save']['median'] * 1e3:7.1f} ms"
            + (f"  load {r['load']['median'] * 1e3:7.1f} ms" if "load" in r else ""),
            flush=True,
        )
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="100,000 steps, 3 reps: a smoke run")
    args = parser.parse_args()
    steps = 100_000 if args.quick else args.steps
    reps = 3 if args.quick else args.reps
    started_on = machine()
    with tempfile.TemporaryDirectory(prefix="cairn-bench-history-") as tmp:
        results = bench(steps, reps, Path(tmp))
    write_result("history", {"machine": started_on, "reps": reps, **results}, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
