"""`make demo`: the seed scenario, run locally on the embedded defaults.

Train 17 updates and export a full checkpoint; restore it in a fresh process and train 23
more; compare bit for bit with 40 uninterrupted updates. Then show that a weights-only
restore does not reproduce training.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def cairn(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", *args, "--json"], check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout)


def compare(a: str, b: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "workers.cli", "ckpt", "compare", a, b, "--json"],
        capture_output=True,
        text=True,
    )
    return json.loads(out.stdout)


def seed_scenario(store: Path, config: Path) -> bool:
    print(f"store: {store}")
    part = cairn("train", "--config", str(config), "--steps", "17", "--store", str(store), "--run-id", "demo-seed")
    print(f"1. trained 17 updates            -> {part['checkpoint']} (cursor {part['cursor']})")
    resumed = cairn("train", "--resume", str(part["checkpoint"]), "--steps", "23", "--store", str(store))
    print(f"2. fresh process: restore, +23   -> {resumed['checkpoint']} (cursor {resumed['cursor']})")
    whole = cairn(
        "train", "--config", str(config), "--steps", "40", "--store", str(store), "--run-id", "demo-reference"
    )
    print(f"3. uninterrupted 40 updates      -> {whole['checkpoint']} (cursor {whole['cursor']})")
    verdict = compare(str(resumed["checkpoint"]), str(whole["checkpoint"]))
    weights = cairn(
        "train", "--resume", str(part["checkpoint"]), "--steps", "23", "--store", str(store), "--weights-only"
    )
    wverdict = compare(str(weights["checkpoint"]), str(whole["checkpoint"]))
    ok = bool(verdict["identical"]) and resumed["cursor"] == 80 and not wverdict["identical"]
    print()
    if verdict["identical"]:
        print(
            "VERDICT: BIT-IDENTICAL — resumed 17+23 == uninterrupted 40 "
            "(theta, m, v, t, RNG, cursor=80, history, config)"
        )
    else:
        print("VERDICT: DIFFERENT —", verdict["differences"])
    fields = ", ".join(d["field"] for d in wverdict["differences"][:6])  # type: ignore[index]
    print(f"control: weights-only restore differs from the uninterrupted run ({fields}, ...)")
    return ok


def main() -> int:
    store = REPO / ".cairn" / "demo-store"
    if store.exists():
        import shutil

        shutil.rmtree(store)
    ok = seed_scenario(store, REPO / "examples" / "config.json")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
