"""The drill's workers: ``python -m MODULE`` processes with JSON logs, killed on purpose and
replaced at once, as a supervisor would."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from workers.drills.observe import WorkerLogs
from workers.drills.schedule import DrillSpec
from workers.drills.stack import DrillStack
from workers.stack.servers import ServerProcess

__all__ = ["WorkerPool"]

REPO = Path(__file__).resolve().parents[2]


class WorkerPool:
    """The drill's workers: started with JSON logs, killed on purpose, replaced at once."""

    def __init__(self, spec: DrillSpec, stack: DrillStack, queue: str, env: dict[str, str], logs_dir: Path) -> None:
        self.spec, self.stack, self.queue, self.env, self.logs_dir = spec, stack, queue, env, logs_dir
        self.procs: dict[int, ServerProcess] = {}
        self.names: dict[int, str] = {}
        self.logs = WorkerLogs()
        self.starts: list[tuple[float, int]] = []
        self._n = 0

    def start(self) -> ServerProcess:
        self._n += 1
        argv = [
            sys.executable,
            "-m",
            self.spec.worker_module,
            "--address",
            self.stack.temporal_address,
            "--namespace",
            self.stack.namespace,
            "--task-queue",
            self.queue,
            "--log-format",
            "json",
            "--metrics-port",
            "off",
        ]
        log = self.logs_dir / f"worker-{self._n}.log"
        proc = ServerProcess(f"worker-{self._n}", argv, log, env=self.env, cwd=REPO).start()
        self.procs[proc.pid] = proc
        self.names[proc.pid] = log.stem
        self.logs.add(log)
        self.starts.append((time.time(), proc.pid))
        return proc

    def wait_polling(self, timeout: float = 90.0) -> None:
        """Until every worker started so far polls its queue (or has died)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.logs.poll()
            if all(name in self.logs.polling or not self.procs[pid].alive() for pid, name in self.names.items()):
                return
            time.sleep(0.1)

    def alive(self) -> list[int]:
        return [pid for pid, p in self.procs.items() if p.alive()]

    def signal(self, pid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)

    def top_up(self) -> None:
        """Keep ``spec.workers`` workers alive: the supervisor's job."""
        for _ in range(self.spec.workers - len(self.alive())):
            self.start()

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.alive():
                self.signal(p.pid, signal.SIGTERM)
                self.signal(p.pid, signal.SIGCONT)  # a frozen one (the freeze fault) stops too
        for p in self.procs.values():
            p.stop(grace=15.0)
