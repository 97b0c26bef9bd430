"""The one way a benchmark starts a worker: ``cairn worker`` (``python -m workers.cli worker``),
as ``cairn dev up`` and a deployment start it — a supervisor and its worker process, or with
``supervised=False`` the worker process alone (``--no-supervisor``) — in a process group of its
own, logging to a file, its metrics on a free port."""

from __future__ import annotations

import sys
from pathlib import Path

from bench.harness.results import REPO
from bench.harness.steps import probe_env
from workers.stack.servers import ServerProcess


def start_worker(
    address: str,
    task_queue: str,
    log: Path,
    *,
    supervised: bool = True,
    steps: Path | None = None,
    env: dict[str, str] | None = None,
) -> ServerProcess:
    """A started ``cairn worker`` on ``task_queue``. ``steps``: the step probe on its path,
    writing there (JSON log lines too); ``env``: more variables over the inherited ones."""
    argv = [sys.executable, "-m", "workers.cli", "worker", "--address", address, "--task-queue", task_queue]
    if not supervised:
        argv.append("--no-supervisor")
    variables = {"CAIRN_METRICS_PORT": "0", **(probe_env(steps) if steps is not None else {}), **(env or {})}
    return ServerProcess("supervisor" if supervised else "worker", argv, log, env=variables, cwd=REPO).start()
