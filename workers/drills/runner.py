"""``cairn drill``: kill workers, servers and storage on a seeded schedule and prove nothing was lost.

A drill starts a TrainingRun (its own task queue, its own workers) on the embedded stack or the
one the environment names, fires the faults of its seeded schedule (``workers.drills.schedule``)
one after another while the run trains, measures for each fault when it was detected and when
training resumed, and ends with a verdict (``workers.drills.verdict``): the final checkpoint
compared field by field with an uninterrupted in-process reference, external effects exactly
once by the service's own records, every committed checkpoint valid, nothing uncommitted left.
The report (``workers.reports.drill``) is a table, ``--json`` and a PNG timeline; the command is
``workers.cli.drill``.

Faults: ``worker-kill`` (SIGKILL the worker running the segment), ``kill-in-upload`` (SIGKILL
it when its manifest PUT reaches the fault proxy: shards written, commit not), ``kill-after-effect``
(the ``CAIRN_FAULT`` hook: after the service committed, before the completion), ``sigterm``
(graceful hand-back), ``temporal-restart`` / ``s3-restart`` / ``service-restart`` (SIGKILL the
server, restart it on its data) and ``storage-brownout`` (the fault proxy fails a seeded share
of requests for a few seconds). A killed worker is replaced at once, as a supervisor would.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cairn.errors import ConfigError
from cairn.numerics import process_profile_name
from workers.drills.faultproxy import FaultPolicy, FaultProxy, pid_of_connection
from workers.drills.observe import RunView, WorkerLogs, run_view
from workers.drills.schedule import (
    SERVER_FAULTS,
    DrillSpec,
    PlannedFault,
    default_total_steps,
    plan_schedule,
)
from workers.drills.stack import DrillStack, EmbeddedStack, EnvStack, Restart
from workers.stack.servers import ServerProcess

__all__ = ["FaultRecord", "DrillResult", "Drill", "WorkerPool", "check_targets", "run_drill"]

REPO = Path(__file__).resolve().parents[1]
POLL_S = 0.15
RECOVERY_WAIT_S = 120.0
"""How long a fault may take to recover before the drill gives up on it (and fails)."""


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
        if self.resumed_from is None:
            return None
        reached = max(self.reached or 0, self.estimated_reach or 0, self.committed_at_fault or 0)
        return max(0, reached - self.resumed_from)

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
            "note": self.note,
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


@dataclass
class DrillResult:
    spec: DrillSpec
    schedule: list[PlannedFault]
    run_id: str
    workflow_id: str
    store: str
    total_steps: int
    checkpoint_every: int
    t0: float
    finished_at: float
    status: str
    summary: dict[str, Any] | None
    faults: list[FaultRecord]
    samples: list[tuple[float, int]]
    logs: WorkerLogs
    restarts: list[Restart]
    worker_starts: list[tuple[float, int]]
    web_ui: str | None
    checks: list[Any] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


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
        for p in self.procs.values():
            p.stop(grace=15.0)


class Drill:
    def __init__(
        self,
        spec: DrillSpec,
        stack: DrillStack,
        state_dir: Path,
        *,
        echo: Callable[[str], None] = print,
        progress: bool = True,
    ) -> None:
        self.spec, self.stack, self.state_dir, self.echo, self.show_progress = spec, stack, state_dir, echo, progress
        self.schedule = plan_schedule(spec)
        self.rng = random.Random(spec.seed ^ 0x5EED)
        self.view: RunView | None = None
        self.samples: list[tuple[float, int]] = []
        self.unanswered = 0
        """Polls of the server that got no answer (it was down, or too slow)."""
        self.attempt_seen: dict[tuple[str, int], float] = {}
        """(activity id, attempt) -> when the server had failed the attempt before it."""
        self.failure_known: set[tuple[str, int]] = set()
        """Attempts whose predecessor's failure time the server told (else: a bound)."""
        self.restarts: list[Restart] = []
        self.proxy: FaultProxy | None = None
        self.client: Any = None
        self.handle: Any = None
        self.done = False
        self.every = spec.checkpoint_every
        self.step_seconds = spec.step_seconds
        self.last_fault_step = 0

    # -- setup ----------------------------------------------------------------------------------
    def _store_url(self) -> str:
        if self.spec.store:
            return self.spec.store
        if self.stack.s3_bucket is None:
            raise ConfigError("--store", expected="a store (s3://bucket/prefix or an absolute path)", found="none")
        return f"s3://{self.stack.s3_bucket}/drills"

    def _run_input(self, run_id: str, store: str) -> Any:
        from activities.models import TrainingRunInput
        from cairn.config import load_config
        from workers.run_input import load_run_input

        spec = self.spec
        effects = (
            {"service_url": self.stack.service_url, "timeout_seconds": max(2.0, spec.heartbeat_timeout_seconds)}
            if self.stack.service_url
            else None
        )
        if spec.run:
            base = load_run_input(spec.run).model_dump(mode="json")
            base.update(run_id=run_id, store=store, effects=effects, carry=None, numerics=process_profile_name())
            if base.get("retention") is not None:
                base["retention"]["grace_seconds"] = min(base["retention"]["grace_seconds"], 5.0)
            return TrainingRunInput.model_validate(base)
        config = load_config(spec.config or str(REPO / "examples" / "config.json"))
        total = default_total_steps(spec, self.schedule)
        return TrainingRunInput.model_validate(
            {
                "run_id": run_id,
                "config": config.model_dump(mode="json"),
                "total_steps": total,
                "store": store,
                "steps_per_segment": spec.steps_per_segment,
                "checkpoint": {"every": spec.checkpoint_every},
                "retention": {"keep_last": 3, "grace_seconds": 5.0},
                "heartbeat_timeout_seconds": spec.heartbeat_timeout_seconds,
                "throttle_seconds_per_step": spec.step_seconds,
                "effects": effects,
                "numerics": process_profile_name(),  # the drill's workers and its reference compute under it
            }
        )

    # -- observing --------------------------------------------------------------------------------
    async def _observe(self, pool: WorkerPool) -> None:
        from temporalio.service import RPCError

        while not self.done:
            now = time.time()
            try:
                desc = await asyncio.wait_for(self.handle.describe(), timeout=2.0)
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

    def _live_step(self) -> int:
        return self.samples[-1][1] if self.samples else 0

    def _committed_step(self, store: Any, run_id: str) -> int | None:
        from cairn.checkpoint import latest_committed

        try:
            ref = latest_committed(store, run_id)
        except Exception:  # noqa: BLE001 - the store may be the server being restarted
            return None
        return ref.step if ref else None

    async def _until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.done or time.monotonic() > deadline:
                return predicate()
            await asyncio.sleep(POLL_S / 2)
        return True

    def _segment_running(self) -> bool:
        seg = self.view.segment if self.view is not None else None
        return seg is not None and seg.running and seg.step is not None

    def _segment_pid(self, pool: WorkerPool) -> int:
        seg = self.view.segment if self.view else None
        alive = pool.alive()
        if seg is not None and seg.worker_pid in alive:
            assert seg.worker_pid is not None
            return seg.worker_pid
        return self.rng.choice(alive)

    # -- faults -----------------------------------------------------------------------------------
    async def _fire(self, planned: PlannedFault, pool: WorkerPool, store: Any, run_id: str) -> FaultRecord:
        rec = FaultRecord(planned.index, planned.kind, planned.param, planned.gap_steps)
        if planned.kind == "kill-after-effect":
            return await self._effect_kill(rec, pool)
        start = max(self.last_fault_step, self._live_step() - planned.gap_steps + 3)
        reached = await self._until(
            lambda: self._live_step() >= start + planned.gap_steps and self._segment_running(), RECOVERY_WAIT_S
        )
        if not reached:
            rec.note = "the run ended before this fault's moment" if self.done else "training did not reach the step"
            return rec
        await asyncio.sleep(planned.phase * self.every * self.step_seconds)  # a moment inside the interval
        await self._until(self._segment_running, RECOVERY_WAIT_S)  # the segment may have just ended
        kind = planned.kind
        rec.step_at_fault = self.last_fault_step = self._live_step()
        seg = self.view.segment if self.view else None
        rec.activity = (seg.activity_id, seg.attempt) if seg is not None else None
        if kind in ("worker-kill", "sigterm"):
            pid = self._segment_pid(pool)
            rec.fired_at, rec.worker_pid = time.time(), pid
            pool.signal(pid, signal.SIGKILL if kind == "worker-kill" else signal.SIGTERM)
            rec.committed_at_fault = self._committed_step(store, run_id)
            pool.top_up() if kind == "worker-kill" else pool.start()
        elif kind == "kill-in-upload":
            assert self.proxy is not None
            fired: list[int] = []

            def kill(peer_port: int) -> None:
                pid = pid_of_connection(peer_port, pool.alive()) or self._segment_pid(pool)
                pool.signal(pid, signal.SIGKILL)
                fired.append(pid)
                rec.fired_at, rec.worker_pid = time.time(), pid
                seg = self.view.segment if self.view else None
                rec.activity = (seg.activity_id, seg.attempt) if seg is not None else None

            self.proxy.arm_manifest_kill(kill)
            if not await self._until(lambda: bool(fired), RECOVERY_WAIT_S):
                self.proxy.disarm()
                rec.note = "no checkpoint upload happened"
                return rec
            rec.step_at_fault = self._live_step()
            rec.committed_at_fault = self._committed_step(store, run_id)
            pool.top_up()
        elif kind in SERVER_FAULTS:
            server = _SERVER[kind]
            restart = await asyncio.to_thread(self.stack.restart, server)
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
        await self._recovered(rec, pool)
        return rec

    async def _recovered(self, rec: FaultRecord, pool: WorkerPool) -> None:
        """Wait until training makes progress again after the fault; record detection and resume."""
        assert rec.fired_at is not None
        fired = rec.fired_at
        worker_lost = rec.kind in ("worker-kill", "kill-in-upload", "sigterm", "kill-after-effect")
        if worker_lost:

            def resumed() -> bool:
                return pool.logs.resume_after(fired) is not None

        else:
            ended = rec.restart.up_at if rec.restart else time.time()
            base = rec.step_at_fault or 0

            def resumed() -> bool:
                return any(t >= ended and s > base for t, s in self.samples[-50:]) or (
                    pool.logs.resume_after(fired) is not None
                )

        ok = await self._until(lambda: resumed() or self.done, RECOVERY_WAIT_S)
        pool.logs.poll()
        resume = pool.logs.resume_after(fired)
        if worker_lost and resume is not None:
            rec.resumed_at, rec.resumed_from, rec.reached = resume.at, resume.step, resume.reached
        elif not worker_lost:
            ended = rec.restart.up_at if rec.restart else fired
            progress = [t for t, s in self.samples if t >= ended and s > (rec.step_at_fault or 0)]
            times = [t for t in (min(progress) if progress else None, resume.at if resume else None) if t is not None]
            rec.resumed_at = min(times) if times else None
            if resume is not None and resume.attempt > 1:
                rec.resumed_from, rec.reached = resume.step, resume.reached
                rec.note = (rec.note + "; " if rec.note else "") + f"segment retried (attempt {resume.attempt})"
        elif not ok:
            rec.note = "no progress after the fault"
        if worker_lost and rec.worker_pid is not None:
            rec.estimated_reach = self._estimate_reach(rec, pool)
        # Detection: the server failed the lost worker's attempt (heartbeat timeout, reported failure).
        rec.detected_at, exact = self._detected(rec.activity, fired)
        if rec.detected_at is None and worker_lost and rec.activity is not None:
            retry = pool.logs.retry_started_after(fired)  # missed by the polls: the retry's start bounds it
            if retry is not None and rec.resumed_at is not None and retry.at <= rec.resumed_at:
                rec.detected_at, exact = retry.at, False
        if rec.detected_at is not None and not exact:
            rec.note = (rec.note + "; " if rec.note else "") + "detection: upper bound (the retry's dispatch)"
        if worker_lost and rec.activity is None:
            rec.note = (rec.note + "; " if rec.note else "") + "hit between activities"

    def _detected(self, activity: tuple[str, int] | None, fired: float) -> tuple[float | None, bool]:
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

    def _estimate_reach(self, rec: FaultRecord, pool: WorkerPool) -> int | None:
        """The lost worker's step when it died: its last commit plus the steps the clock allows
        since, short of its next commit (or the very step whose manifest was intercepted)."""
        assert rec.fired_at is not None
        if rec.kind == "kill-in-upload" and self.proxy is not None and self.proxy.manifest_kills:
            return self.proxy.manifest_kills[-1][1]
        name = pool.names.get(rec.worker_pid or -1)
        mine = [c for c in pool.logs.commits if c.worker == name and c.at <= rec.fired_at]
        ended = [e for e in pool.logs.ends if e.worker == name and e.at <= rec.fired_at]
        starts = [s for s in pool.logs.starts if s.worker == name and s.at <= rec.fired_at]
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

    async def _effect_kill(self, rec: FaultRecord, pool: WorkerPool) -> FaultRecord:
        marker = self.state_dir / "effect-fault-fired"
        if not await self._until(marker.exists, RECOVERY_WAIT_S * 2):
            rec.note = f"the {rec.param} effect never ran"
            return rec
        text = marker.read_text(errors="replace")
        rec.fired_at = marker.stat().st_mtime
        with contextlib.suppress(ValueError, IndexError):
            rec.worker_pid = int(text.split("pid=")[1].split()[0])
        rec.step_at_fault = self._live_step()
        effect_id = rec.param

        def effect_done() -> bool:
            if self.done:
                return True
            view = self.view
            return (
                view is not None
                and view.at > (rec.fired_at or 0) + 0.2
                and all(p.activity_id != effect_id for p in view.pending)
            )

        await self._until(effect_done, RECOVERY_WAIT_S)
        rec.resumed_at = self.view.at if self.view else time.time()
        rec.detected_at, _ = self._detected((effect_id, 1), rec.fired_at)
        rec.note = f"crashed after the service committed '{effect_id}', before the completion was recorded"
        return rec

    # -- the drill ---------------------------------------------------------------------------------
    async def run(self) -> DrillResult:
        from activities.models import RunSummary
        from cairn.stores import open_store
        from workers.client import WORKFLOW_TASK_TIMEOUT, connect
        from workflows.training_run import TrainingRun

        spec = self.spec
        store_url = self._store_url()
        check_targets(self.schedule, store_url, self.stack.restartable, self.stack.service_url is not None)
        run_id = f"drill-{spec.seed}-{uuid.uuid4().hex[:6]}"
        inp = self._run_input(run_id, store_url)
        self.every, self.step_seconds = inp.checkpoint.every, inp.throttle_seconds_per_step
        queue = f"cairn-drill-{uuid.uuid4().hex[:8]}"
        env = {"CAIRN_METRICS_PORT": "off", "CAIRN_LOG_FORMAT": "json"}
        if inp.config.trainer is not None:  # the trainer's package is imported before the first fault
            env["CAIRN_PRELOAD"] = inp.config.trainer.factory.partition(":")[0]
        if self.stack.s3_endpoint:
            os.environ["AWS_ENDPOINT_URL_S3"] = self.stack.s3_endpoint  # the drill reads the store directly
            self.proxy = FaultProxy(self.stack.s3_endpoint)
            env["AWS_ENDPOINT_URL_S3"] = self.proxy.url  # workers reach it through the fault proxy
        effect_kill = next((f for f in self.schedule if f.kind == "kill-after-effect"), None)
        if effect_kill is not None:
            env["CAIRN_FAULT"] = f"after-effect-before-complete:{effect_kill.param}"
            env["CAIRN_FAULT_ONCE"] = str(self.state_dir / "effect-fault-fired")
        store = open_store(store_url)
        if hasattr(store, "ensure_bucket"):
            store.ensure_bucket()
        pool = WorkerPool(spec, self.stack, queue, env, self.state_dir / "logs")
        for _ in range(spec.workers):
            pool.start()
        await asyncio.to_thread(pool.wait_polling)
        self.client = await connect(self.stack.temporal_address, self.stack.namespace)
        faults: list[FaultRecord] = []
        summary: dict[str, Any] | None = None
        observer: asyncio.Task[None] | None = None
        bar = None
        t0 = time.time()
        try:
            self.handle = await self.client.start_workflow(
                TrainingRun.run, inp, id=run_id, task_queue=queue, task_timeout=WORKFLOW_TASK_TIMEOUT
            )
            t0 = time.time()
            url = self._web_ui_link(run_id)
            self.echo(
                f"drill {run_id}: {inp.total_steps} steps, checkpoint every {inp.checkpoint.every}, "
                f"{spec.workers} worker(s), {len(self.schedule)} fault(s), seed {spec.seed}"
            )
            self.echo(
                "schedule: " + ", ".join(f"{f.kind}{'(' + f.param + ')' if f.param else ''}" for f in self.schedule)
            )
            if url:
                self.echo(f"Web UI: {url}")
            observer = asyncio.create_task(self._observe(pool))
            if self.show_progress:
                from tqdm import tqdm

                bar = tqdm(total=inp.total_steps, desc=run_id, unit="step", leave=False, file=sys.stderr, disable=None)

            async def progress() -> None:
                while bar is not None and not self.done:
                    bar.n = self._live_step()
                    bar.set_postfix(
                        faults=f"{len(faults)}/{len(self.schedule)}", workers=len(pool.alive()), refresh=True
                    )
                    await asyncio.sleep(0.3)

            ticker = asyncio.create_task(progress())
            for planned in self.schedule:
                if self.done and planned.kind != "kill-after-effect":
                    faults.append(
                        FaultRecord(
                            planned.index, planned.kind, planned.param, planned.gap_steps, note="run ended first"
                        )
                    )
                    continue
                faults.append(await self._fire(planned, pool, store, run_id))
            result = await asyncio.wait_for(self.handle.result(), timeout=max(300.0, inp.total_steps * 0.5))
            summary = RunSummary.model_validate(result).model_dump(mode="json")
            self.done = True
            ticker.cancel()
        except Exception as exc:  # noqa: BLE001 - the verdict reports it
            self.echo(f"drill: the run did not complete: {type(exc).__name__}: {exc}")
        finally:
            self.done = True
            if observer is not None:
                with contextlib.suppress(Exception):
                    await observer
            if bar is not None:
                bar.close()
            finished = time.time()
            pool.stop_all()
            pool.logs.poll()
            if self.proxy is not None:
                self.proxy.close()
        status = "UNKNOWN"
        with contextlib.suppress(Exception):
            desc = await self.handle.describe()
            status = desc.status.name if desc.status else status
        return DrillResult(
            spec=spec,
            schedule=self.schedule,
            run_id=run_id,
            workflow_id=run_id,
            store=store_url,
            total_steps=inp.total_steps,
            checkpoint_every=inp.checkpoint.every,
            t0=t0,
            finished_at=finished,
            status=status,
            summary=summary,
            faults=faults,
            samples=self.samples,
            logs=pool.logs,
            restarts=self.restarts,
            worker_starts=pool.starts,
            web_ui=self._web_ui_link(run_id),
            extra={
                "config": inp.config.model_dump(mode="json"),
                "effects": inp.effects is not None,
                "service_url": self.stack.service_url,
                "unanswered_polls": self.unanswered,
            },
        )

    def _web_ui_link(self, run_id: str) -> str | None:
        if not self.stack.web_ui:
            return None
        return f"{self.stack.web_ui}/namespaces/{self.stack.namespace}/workflows/{run_id}"


_SERVER = {"temporal-restart": "temporal", "s3-restart": "s3", "service-restart": "service"}


def check_targets(
    schedule: list[PlannedFault], store: str, restartable: frozenset[str], service: bool, endpoint: bool = True
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
    cannot = sorted(k for k in kinds & set(SERVER_FAULTS) if _SERVER[k] not in restartable)
    if cannot:
        raise ConfigError("--targets", expected="the embedded stack (--stack embedded) for", found=", ".join(cannot))
    if ({"kill-after-effect", "service-restart"} & kinds) and not service:
        raise ConfigError("--targets", expected="a reservation service (CAIRN_RESERVATION_URL)", found="none")


def run_drill(
    spec: DrillSpec,
    *,
    out: Path,
    stack: DrillStack | None = None,
    echo: Callable[[str], None] = print,
    progress: bool = True,
) -> tuple[DrillResult, dict[str, Any]]:
    """Run a whole drill: stack (unless given), run, faults, verdict, report files in ``out``.
    Returns the result and the report (what ``--json`` prints)."""
    from workers.drills.verdict import judge
    from workers.reports.drill import write_report

    out.mkdir(parents=True, exist_ok=True)
    own = stack is None
    if stack is None and spec.stack == "env":
        stack = EnvStack.from_env()
    if stack is None:  # what the embedded stack will offer, checked before it starts
        store = spec.store or "s3://embedded"
        check_targets(plan_schedule(spec), store, frozenset(_SERVER.values()), True)
    else:
        store = spec.store or (f"s3://{stack.s3_bucket}/drills" if stack.s3_bucket else "")
        check_targets(
            plan_schedule(spec), store, stack.restartable, stack.service_url is not None, stack.s3_endpoint is not None
        )
    state_dir = Path(tempfile.mkdtemp(prefix="cairn-drill-"))
    try:
        if stack is None:
            stack = EmbeddedStack.start(state_dir / "stack", web_ui=spec.web_ui, echo=echo)
        drill = Drill(spec, stack, state_dir, echo=echo, progress=progress)
        result = asyncio.run(drill.run())
        result.checks = judge(result)
        report = write_report(result, out)
    finally:
        if own and stack is not None:
            stack.close()
        # The logs stay with the report; the servers' data goes.
        (out / "logs").mkdir(exist_ok=True)
        for log in [*(state_dir / "logs").glob("*.log"), *(state_dir / "stack" / "logs").glob("*.log")]:
            shutil.copy2(log, out / "logs" / log.name)
        shutil.rmtree(state_dir, ignore_errors=True)
    return result, report
