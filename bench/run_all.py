"""``make bench``: every benchmark in its own process, then ``BENCHMARKS.md`` and the plots.

Each benchmark starts what it needs (SeaweedFS, a Temporal dev server, workers) in temporary
directories and writes ``bench/results/NAME.json``; ``report.py`` renders them. A benchmark
that fails is reported and the others still run (its section then says "not measured").
``--quick`` runs every benchmark small, writing into the temp dir only (a smoke run).
Run: ``python bench/run_all.py [--quick] [--only store,peers,...]``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from cairn.numerics import pinned_environment, process_profile_name  # noqa: E402

ORDER = [
    "store",
    "peers",
    "async",
    "scale",
    "orchestration",
    "recovery",
    "distributed",
    "numerics",
    "precision",
    "recovery_supervised",
    "interop",
    "history",
    "metadata",
    "large",
    "boundaries",
    "incremental",
    "tier",
]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(ORDER)}")
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else ORDER
    failed = []
    for name in chosen:
        argv = [sys.executable, str(HERE / f"bench_{name}.py"), *(["--quick"] if args.quick else [])]
        print(f"== {name}: {' '.join(argv[1:])}", flush=True)
        start = time.monotonic()
        rc = subprocess.call(argv, env=pinned_environment(process_profile_name()))  # every bench, pinned
        print(
            f"== {name}: {'ok' if rc == 0 else f'FAILED (exit {rc})'} in {time.monotonic() - start:.0f} s", flush=True
        )
        if rc:
            failed.append(name)
    rc = subprocess.call([sys.executable, str(HERE / "report.py"), *(["--quick"] if args.quick else [])])
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed or rc else 0


if __name__ == "__main__":
    sys.exit(main())
