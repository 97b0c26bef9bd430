"""``cairn drill``'s main loop: a TrainingRun under a seeded schedule of faults, then a verdict.

``Drill.run`` starts the run (its own task queue, its own workers) on the embedded stack or the
one the environment names, fires the faults of its schedule (``workers.drills.schedule``) one
after another while it trains (``workers.drills.faults``) and returns a ``DrillResult``;
``run_drill`` adds the stack, the verdict (``workers.drills.verdict``) and the report files
(``workers.reports.drill``). The command is ``workers.cli.drill``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from activities.inputs import TrainingRunInput
from activities.views import RunSummary
from cairn.config import load_config
from cairn.errors import ConfigError
from cairn.numerics import process_profile_name
from cairn.stores import open_store
from cairn.trainers import load_trainer
from workers.client import WORKFLOW_TASK_TIMEOUT, connect
from workers.drills.faultproxy import FaultProxy
from workers.drills.faults import FAULT_SERVER, FaultInjector, FaultRecord, check_targets
from workers.drills.observe import WorkerLogs
from workers.drills.pool import WorkerPool
from workers.drills.progress import DrillProgress, fault_line
from workers.drills.schedule import DrillSpec, PlannedFault, default_total_steps, plan_schedule
from workers.drills.stack import DrillStack, EmbeddedStack, EnvStack, Restart
from workers.drills.verdict import judge
from workers.drills.watch import RunWatch
from workers.reports.drill import write_report
from workers.run_input import load_run_input
from workflows.training_run import TrainingRun

__all__ = ["DrillResult", "Drill", "run_drill", "run_length"]

REPO = Path(__file__).resolve().parents[2]


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
    """The run's Web UI link, only where it outlives the drill (``keep_stack``, or the env's stack)."""
    heartbeat_timeout_seconds: float | None = None
    """The heartbeat timeout the drilled run used (its input's, not the spec's default)."""
    checks: list[Any] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)


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
        self.spec, self.stack, self.state_dir, self.echo = spec, stack, state_dir, echo
        self.progress = DrillProgress(enabled=progress)
        """Its phase, step and faults, on stderr."""
        self.schedule = plan_schedule(spec)
        self.watch = RunWatch()
        self.proxy: FaultProxy | None = None
        self.client: Any = None
        self.handle: Any = None
        self.ui_lasts = True
        """Whether the stack outlives the drill (else no Web UI link is printed or reported)."""

    # -- setup ----------------------------------------------------------------------------------
    def _store_url(self) -> str:
        if self.spec.store:
            return self.spec.store
        if self.stack.s3_bucket is None:
            raise ConfigError("--store", expected="a store (s3://bucket/prefix or an absolute path)", found="none")
        return f"s3://{self.stack.s3_bucket}/drills"

    def _run_input(self, run_id: str, store: str) -> Any:
        spec = self.spec
        base = load_run_input(spec.run).model_dump(mode="json") if spec.run else {}
        if spec.run and "heartbeat_timeout_seconds" in spec.model_fields_set:
            base["heartbeat_timeout_seconds"] = spec.heartbeat_timeout_seconds  # --heartbeat-timeout given
        heartbeat = float(base.get("heartbeat_timeout_seconds", spec.heartbeat_timeout_seconds))
        effects = (
            {"service_url": self.stack.service_url, "timeout_seconds": max(2.0, heartbeat)}
            if self.stack.service_url
            else None
        )
        if spec.run:
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

    # -- the drill ---------------------------------------------------------------------------------
    async def run(self) -> DrillResult:
        spec, watch = self.spec, self.watch
        store_url = self._store_url()
        check_targets(
            self.schedule, store_url, self.stack.restartable, self.stack.service_url is not None, workers=spec.workers
        )
        run_id = f"drill-{spec.seed}-{uuid.uuid4().hex[:6]}"
        inp = self._run_input(run_id, store_url)
        total_steps, length = run_length(inp)
        queue = f"cairn-drill-{uuid.uuid4().hex[:8]}"
        env = {"CAIRN_METRICS_PORT": "off", "CAIRN_LOG_FORMAT": "json"}
        preload = ""
        if inp.config.trainer is not None:  # the trainer's package is imported before the first fault
            preload = env["CAIRN_PRELOAD"] = inp.config.trainer.factory.partition(":")[0]
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
        injector = FaultInjector(
            spec,
            self.stack,
            self.state_dir,
            pool,
            watch,
            store=store,
            run_id=run_id,
            every=inp.checkpoint.every,
            step_seconds=inp.throttle_seconds_per_step,
            proxy=self.proxy,
            heartbeat_timeout=inp.heartbeat_timeout_seconds,
        )
        progress = self.progress
        progress.phase(
            "starting stack",
            f"{spec.workers} worker(s) on queue {queue}" + (f", preloading {preload}" if preload else ""),
        )
        for _ in range(spec.workers):
            pool.start()
        await asyncio.to_thread(pool.wait_polling)
        self.client = await connect(self.stack.temporal_address, self.stack.namespace)
        faults: list[FaultRecord] = []
        summary: dict[str, Any] | None = None
        observer: asyncio.Task[None] | None = None
        ticker: asyncio.Task[None] | None = None
        t0 = time.time()
        try:
            self.handle = await self.client.start_workflow(
                TrainingRun.run, inp, id=run_id, task_queue=queue, task_timeout=WORKFLOW_TASK_TIMEOUT
            )
            t0 = time.time()
            url = self._web_ui_link(run_id)
            self.echo(
                f"drill {run_id}: {length}, checkpoint every {inp.checkpoint.every}, "
                f"{spec.workers} worker(s), {len(self.schedule)} fault(s), seed {spec.seed}"
            )
            self.echo(
                "schedule: " + ", ".join(f"{f.kind}{'(' + f.param + ')' if f.param else ''}" for f in self.schedule)
            )
            if url:
                self.echo(f"Web UI: {url}")
            observer = asyncio.create_task(watch.follow(self.handle, pool))
            progress.phase("faulted run", f"{run_id}: {length}, {len(self.schedule)} fault(s) planned")
            progress.begin_run(total_steps, len(self.schedule))

            async def show_steps() -> None:
                while not watch.done:
                    progress.step(watch.live_step(), fired=len(faults), workers=len(pool.alive()))
                    await asyncio.sleep(0.3)

            ticker = asyncio.create_task(show_steps())
            for planned in self.schedule:
                if watch.done and planned.kind != "kill-after-effect":
                    faults.append(
                        FaultRecord(
                            planned.index, planned.kind, planned.param, planned.gap_steps, note="run ended first"
                        )
                    )
                    continue
                faults.append(await injector.fire(planned))
                progress.fault(fault_line(faults[-1], len(self.schedule)))
            result = await asyncio.wait_for(self.handle.result(), timeout=max(300.0, total_steps * 0.5))
            summary = RunSummary.model_validate(result).model_dump(mode="json")
            watch.done = True
        except Exception as exc:  # noqa: BLE001 - the verdict reports it
            self.echo(f"drill: the run did not complete: {type(exc).__name__}: {exc}")
        finally:
            watch.done = True
            if ticker is not None:
                ticker.cancel()
            if observer is not None:
                with contextlib.suppress(Exception):
                    await observer
            progress.close()
            finished = time.time()
            pool.stop_all()
            pool.logs.poll()
            for fault in faults:
                if fault.kind == "freeze":
                    fault.zombie_commits = injector.zombie_commits(fault)
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
            total_steps=total_steps,
            checkpoint_every=inp.checkpoint.every,
            t0=t0,
            finished_at=finished,
            status=status,
            summary=summary,
            faults=faults,
            samples=watch.samples,
            logs=pool.logs,
            restarts=injector.restarts,
            worker_starts=pool.starts,
            web_ui=self._web_ui_link(run_id),
            heartbeat_timeout_seconds=inp.heartbeat_timeout_seconds,
            extra={
                "config": inp.config.model_dump(mode="json"),
                "effects": inp.effects is not None,
                "service_url": self.stack.service_url,
                "unanswered_polls": watch.unanswered,
            },
        )

    def _web_ui_link(self, run_id: str) -> str | None:
        if not self.stack.web_ui or not self.ui_lasts:
            return None
        return f"{self.stack.web_ui}/namespaces/{self.stack.namespace}/workflows/{run_id}"


def run_length(inp: TrainingRunInput) -> tuple[int, str]:
    """The drilled run's length in steps, and in words: a run given in epochs (``total_epochs``)
    is as long as its trainer's epochs, which the workflow learns from its first activity and
    the drill from the same trainer, built here (it also trains the drill's reference)."""
    if inp.total_steps is not None:
        return inp.total_steps, f"{inp.total_steps} steps"
    assert inp.total_epochs is not None  # the input holds exactly one of the two
    per_epoch = load_trainer(inp.config).steps_per_epoch
    total = inp.total_epochs * per_epoch
    return total, f"{total} steps ({inp.total_epochs} epochs of {per_epoch})"


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
    out.mkdir(parents=True, exist_ok=True)
    own = stack is None
    keep = own and spec.keep_stack and spec.stack == "embedded"
    if stack is None and spec.stack == "env":
        stack = EnvStack.from_env()
    if stack is None:  # what the embedded stack will offer, checked before it starts
        store = spec.store or "s3://embedded"
        check_targets(plan_schedule(spec), store, frozenset(FAULT_SERVER.values()), True, workers=spec.workers)
    else:
        store = spec.store or (f"s3://{stack.s3_bucket}/drills" if stack.s3_bucket else "")
        check_targets(
            plan_schedule(spec),
            store,
            stack.restartable,
            stack.service_url is not None,
            stack.s3_endpoint is not None,
            workers=spec.workers,
        )
    state_dir = Path(tempfile.mkdtemp(prefix="cairn-drill-"))
    shown = DrillProgress(enabled=progress)
    try:
        if stack is None:
            shown.phase("starting stack", "embedded Temporal, SeaweedFS and reservation service")
            stack = EmbeddedStack.start(state_dir / "stack", web_ui=spec.web_ui, echo=echo)
        else:
            shown.phase("starting stack", f"using servers already running: Temporal {stack.temporal_address}")
        drill = Drill(spec, stack, state_dir, echo=echo, progress=progress)
        drill.ui_lasts = keep or not own
        result = asyncio.run(drill.run())
        result.checks = judge(result, shown.phase)
        if keep and isinstance(stack, EmbeddedStack):
            result.extra["kept_stack"] = kept_stack(stack, state_dir)
        report = write_report(result, out)
    finally:
        if own and stack is not None and not keep:
            stack.close()
        # The logs stay with the report; the servers' data goes (unless the stack is kept).
        (out / "logs").mkdir(exist_ok=True)
        for log in [*(state_dir / "logs").glob("*.log"), *(state_dir / "stack" / "logs").glob("*.log")]:
            shutil.copy2(log, out / "logs" / log.name)
        if not keep:
            shutil.rmtree(state_dir, ignore_errors=True)
    return result, report


def kept_stack(stack: EmbeddedStack, state_dir: Path) -> dict[str, Any]:
    """What a kept stack is and how to stop it (each server leads its own process group)."""
    groups = " ".join(f"-{s.proc.pid}" for s in stack.servers.values() if s.proc.alive())
    return {
        "temporal": stack.temporal_address,
        "s3": stack.s3_endpoint,
        "service": stack.service_url,
        "web_ui": stack.web_ui,
        "state_dir": str(state_dir),
        "pids": {name: s.proc.pid for name, s in stack.servers.items() if s.proc.alive()},
        "stop": f"kill -TERM -- {groups} && rm -rf {state_dir}",
    }
