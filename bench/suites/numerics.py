"""The cost of a numerics profile: the same training, unpinned (``native``) and pinned.

``cairn train`` in a fresh process per rep, interleaved rep by rep across the cases: the example
MLP (examples/config.json) and the digits CNN (examples/digits.json, the PyTorch adapter), each
under ``native`` (no pins: the machine's own dispatch), ``x86-64-v3`` (the default) and
``x86-64-v2``. The figure is the command's own training time (``seconds`` in its ``--json``
output: restore/initialise, the updates and the commits, not interpreter start-up), median of the
reps, and its ratio to ``native`` measured in the same run. Profiles above this machine's level
are skipped (it cannot run them).
Rendered by ``bench.sections.numerics``.
Run: ``python -m bench.suites.numerics [--reps 5] [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.harness.machine import machine
from bench.harness.measure import stats
from bench.harness.results import REPO, write_result
from cairn.numerics import PROFILES, native_level, pinned_environment

MODELS = {"mlp": ("examples/config.json", 3000), "digits": ("examples/digits.json", 60)}
LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")


def runnable() -> list[str]:
    here = native_level()
    top = LEVELS.index(here) if here in LEVELS else -1
    return ["native", *[n for n, p in PROFILES.items() if LEVELS.index(p.level) <= top]]


def train_seconds(config: str, steps: int, profile: str, root: Path) -> float:
    base = {k: v for k, v in pinned_environment("native").items() if k not in PROFILES["x86-64-v3"].environment()}
    env = pinned_environment(profile, base)  # native: none of the pins
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "train", "--config", str(REPO / config), "--steps", str(steps),
         "--store", tempfile.mkdtemp(dir=root), "--checkpoint-every", str(max(1, steps // 3)),
         "--numerics", profile, "--json"],
        capture_output=True, text=True, cwd=REPO, env=env, timeout=900, check=True,
    )  # fmt: skip
    return float(json.loads(out.stdout)["seconds"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    reps = 2 if args.quick else args.reps
    profiles = runnable()
    results: dict[str, Any] = {"machine": machine(), "native_level": native_level(), "models": {}}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-numerics-") as tmp:
        root = Path(tmp)
        for model, (config, steps) in MODELS.items():
            steps = max(1, steps // 10) if args.quick else steps
            samples: dict[str, list[float]] = {p: [] for p in profiles}
            for rep in range(reps):  # interleaved, the order rotated every rep
                for p in profiles[rep % len(profiles) :] + profiles[: rep % len(profiles)]:
                    samples[p].append(train_seconds(config, steps, p, root))
            summary = {p: stats(v) for p, v in samples.items()}
            native = summary["native"]["median"]
            for p in profiles:
                summary[p]["ratio_to_native"] = summary[p]["median"] / native
            results["models"][model] = {"config": config, "steps": steps, "profiles": summary}
            print(model, {p: round(summary[p]["median"], 3) for p in profiles}, flush=True)
    write_result("numerics", results, quick=args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
