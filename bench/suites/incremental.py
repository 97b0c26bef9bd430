# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Incremental checkpoints: what a save writes when most of the state did not change.

A real training state (the tanh MLP of ``bench.harness.states.big_state``: theta, m, v) saved to local disk
in one process, in two regimes, each as a run of consecutive saves (one per rep, interleaved):

- fine-tuning with a frozen base: the first layer ``W1`` and its moments never change (99% of
  the parameters), the rest (``b1``, ``W2``, ``b2`` and their moments) change before every save;
- full training: every array changes before every save.

Cases, side by side in every rep: ``save_training`` with ``CheckpointOptions(incremental=True)``
(after the run's previous save in the same process, as a periodic save is), the same state
saved in full (the default: incremental off), and two floors: the bytes the incremental save
actually wrote, written to one file + fsync, and the whole state written that way. Bytes
written: every object under the checkpoint's prefix (shards, rank index, manifest). Also timed:
BLAKE3 over the whole state (what every save pays to know which blocks changed).
Rendered by ``bench.sections.incremental``.
Run: ``python -m bench.suites.incremental [--mib 256] [--reps 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from blake3 import blake3

from bench.harness.machine import machine
from bench.harness.measure import interleaved, stats
from bench.harness.results import write_result
from bench.harness.states import UNSIGNED, big_state, state_arrays, state_bytes
from cairn.checkpoint.options import CheckpointOptions
from cairn.state import TrainState
from cairn.stores import LocalStore
from cairn.training import save_training

INCREMENTAL = CheckpointOptions(incremental=True)
FROZEN = ("W1",)


def _floor_write(path: Path, arrays: list[np.ndarray], nbytes: int) -> None:
    """``nbytes`` of the state's bytes written to one new file, then fsync."""
    path.unlink(missing_ok=True)
    left = nbytes
    with path.open("wb") as f:
        for a in arrays:
            if left <= 0:
                break
            view = memoryview(np.ascontiguousarray(a)).cast("B")[:left]
            f.write(view)
            left -= len(view)
        f.flush()
        os.fsync(f.fileno())


def _written(store: LocalStore, run_id: str, step: int) -> int:
    return sum(o.size for o in store.list(f"{run_id}/training/{step:012d}/"))


def regime(state: TrainState, work: Path, reps: int, *, frozen: bool) -> dict[str, Any]:
    """One regime: ``reps`` consecutive saves of each case, interleaved."""
    stores = {"incremental": LocalStore(work / "inc"), "full": LocalStore(work / "full")}
    changing = [
        (kind, a)
        for kind, group in (("params", state.params), ("m", state.m), ("v", state.v))
        for key, a in group.items()
        if not (frozen and key in FROZEN)
    ]
    arrays = state_arrays(state)
    step = [state.step]
    save_training(stores["incremental"], "inc", state, options=INCREMENTAL)  # the run's first save writes all
    written: list[int] = []

    def advance(name: str) -> None:  # untimed: the next state (a training step's worth of change)
        if name == "incremental":
            step[0] += 1
            state.step = step[0]
            for kind, a in changing:  # every element moves (every block of it changes); v stays >= 0
                a += 1e-12 if kind == "v" else 1e-6

    def incremental() -> None:
        save_training(stores["incremental"], "inc", state, options=INCREMENTAL)
        written.append(_written(stores["incremental"], "inc", state.step))

    cases = {
        "incremental": incremental,
        "full": lambda: save_training(stores["full"], f"full-{state.step}", state, options=UNSIGNED),
        "floor_written": lambda: _floor_write(work / "floor-w.bin", arrays, written[-1] if written else 0),
        "floor_full": lambda: _floor_write(work / "floor-f.bin", arrays, state_bytes(state)),
        "hash_all": lambda: [
            blake3(memoryview(np.ascontiguousarray(a)).cast("B"), max_threads=1).digest() for a in arrays
        ],
    }
    times = interleaved(cases, reps, before=advance)
    full_bytes = _written(stores["full"], f"full-{state.step}", state.step) if reps else 0
    return {
        "frozen": frozen,
        "changing_bytes": sum(a.nbytes for _, a in changing),
        "state_bytes": state_bytes(state),
        "full_checkpoint_bytes": full_bytes,
        "written_bytes": stats([float(w) for w in written]),
        **{name: stats(t) for name, t in times.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="16 MiB, 3 reps: a smoke run")
    args = parser.parse_args()
    mib, reps = (16, 3) if args.quick else (args.mib, args.reps)
    regimes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-inc-") as tmp:
        for name, frozen in (("fine-tuning, frozen base", True), ("full training", False)):
            work = Path(tmp) / name.split(",")[0].replace(" ", "-")
            work.mkdir()
            regimes[name] = x = regime(big_state(mib), work, reps, frozen=frozen)
            print(
                f"{name}: wrote {x['written_bytes']['median'] / 2**20:.2f} MiB of {x['full_checkpoint_bytes'] / 2**20:.1f}; "
                f"incremental {x['incremental']['median']:.3f}s full {x['full']['median']:.3f}s "
                f"floor(written) {x['floor_written']['median']:.3f}s hash {x['hash_all']['median']:.3f}s",
                flush=True,
            )
    write_result("incremental", {"machine": machine(), "reps": reps, "mib": mib, "regimes": regimes}, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
