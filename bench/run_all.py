"""``make bench``: every benchmark in its own process, then ``BENCHMARKS.md`` and the plots.

Each suite starts what it needs (SeaweedFS, a Temporal dev server, workers) in temporary
directories and writes ``bench/results/NAME.json``; ``bench.report`` renders them. A benchmark
that fails is reported and the others still run (its section then says "not measured").
``--quick`` runs every benchmark small, writing into the temp dir only (a smoke run).
The benchmarks are ``bench.registry``'s, less those that need a GPU (``make gpu-check``).
Run from the repository root: ``python -m bench.run_all [--quick] [--only store,peers,...]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.harness.results import REPO
from bench.registry import BENCHMARKS, by_name
from cairn.numerics import pinned_environment, process_profile_name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--only", help=f"comma-separated subset of {','.join(b.name for b in BENCHMARKS if not b.needs_gpu)}"
    )
    args = parser.parse_args()
    try:
        chosen = by_name(args.only.split(",")) if args.only else [b for b in BENCHMARKS if not b.needs_gpu]
    except ValueError as exc:
        parser.error(str(exc))
    quick = ["--quick"] if args.quick else []
    failed = []
    for bench in chosen:
        argv = [sys.executable, "-m", bench.suite, *quick]
        print(f"== {bench.name}: {' '.join(argv[1:])}", flush=True)
        start = time.monotonic()
        rc = subprocess.call(argv, cwd=REPO, env=pinned_environment(process_profile_name()))  # every bench, pinned
        print(
            f"== {bench.name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.monotonic() - start:.0f} s",
            flush=True,
        )
        if rc:
            failed.append(bench.name)
    rc = subprocess.call([sys.executable, "-m", "bench.report", *quick], cwd=REPO)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed or rc else 0


if __name__ == "__main__":
    sys.exit(main())
