"""The worker processes of a recovery scenario: who may be killed, how (the worker process
alone, the whole host, or a frozen host), and what replaces a lost one."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

from bench.harness.temporal import pollers
from bench.harness.worker import start_worker
from workers.stack.servers import ServerProcess
from workers.supervisor import RestartPolicy

_POLICY = RestartPolicy()
CRASH_LIMIT, CRASH_WINDOW_S = _POLICY.limit, _POLICY.window_s + 2.0


def child_of(pid: int) -> int | None:
    """The supervisor's worker process (its only child), if one is running."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                return int(entry.name)
    return None


class Fleet:
    """``count`` workers on one queue: ``kind`` "supervised" (``cairn worker``) or "bare"
    (``cairn worker --no-supervisor``); ``steps`` and ``env`` as ``start_worker``'s (supervised)."""

    def __init__(
        self,
        address: str,
        queue: str,
        work: Path,
        kind: str,
        count: int,
        *,
        steps: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.address, self.queue, self.work, self.kind = address, queue, work, kind
        self.steps, self.env = steps, env
        self._logs = iter(range(1000))
        self.members = [self._spawn() for _ in range(count)]
        self._kills: dict[int, list[float]] = {}
        self.frozen: ServerProcess | None = None

    def _spawn(self) -> ServerProcess:
        log = self.work / f"worker-{next(self._logs)}.log"
        if self.kind == "bare":
            return start_worker(self.address, self.queue, log, supervised=False)
        return start_worker(self.address, self.queue, log, steps=self.steps, env=self.env)

    def worker_pids(self) -> dict[int, ServerProcess]:
        """Each running worker process and the member it belongs to."""
        if self.kind == "bare":
            return {m.pid: m for m in self.members}
        return {child: m for m in self.members if (child := child_of(m.pid)) is not None}

    async def ready(self, client: Any, timeout: float = 120) -> None:
        """Until every member has a worker process that polls the queue."""
        deadline = time.monotonic() + timeout
        while True:
            pids = self.worker_pids()
            if len(pids) == len(self.members) and set(pids) <= await pollers(client, self.queue):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"workers not polling: {pids}")
            await asyncio.sleep(0.1)

    def may_kill(self, worker_pid: int) -> bool:
        """Whether killing this worker process keeps its supervisor under its crash limit (5 in
        60 s: the 5th would end it, by design)."""
        member = self.worker_pids().get(worker_pid)
        if member is None:
            return False
        recent = [t for t in self._kills.get(member.pid, []) if time.monotonic() - t < CRASH_WINDOW_S]
        return len(recent) < CRASH_LIMIT - 1

    def frozen_pids(self) -> set[int]:
        """The processes of the frozen member (supervisor and worker process), if one is frozen."""
        if self.frozen is None:
            return set()
        child = child_of(self.frozen.pid)
        return {self.frozen.pid, *([child] if child is not None else [])}

    def thaw(self) -> None:
        if self.frozen is not None:
            os.killpg(self.frozen.pid, signal.SIGCONT)
            self.frozen = None

    def kill(self, worker_pid: int, how: str) -> None:
        member = self.worker_pids()[worker_pid]
        if how == "freeze":  # the whole host hangs: supervisor and worker process, their connections kept
            os.killpg(member.pid, signal.SIGSTOP)
            self.frozen = member
            return
        if how == "process" and self.kind == "supervised":  # the worker process only: its supervisor lives on
            self._kills.setdefault(member.pid, []).append(time.monotonic())
            os.kill(worker_pid, signal.SIGKILL)
            return
        os.killpg(member.pid, signal.SIGKILL)  # the whole host (a bare worker is all of it)
        self.members.remove(member)
        member.stop()
        self.members.append(self._spawn())

    def stop(self) -> None:
        self.thaw()
        for m in self.members:
            m.stop(grace=2)
