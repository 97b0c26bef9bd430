"""Where results go: ``bench/results/NAME.json`` for a full run, a folder in the temp dir for a
quick (smoke) run, so that a quick run never replaces the results of a full one."""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


def results_folder(quick: bool) -> Path:
    return Path(tempfile.gettempdir()) / "cairn-bench-quick" if quick else RESULTS


def write_result(name: str, payload: dict[str, Any], *, quick: bool = False) -> Path:
    """``NAME.json`` in ``results_folder(quick)``, stamped with the benchmark and the time."""
    folder = results_folder(quick)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    payload = {"benchmark": name, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **payload}
    path.write_text(json.dumps(payload, indent=1, default=float) + "\n")
    print(f"wrote {path}")
    return path
