"""Every step's time as the worker process computed it, and what the worker logged: the step
probe (``step_probe/sitecustomize.py``, put on a worker's ``PYTHONPATH``: one line per step) and
the worker's JSON log lines, read back by run."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

PROBE = Path(__file__).resolve().parent / "step_probe"
STEP_LOG_ENV = "CAIRN_BENCH_STEP_LOG"
"""The folder the probe writes ``steps-PID.log`` into (unset: the probe does nothing)."""


def probe_env(folder: Path) -> dict[str, str]:
    """The step probe on a worker's path, writing into ``folder``; JSON log lines."""
    path = os.pathsep.join(p for p in (str(PROBE), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, STEP_LOG_ENV: str(folder), "CAIRN_LOG_FORMAT": "json"}


def read_steps(folder: Path, run_id: str) -> list[tuple[float, int, int, int]]:
    """(time, step, attempt, pid) of every step the probe saw for ``run_id``, in time order."""
    out = []
    for path in folder.glob("steps-*.log"):
        pid = int(path.stem.split("-")[1])
        for line in path.read_text().splitlines():
            fields = line.split(" ", 3)
            if len(fields) != 4 or fields[3] != run_id:
                continue  # another run's, or a line a killed process left half written
            try:
                out.append((float(fields[0]), int(fields[1]), int(fields[2]), pid))
            except ValueError:
                continue
    return sorted(out)


def read_log(path: Path, run_id: str) -> list[tuple[float, str]]:
    """(time, message) of the worker's JSON log lines about ``run_id``."""
    out = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.startswith("{"):
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("run_id") == run_id:
            out.append((datetime.fromisoformat(rec["ts"]).timestamp(), str(rec.get("message", ""))))
    return out
