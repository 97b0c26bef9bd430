"""The drill's running picture of its run: it polls the workflow's ``describe`` and the workers'
logs, keeps the step samples and when the server failed each attempt, and tops up the pool.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from temporalio.service import RPCError

from workers.drills.observe import RunView, run_view
from workers.drills.pool import WorkerPool

__all__ = ["POLL_S", "RunWatch"]

POLL_S = 0.15


class RunWatch:
    """What the drill knows of its run, updated every ``POLL_S`` by ``follow``."""

    def __init__(self) -> None:
        self.view: RunView | None = None
        self.samples: list[tuple[float, int]] = []
        """(wall time, step) of the running segment, as the server saw it."""
        self.unanswered = 0
        """Polls of the server that got no answer (it was down, or too slow)."""
        self.attempt_seen: dict[tuple[str, int], float] = {}
        """(activity id, attempt) -> when the server had failed the attempt before it."""
        self.failure_known: set[tuple[str, int]] = set()
        """Attempts whose predecessor's failure time the server told (else: a bound)."""
        self.done = False
        """The run has ended (or the drill is over)."""

    async def follow(self, handle: Any, pool: WorkerPool) -> None:
        """Poll until ``done``; a worker that died is replaced meanwhile."""
        while not self.done:
            now = time.time()
            try:
                desc = await asyncio.wait_for(handle.describe(), timeout=2.0)
            except (TimeoutError, RPCError, RuntimeError):
                desc = None
                self.unanswered += 1
            if desc is not None:
                view = run_view(desc, now)
                self.view = view
                for p in view.pending:
                    # The server failed attempt - 1 no later than this: when it says so, when
                    # it dispatched the retry, or when we first saw the retry.
                    seen = min(t for t in (now, p.last_failed_at, p.started_at if p.attempt > 1 else None) if t)
                    key = (p.activity_id, p.attempt)
                    self.attempt_seen[key] = min(seen, self.attempt_seen.get(key, seen))
                    if p.last_failed_at is not None:
                        self.failure_known.add(key)
                seg = view.segment
                if seg is not None and seg.step is not None and seg.running and seg.worker_pid in pool.alive():
                    self.samples.append((now, seg.step))  # a dead worker's last heartbeat is no progress
                if view.status != "RUNNING":
                    self.done = True
            if not self.done:
                pool.top_up()  # the supervisor: a worker that died is replaced
            pool.logs.poll()
            await asyncio.sleep(POLL_S)

    def live_step(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def segment_running(self) -> bool:
        seg = self.view.segment if self.view is not None else None
        return seg is not None and seg.running and seg.step is not None

    async def until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Whether ``predicate`` came true within ``timeout`` (checked once more when the run ends)."""
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.done or time.monotonic() > deadline:
                return predicate()
            await asyncio.sleep(POLL_S / 2)
        return True

    def detected(self, activity: tuple[str, int] | None, fired: float) -> tuple[float | None, bool]:
        """When the server failed the lost attempt, and whether it said so (else a bound)."""
        if activity is None:
            return None, False
        later = [
            (t, key)
            for key, t in self.attempt_seen.items()
            if key[0] == activity[0] and key[1] > activity[1] and t >= fired - POLL_S
        ]
        if not later:
            return None, False
        t, key = min(later)
        return max(t, fired), key in self.failure_known
