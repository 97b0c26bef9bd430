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
whole history, is ``bench_history.py``'s section now: history lives in run-level segments.)
``section`` / ``plot`` render section 6 of ``BENCHMARKS.md`` and ``results/scale.png`` from the results.
Run: ``python bench/bench_scale.py [--checkpoints 10000] [--reps 5] [--quick] [--latest-only]``
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, UNSIGNED, interleaved, machine, state_at, stats, write_result  # noqa: E402
from render import Targets, spread  # noqa: E402

from cairn.checkpoint import (  # noqa: E402
    CheckpointKind,
    CheckpointRef,
    latest_committed,
    list_checkpoints,
    load_training,
    read_manifest,
    save_training,
)
from cairn.checkpoint.latest import advance_latest  # noqa: E402
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage  # noqa: E402
from cairn.config import load_config  # noqa: E402
from cairn.session import TrainingSession  # noqa: E402
from cairn.state import TrainState  # noqa: E402
from cairn.stores import LocalStore, MemoryStore  # noqa: E402

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


# -- section 6 of BENCHMARKS.md and its plot ------------------------------------------------------


def section(r: dict[str, Any], targets: Targets) -> list[str]:
    """Section 6: listing, latest and gc by checkpoint count, and the history's cost (no target)."""
    lst = r["listing"]
    out = [
        "## 6. Scale",
        "",
        "Real committed training checkpoints (shards + manifest through the commit protocol, each valid for "
        "`load_training`: the example model at step k with k history entries), written into one run on local "
        f"disk bypassing the trainer; {r['reps']} interleaved reps of each operation at 1,000 and at "
        f"{r['checkpoints']:,} checkpoints. The CLI rows are fresh processes (`python -m workers.cli`), so they "
        "include the interpreter and imports, shown on their own in the last row.",
        "",
        "| operation | " + " | ".join(f"{int(n):,} checkpoints" for n in lst["points"]) + " |",
        "|---|" + "---|" * len(lst["points"]),
    ]
    names = list(next(iter(lst["points"].values()))["cases"])
    for name in names:
        cells = [spread(p["cases"][name], "ms", 1e3, 1) for p in lst["points"].values()]
        out.append(f"| {name} | " + " | ".join(cells) + " |")
    gen = " / ".join(f"{p['generate_seconds']:.1f} s" for p in lst["points"].values())
    out += [
        "",
        f"Writing them took {gen} (8 threads). Then one real `gc --keep-last 3`: deleted {lst['gc']['deleted']:,} "
        f"checkpoints in {lst['gc']['seconds']:.2f} s, kept {lst['gc']['kept']}.",
        "",
    ]
    if "history" in r:  # results from before history segments (section 13 measures today's format)
        out += [
            "### History in every checkpoint (before history segments)",
            "",
            "Measured when every training checkpoint carried its whole loss/lr history (16 bytes per step); "
            "checkpoints now keep their history in run-level segments and a save writes only what is new "
            f"(section 13). The example model's state at step N with its full history, {r['reps']} interleaved reps:",
            "",
            "| step N | history bytes | checkpoint bytes (tensors + manifest) | history share | save | load |",
            "|---|---|---|---|---|---|",
        ]
        for n, x in r["history"].items():
            total = x["total_bytes"] + x["manifest_bytes"]
            out.append(
                f"| {int(n):,} | {x['history_bytes']:,} | {total:,} | {x['history_bytes'] / total:.1%} | "
                f"{spread(x['save'], 'ms', 1e3, 1)} | {spread(x['load'], 'ms', 1e3, 1)} |"
            )
    out += ["", "![scale](bench/results/scale.png)", ""]
    return out


def plot(r: dict[str, Any], folder: Path) -> list[Path]:
    """``scale.png``: listing times by checkpoint count; history bytes and save time by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hist = r.get("history")
    fig, axes = plt.subplots(1, 2 if hist else 1, figsize=(11 if hist else 6, 4), squeeze=False)
    a = axes[0][0]
    pts = r["listing"]["points"]
    counts = [int(n) for n in pts]
    for name in next(iter(pts.values()))["cases"]:
        a.plot(counts, [pts[str(n)]["cases"][name]["median"] * 1e3 for n in counts], marker="o", label=name)
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("checkpoints in the run")
    a.set_ylabel("ms (median)")
    a.set_title("listing, latest, gc")
    a.legend(fontsize=7)
    if hist:
        b = axes[0][1]
        steps = [max(1, int(n)) for n in hist]
        b.plot(steps, [hist[n]["history_bytes"] / 1e6 for n in hist], marker="o", label="history MB per checkpoint")
        b2 = b.twinx()
        b2.plot(steps, [hist[n]["save"]["median"] * 1e3 for n in hist], marker="s", color="C1", label="save ms")
        b.set_xscale("log")
        b.set_xlabel("step (history entries)")
        b.set_ylabel("MB of history per checkpoint")
        b2.set_ylabel("save ms (median)")
        b.set_title("before history segments: all history in every checkpoint")
    fig.tight_layout()
    path = folder / "scale.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return [path]


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
