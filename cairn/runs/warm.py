"""Warm runs: the training sessions a worker keeps in memory between a run's segments, so the
next segment on the same worker continues from memory — no trainer build, no restore.

A held session is only a cache of what the store says. Its owner takes it out for a segment
(``take``) and uses it only when the store's latest commit of the run is exactly the state it
holds (``matches``: the same step and fingerprint); any doubt — another worker committed, a
rollback, a different config or store, an earlier attempt that failed — and the segment takes
the cold path (restore from the store). A session goes back (``keep``) only after a segment
that completed; the least recently used beyond ``capacity`` and those idle past
``idle_seconds`` are released.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from cairn.session import TrainingSession

__all__ = ["WarmRun", "WarmRuns", "warm_key"]


def warm_key(config_json: str, store_url: str) -> str:
    """What a held session must have been trained with to continue a segment."""
    return f"{store_url}\n{config_json}"


@dataclass
class WarmRun:
    run_id: str
    key: str
    session: TrainingSession
    last_used: float

    @property
    def step(self) -> int:
        return self.session.state.step

    @property
    def fingerprint(self) -> str | None:
        commit = self.session.last_commit
        return commit.manifest.fingerprint if commit is not None else None

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.session.state.tensors.values())

    def matches(self, latest_step: int | None, latest_fingerprint: str | None) -> bool:
        """The held state is the run's latest commit, exactly."""
        commit = self.session.last_commit
        return (
            commit is not None
            and latest_fingerprint is not None
            and commit.manifest.step == self.step == latest_step
            and commit.manifest.fingerprint == latest_fingerprint
        )


class WarmRuns:
    """At most ``capacity`` held sessions (least recently used released first), each released
    after ``idle_seconds`` without a segment. Thread-safe: activities run in a thread pool."""

    def __init__(self, capacity: int = 2, idle_seconds: float = 600.0) -> None:
        self.capacity, self.idle_seconds = capacity, idle_seconds
        self._held: dict[str, WarmRun] = {}
        self._lock = threading.Lock()
        self._sweeper: threading.Thread | None = None

    def take(self, run_id: str, key: str) -> WarmRun | None:
        """The run's held session, removed from the cache (its taker owns it now); None when
        none is held or it was trained with another config or store (then it is dropped)."""
        with self._lock:
            self._release_idle()
            held = self._held.pop(run_id, None)
        if held is None or held.key != key:
            return None
        return held

    def drop(self, run_id: str) -> None:
        with self._lock:
            self._held.pop(run_id, None)

    def keep(self, run_id: str, key: str, session: TrainingSession) -> None:
        """Hold ``session`` after a segment that completed with a commit of its state."""
        if self.capacity <= 0 or session.last_commit is None or session.last_commit.manifest.step != session.state.step:
            return
        with self._lock:
            self._held[run_id] = WarmRun(run_id, key, session, time.monotonic())
            while len(self._held) > self.capacity:
                oldest = min(self._held.values(), key=lambda w: w.last_used)
                del self._held[oldest.run_id]
            self._release_idle()
            if self._sweeper is None and self._held:
                self._sweeper = threading.Thread(target=self._sweep, name="cairn-warm-sweeper", daemon=True)
                self._sweeper.start()

    def _sweep(self) -> None:
        """Release idle sessions even when no segment comes to ask (a worker left idle)."""
        while True:
            time.sleep(max(0.05, min(60.0, self.idle_seconds / 4)))
            self.release_idle()

    def release_idle(self) -> None:
        with self._lock:
            self._release_idle()

    def _release_idle(self) -> None:
        cutoff = time.monotonic() - self.idle_seconds
        for run_id in [r for r, w in self._held.items() if w.last_used < cutoff]:
            del self._held[run_id]

    def clear(self) -> None:
        with self._lock:
            self._held.clear()

    @property
    def runs(self) -> int:
        with self._lock:
            return len(self._held)

    @property
    def nbytes(self) -> int:
        """The state bytes the held sessions keep in memory (what the metrics report)."""
        with self._lock:
            return sum(w.nbytes for w in self._held.values())
