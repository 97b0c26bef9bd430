"""A drill's faults as they happen: ``FaultInjector`` fires each planned fault and measures when
it was detected and when training resumed; ``FaultRecord`` keeps that; ``check_targets`` refuses,
before anything starts, faults the stack and store cannot take.

Faults: ``worker-kill`` (SIGKILL the worker running the segment), ``kill-in-upload`` (SIGKILL it
when its manifest PUT reaches the fault proxy: shards written, commit not), ``kill-after-effect``
(the ``CAIRN_FAULT`` hook: after the service committed, before the completion), ``sigterm``
(graceful hand-back), ``freeze`` (SIGSTOP the worker running the segment until the segment runs
elsewhere, at least past its heartbeat timeout, then SIGCONT: a hung host, and the zombie attempt
it thaws into), ``temporal-restart`` / ``s3-restart`` / ``service-restart`` (SIGKILL the server,
restart it on its data) and ``storage-brownout`` (the fault proxy fails a seeded share of requests
for a few seconds).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.checkpoint import latest_committed
from cairn.errors import ConfigError
from workers.drills.faultproxy import FaultPolicy, FaultProxy, pid_of_connection
from workers.drills.observe import Commit
from workers.drills.pool import WorkerPool
from workers.drills.schedule import FREEZE_MARGIN_S, SERVER_FAULTS, DrillSpec, PlannedFault
from workers.drills.stack import DrillStack, Restart
from workers.drills.watch import RunWatch

__all__ = [
    "FaultRecord",
    "FaultInjector",
    "FAULT_SERVER",
    "LOST_WORKER",
    "RECOVERY_WAIT_S",
    "check_targets",
    "zombie_commits",
]

RECOVERY_WAIT_S = 120.0
"""How long a fault may take to recover before the drill gives up on it (and fails)."""
FAULT_SERVER = {"temporal-restart": "temporal", "s3-restart": "s3", "service-restart": "service"}
"""The server each server fault restarts."""
LOST_WORKER = ("worker-kill", "kill-in-upload", "sigterm", "kill-after-effect", "freeze")
"""Faults after which the segment must resume on another worker (or a replacement)."""


@dataclass
class FaultRecord:
    """One fault as it happened. Times are wall-clock seconds (``time.time()``)."""

    index: int
    kind: str
    param: str = ""
    gap_steps: int = 0
    fired_at: float | None = None
    step_at_fault: int | None = None
    committed_at_fault: int | None = None
    worker_pid: int | None = None
    activity: tuple[str, int] | None = None
    """(activity id, attempt) running on the lost worker when the fault fired."""
    detected_at: float | None = None
    resumed_at: float | None = None
    resumed_from: int | None = None
    reached: int | None = None
    restart: Restart | None = None
    injected: int = 0
    estimated_reach: int | None = None
    """The step the lost worker had reached, from its last commit and the clock (heartbeats
    reach the server throttled, so they report it late)."""
    thawed_at: float | None = None
    """``freeze``: when the frozen worker was let go on (SIGCONT)."""
    zombie_commits: list[int] | None = None
    """``freeze``: steps the thawed worker committed after it was let go on (none: it knew it
    had been superseded); None before the drill read its log."""
    note: str = ""

    @property
    def detection_s(self) -> float | None:
        if self.fired_at is None or self.detected_at is None:
            return None
        return max(0.0, self.detected_at - self.fired_at)

    @property
    def recovery_s(self) -> float | None:
        if self.fired_at is None or self.resumed_at is None:
            return None
        return max(0.0, self.resumed_at - self.fired_at)

    @property
    def after_detection_s(self) -> float | None:
        if self.detected_at is None or self.resumed_at is None:
            return None
        return max(0.0, self.resumed_at - self.detected_at)

    @property
    def recomputed(self) -> int | None:
        """Steps redone, measured: the step the lost attempt reached (its last heartbeat, as the
        retry read it and logged it) minus the step the retry resumed from, as the run's own
        ``recomputed_steps`` counts (no step reported: nothing past the resume point); None when
        no retry resumed. ``estimated_reach``, the drill's clock-based guess, is reported beside
        it and never used for it."""
        if self.resumed_from is None:
            return None
        return max(0, (self.reached if self.reached is not None else self.resumed_from) - self.resumed_from)

    def to_json(self, t0: float) -> dict[str, Any]:
        def rel(t: float | None) -> float | None:
            return None if t is None else round(t - t0, 3)

        return {
            "index": self.index,
            "kind": self.kind,
            "param": self.param,
            "gap_steps": self.gap_steps,
            "fired_at_s": rel(self.fired_at),
            "step_at_fault": self.step_at_fault,
            "committed_at_fault": self.committed_at_fault,
            "worker_pid": self.worker_pid,
            "detection_s": _round(self.detection_s),
            "recovery_s": _round(self.recovery_s),
            "resumed_after_detection_s": _round(self.after_detection_s),
            "resumed_from": self.resumed_from,
            "reached": self.reached,
            "estimated_reach": self.estimated_reach,
            "recomputed_steps": self.recomputed,
            "server_down_s": _round(self.restart.seconds) if self.restart else None,
            "injected_faults": self.injected,
            "frozen_s": _round(self.thawed_at - self.fired_at) if self.thawed_at and self.fired_at else None,
            "zombie_commits": self.zombie_commits,
            "note": self.note,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def zombie_commits(
    rec: FaultRecord, commits: list[Commit], worker: str | None, window_s: float, every: int
) -> list[int]:
    """Steps a frozen ``worker``'s attempt committed once thawed: the commits it created within
    ``window_s`` (the heartbeat timeout) of the thaw, at steps up to an interval past the last
    commit before the freeze (where that attempt was; a segment the worker takes later resumes
    from the retry's commits). A save that found its step committed already wrote nothing, and a
    step the retry resumed from existed before the retry started, so before the thaw: a commit the
    freeze caught between its write and its log line, logged once thawed, is not the zombie's."""
    if rec.thawed_at is None or worker is None:
        return []
    until, reach = rec.thawed_at + window_s, (rec.committed_at_fault or 0) + every
    before = -1 if rec.resumed_from is None else rec.resumed_from
    return sorted(
        c.step
        for c in commits
        if c.created and c.worker == worker and rec.thawed_at <= c.at <= until and before < c.step <= reach
    )


def check_targets(
    schedule: list[PlannedFault],
    store: str,
    restartable: frozenset[str],
    service: bool,
    endpoint: bool = True,
    workers: int = 2,
) -> None:
    """Refuse, before anything starts, faults this stack and store cannot take."""
    kinds = {f.kind for f in schedule}
    need_s3 = {"kill-in-upload", "storage-brownout", "s3-restart"} & kinds
    if need_s3 and not store.startswith("s3://"):
        raise ConfigError(
            "--targets", expected="an s3:// store for " + ", ".join(sorted(need_s3)), found=f"store {store}"
        )
    if need_s3 and not endpoint:
        raise ConfigError(
            "AWS_ENDPOINT_URL_S3",
            expected="an S3 endpoint the fault proxy can front, for " + ", ".join(sorted(need_s3)),
            found="unset",
        )
    cannot = sorted(k for k in kinds & set(SERVER_FAULTS) if FAULT_SERVER[k] not in restartable)
    if cannot:
        raise ConfigError("--targets", expected="the embedded stack (--stack embedded) for", found=", ".join(cannot))
    if ({"kill-after-effect", "service-restart"} & kinds) and not service:
        raise ConfigError("--targets", expected="a reservation service (CAIRN_RESERVATION_URL)", found="none")
    if "freeze" in kinds and workers < 2:
        raise ConfigError(
            "--workers", expected=">= 2 for freeze (another worker takes the frozen one's segment)", found=workers
        )


class FaultInjector:
    """Fires one drill's planned faults against its pool, stack and fault proxy, one at a time."""

    def __init__(
        self,
        spec: DrillSpec,
        stack: DrillStack,
        state_dir: Path,
        pool: WorkerPool,
        watch: RunWatch,
        *,
        store: Any,
        run_id: str,
        every: int,
        step_seconds: float,
        proxy: FaultProxy | None,
        heartbeat_timeout: float | None = None,
    ) -> None:
        self.spec, self.stack, self.state_dir, self.pool, self.watch = spec, stack, state_dir, pool, watch
        self.store, self.run_id, self.every, self.step_seconds, self.proxy = store, run_id, every, step_seconds, proxy
        self.heartbeat_timeout = spec.heartbeat_timeout_seconds if heartbeat_timeout is None else heartbeat_timeout
        self.rng = random.Random(spec.seed ^ 0x5EED)
        self.restarts: list[Restart] = []
        self.last_fault_step = 0

    def _committed_step(self) -> int | None:
        try:
            ref = latest_committed(self.store, self.run_id)
        except Exception:  # noqa: BLE001 - the store may be the server being restarted
            return None
        return ref.step if ref else None

    def _segment_pid(self) -> int:
        view = self.watch.view
        seg = view.segment if view else None
        alive = self.pool.alive()
        if seg is not None and seg.worker_pid in alive:
            assert seg.worker_pid is not None
            return seg.worker_pid
        return self.rng.choice(alive)

    def _segment_activity(self) -> tuple[str, int] | None:
        view = self.watch.view
        seg = view.segment if view else None
        return (seg.activity_id, seg.attempt) if seg is not None else None

    async def fire(self, planned: PlannedFault) -> FaultRecord:
        """Wait for the fault's moment, fire it, and wait until training recovered from it."""
        watch, pool = self.watch, self.pool
        rec = FaultRecord(planned.index, planned.kind, planned.param, planned.gap_steps)
        if planned.kind == "kill-after-effect":
            return await self._effect_kill(rec)
        start = max(self.last_fault_step, watch.live_step() - planned.gap_steps + 3)
        reached = await watch.until(
            lambda: watch.live_step() >= start + planned.gap_steps and watch.segment_running(), RECOVERY_WAIT_S
        )
        if not reached:
            rec.note = "the run ended before this fault's moment" if watch.done else "training did not reach the step"
            return rec
        await asyncio.sleep(planned.phase * self.every * self.step_seconds)  # a moment inside the interval
        await watch.until(watch.segment_running, RECOVERY_WAIT_S)  # the segment may have just ended
        kind = planned.kind
        rec.step_at_fault = self.last_fault_step = watch.live_step()
        rec.activity = self._segment_activity()
        if kind in ("worker-kill", "sigterm"):
            pid = self._segment_pid()
            rec.fired_at, rec.worker_pid = time.time(), pid
            pool.signal(pid, signal.SIGKILL if kind == "worker-kill" else signal.SIGTERM)
            rec.committed_at_fault = self._committed_step()
            pool.top_up() if kind == "worker-kill" else pool.start()
        elif kind == "freeze":
            pid = self._segment_pid()
            rec.fired_at, rec.worker_pid = time.time(), pid
            pool.signal(pid, signal.SIGSTOP)  # its process group: a hung host
            rec.committed_at_fault = self._committed_step()
            await self._thaw(rec)
        elif kind == "kill-in-upload":
            assert self.proxy is not None
            fired: list[int] = []

            def kill(peer_port: int) -> None:
                pid = pid_of_connection(peer_port, pool.alive()) or self._segment_pid()
                pool.signal(pid, signal.SIGKILL)
                fired.append(pid)
                rec.fired_at, rec.worker_pid = time.time(), pid
                rec.activity = self._segment_activity()

            self.proxy.arm_manifest_kill(kill)
            if not await watch.until(lambda: bool(fired), RECOVERY_WAIT_S):
                self.proxy.disarm()
                rec.note = "no checkpoint upload happened"
                return rec
            rec.step_at_fault = watch.live_step()
            rec.committed_at_fault = self._committed_step()
            pool.top_up()
        elif kind in SERVER_FAULTS:
            restart = await asyncio.to_thread(self.stack.restart, FAULT_SERVER[kind])
            rec.fired_at, rec.restart = restart.down_at, restart
            self.restarts.append(restart)
        elif kind == "storage-brownout":
            assert self.proxy is not None
            seconds = float(planned.param)
            before = self.proxy.faults
            rec.fired_at = time.time()
            self.proxy.set_policy(FaultPolicy(rate=self.spec.brownout_rate, seed=self.spec.seed * 1000 + planned.index))
            await asyncio.sleep(seconds)
            self.proxy.set_policy(FaultPolicy())
            rec.injected = self.proxy.faults - before
            rec.note = f"{rec.injected} request(s) failed over {seconds:.1f} s at rate {self.spec.brownout_rate:g}"
        await self._recovered(rec)
        return rec

    async def _thaw(self, rec: FaultRecord) -> None:
        """Let a frozen worker go on once its segment resumed on another worker and the freeze
        outlasted the heartbeat timeout by ``FREEZE_MARGIN_S`` (or the recovery wait ran out)."""
        assert rec.fired_at is not None and rec.worker_pid is not None
        fired, logs, frozen = rec.fired_at, self.pool.logs, self.pool.names.get(rec.worker_pid)
        least = fired + self.heartbeat_timeout + FREEZE_MARGIN_S

        def elsewhere() -> bool:
            if time.time() < least:
                return False
            resume = logs.resume_after(fired)
            if resume is not None and resume.worker != frozen:
                return True
            view = self.watch.view  # the frozen worker held no segment (it was between activities)
            seg = view.segment if view is not None else None
            return seg is not None and seg.running and seg.worker_pid not in (None, rec.worker_pid)

        if not await self.watch.until(elsewhere, RECOVERY_WAIT_S):
            rec.note = "the segment did not resume elsewhere while the worker was frozen"
        self.pool.signal(rec.worker_pid, signal.SIGCONT)
        rec.thawed_at = time.time()

    def zombie_commits(self, rec: FaultRecord) -> list[int]:
        """``zombie_commits`` of a freeze, from this drill's worker logs (read at its end)."""
        name = self.pool.names.get(rec.worker_pid) if rec.worker_pid is not None else None
        return zombie_commits(rec, self.pool.logs.commits, name, self.heartbeat_timeout, self.every)

    async def _recovered(self, rec: FaultRecord) -> None:
        """Wait until training makes progress again after the fault; record detection and resume."""
        assert rec.fired_at is not None
        watch, logs = self.watch, self.pool.logs
        fired = rec.fired_at
        worker_lost = rec.kind in LOST_WORKER
        if worker_lost:

            def resumed() -> bool:
                return logs.resume_after(fired) is not None

        else:
            ended = rec.restart.up_at if rec.restart else time.time()
            base = rec.step_at_fault or 0

            def resumed() -> bool:
                return any(t >= ended and s > base for t, s in watch.samples[-50:]) or (
                    logs.resume_after(fired) is not None
                )

        ok = await watch.until(lambda: resumed() or watch.done, RECOVERY_WAIT_S)
        logs.poll()
        resume = logs.resume_after(fired)
        if worker_lost and resume is not None:
            rec.resumed_at, rec.resumed_from, rec.reached = resume.at, resume.step, resume.reached
        elif not worker_lost:
            ended = rec.restart.up_at if rec.restart else fired
            progress = [t for t, s in watch.samples if t >= ended and s > (rec.step_at_fault or 0)]
            times = [t for t in (min(progress) if progress else None, resume.at if resume else None) if t is not None]
            rec.resumed_at = min(times) if times else None
            if resume is not None and resume.attempt > 1:
                rec.resumed_from, rec.reached = resume.step, resume.reached
                rec.note = (rec.note + "; " if rec.note else "") + f"segment retried (attempt {resume.attempt})"
        elif not ok:
            rec.note = "no progress after the fault"
        if worker_lost and rec.worker_pid is not None:
            rec.estimated_reach = self._estimate_reach(rec)
        # Detection: the server failed the lost worker's attempt (heartbeat timeout, reported failure).
        rec.detected_at, exact = watch.detected(rec.activity, fired)
        if rec.detected_at is None and worker_lost and rec.activity is not None:
            retry = logs.retry_started_after(fired)  # missed by the polls: the retry's start bounds it
            if retry is not None and rec.resumed_at is not None and retry.at <= rec.resumed_at:
                rec.detected_at, exact = retry.at, False
        if rec.detected_at is not None and not exact:
            rec.note = (rec.note + "; " if rec.note else "") + "detection: upper bound (the retry's dispatch)"
        if worker_lost and rec.activity is None:
            rec.note = (rec.note + "; " if rec.note else "") + "hit between activities"

    def _estimate_reach(self, rec: FaultRecord) -> int | None:
        """The lost worker's step when it died: its last commit plus the steps the clock allows
        since, short of its next commit (or the very step whose manifest was intercepted)."""
        assert rec.fired_at is not None
        if rec.kind == "kill-in-upload" and self.proxy is not None and self.proxy.manifest_kills:
            return self.proxy.manifest_kills[-1][1]
        logs = self.pool.logs
        name = self.pool.names.get(rec.worker_pid or -1)
        mine = [c for c in logs.commits if c.worker == name and c.at <= rec.fired_at]
        ended = [e for e in logs.ends if e.worker == name and e.at <= rec.fired_at]
        starts = [s for s in logs.starts if s.worker == name and s.at <= rec.fired_at]
        if ended and not (starts and max(s.at for s in starts) > max(e.at for e in ended)):
            rec.activity = None  # its segment had ended: the worker was between activities
            return max(ended, key=lambda e: e.at).step
        if not mine:
            return None
        last = max(mine, key=lambda c: c.at)
        per_step = max(self.step_seconds, 1e-3)
        every = self.every
        ahead = int((rec.fired_at - last.at) / per_step)
        return last.step + max(0, min(ahead, every - 1 - last.step % every))

    async def _effect_kill(self, rec: FaultRecord) -> FaultRecord:
        watch = self.watch
        marker = self.state_dir / "effect-fault-fired"
        if not await watch.until(marker.exists, RECOVERY_WAIT_S * 2):
            rec.note = f"the {rec.param} effect never ran"
            return rec
        text = marker.read_text(errors="replace")
        rec.fired_at = marker.stat().st_mtime
        with contextlib.suppress(ValueError, IndexError):
            rec.worker_pid = int(text.split("pid=")[1].split()[0])
        rec.step_at_fault = watch.live_step()
        effect_id = rec.param

        def effect_done() -> bool:
            if watch.done:
                return True
            view = watch.view
            return (
                view is not None
                and view.at > (rec.fired_at or 0) + 0.2
                and all(p.activity_id != effect_id for p in view.pending)
            )

        await watch.until(effect_done, RECOVERY_WAIT_S)
        rec.resumed_at = watch.view.at if watch.view else time.time()
        rec.detected_at, _ = watch.detected((effect_id, 1), rec.fired_at)
        rec.note = f"crashed after the service committed '{effect_id}', before the completion was recorded"
        return rec
