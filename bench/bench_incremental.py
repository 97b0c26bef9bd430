# ruff: noqa: E501  (markdown table rows and sentences read better unbroken)
"""Incremental checkpoints: what a save writes when most of the state did not change.

A real training state (the tanh MLP of ``common.big_state``: theta, m, v) saved to local disk
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
``section`` renders the incremental section of ``BENCHMARKS.md``.
Run: ``python bench/bench_incremental.py [--mib 256] [--reps 5] [--quick]``.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import UNSIGNED, big_state, interleaved, machine, state_arrays, state_bytes, stats, write_result  # noqa: E402
from render import Targets, spread  # noqa: E402

from cairn.checkpoint import save_training  # noqa: E402
from cairn.checkpoint.options import CheckpointOptions  # noqa: E402
from cairn.state import TrainState  # noqa: E402
from cairn.stores import LocalStore  # noqa: E402

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


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    fine, full = r["regimes"]["fine-tuning, frozen base"], r["regimes"]["full training"]
    out = [
        "## 17. Incremental checkpoints: writing what changed",
        "",
        f"A {fine['state_bytes'] / 2**20:.0f} MiB training state (theta, m, v of the tanh MLP) saved to local disk, "
        f"{r['reps']} consecutive saves per case, interleaved rep by rep (medians, min–max). Fine-tuning: `W1` and its "
        f"moments are frozen ({1 - fine['changing_bytes'] / fine['state_bytes']:.1%} of the bytes), the rest changes "
        "before every save; full training: everything changes. *Incremental*: `CheckpointOptions(incremental=True)` "
        "after the run's previous save in the same process (blocks of 1 MiB); *full*: the same state saved as today "
        "(incremental off). Floors: the bytes the incremental save wrote, and the whole state, written to one new "
        "file + fsync. *Hash all*: BLAKE3 over the whole state in one thread — what any save pays to know which blocks "
        "changed (Cairn hashes every block it saves, referenced or not).",
        "",
        "| regime | bytes written (incremental) | full checkpoint | incremental save | full save | floor, bytes written | floor, whole state | hash all |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, x in r["regimes"].items():
        out.append(
            f"| {name} | {x['written_bytes']['median'] / 2**20:.2f} MiB | {x['full_checkpoint_bytes'] / 2**20:.1f} MiB | "
            f"{spread(x['incremental'])} | {spread(x['full'])} | {spread(x['floor_written'])} | {spread(x['floor_full'])} | "
            f"{spread(x['hash_all'])} |"
        )
    share = fine["written_bytes"]["median"] / fine["full_checkpoint_bytes"]
    targets.add(
        "fine-tuning with a frozen base: bytes written per checkpoint ≤ 1/10 of a full checkpoint (issue 27)",
        f"{share:.3f} of it ({fine['written_bytes']['median'] / 2**20:.2f} of {fine['full_checkpoint_bytes'] / 2**20:.0f} MiB)",
        share <= 0.1,
        "",
    )
    ratio = fine["incremental"]["median"] / fine["floor_written"]["median"]
    targets.add(
        "fine-tuning: save time within 1.2× of the floor for the bytes actually written (issue 27)",
        f"{ratio:.1f}× ({fine['incremental']['median']:.3f} s vs {fine['floor_written']['median']:.3f} s)",
        ratio <= 1.2,
        f"every block is hashed to find what changed: {fine['hash_all']['median']:.3f} s for the whole state in one thread; "
        f"still {fine['full']['median'] / fine['incremental']['median']:.1f}× faster than a full save ({fine['full']['median']:.3f} s)",
    )
    slower = full["incremental"]["median"] / full["full"]["median"]
    targets.add(
        "full training: incremental saves no slower than today's (issue 27)",
        f"{slower:.2f}× today's save time",
        slower <= 1.05,
        "the same bytes written; every block is hashed up front for the lookup, not overlapped with the writes as a full save's hashing is",
    )
    out += ["", "![incremental checkpoints](bench/results/incremental.png)", ""]
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``incremental.png``: per regime, MiB written and seconds of each case."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(r["regimes"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    written = [r["regimes"][n]["written_bytes"]["median"] / 2**20 for n in names]
    full = [r["regimes"][n]["full_checkpoint_bytes"] / 2**20 for n in names]
    x = range(len(names))
    left.bar([i - 0.2 for i in x], full, 0.4, label="full checkpoint")
    left.bar([i + 0.2 for i in x], written, 0.4, label="incremental: written")
    left.set_xticks(list(x), names, fontsize=8)
    left.set_ylabel("MiB per checkpoint (median)")
    left.legend(fontsize=8)
    cases = ("incremental", "full", "floor_written", "hash_all")
    for k, case in enumerate(cases):
        right.bar([i + (k - 1.5) * 0.2 for i in x], [r["regimes"][n][case]["median"] for n in names], 0.2, label=case)
    right.set_xticks(list(x), names, fontsize=8)
    right.set_ylabel("seconds per save (median)")
    right.legend(fontsize=8)
    fig.tight_layout()
    path = folder / "incremental.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


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
