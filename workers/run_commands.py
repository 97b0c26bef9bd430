"""``cairn run ...`` and ``cairn worker``: start, watch and steer TrainingRun workflows."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from activities.models import DEFAULT_TASK_QUEUE, WORKFLOW_TYPE, RunProgress, RunSummary, TrainingRunInput
from cairn.config import config_error_from
from cairn.errors import ConfigError, TemporalUnavailableError
from workers.client import add_connection_args, connect

__all__ = ["register", "load_run_input", "live_step"]


def load_run_input(path: str) -> TrainingRunInput:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: run file not found") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    try:
        return TrainingRunInput.model_validate(data)
    except ValidationError as exc:
        raise config_error_from(exc, path) from exc


def _async(fn: Callable[[argparse.Namespace, Client], Any]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        async def go() -> int:
            try:
                client = await connect(args.address, args.namespace)
            except RuntimeError as exc:  # the SDK's connection failure
                raise TemporalUnavailableError(f"cannot connect to Temporal: {exc}") from exc
            try:
                code: int = await fn(args, client)
                return code
            except RPCError as exc:
                raise TemporalUnavailableError(f"Temporal refused: {exc.message}") from exc

        return asyncio.run(go())

    return handler


def _print(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    print(json.dumps(payload, sort_keys=True, default=str) if args.json else text)


def _summary_text(s: RunSummary) -> str:
    lines = [
        f"run {s.run_id}: {s.steps}/{s.total_steps} steps{' (stopped early)' if s.stopped_early else ''}",
        f"checkpoint   {s.checkpoint}",
        f"fingerprint  {s.fingerprint}",
        f"attempts     {s.attempts}  recomputed {s.recomputed_steps} step(s)  continued-as-new {s.continued_as_new}x",
    ]
    if s.loss is not None:
        lines.append(f"loss         {s.loss:.6f}")
    for name, receipt in s.effects.items():
        lines.append(f"effect       {name}: {receipt}")
    return "\n".join(lines)


async def _start(args: argparse.Namespace, client: Client) -> int:
    inp = load_run_input(args.run_file)
    workflow_id = args.workflow_id or inp.run_id
    handle = await client.start_workflow(WORKFLOW_TYPE, inp, id=workflow_id, task_queue=args.task_queue)
    if not args.wait:
        _print(
            args,
            {"workflow_id": workflow_id, "run_id": handle.result_run_id, "task_queue": args.task_queue},
            f"started {WORKFLOW_TYPE} {workflow_id} on task queue {args.task_queue!r}\n"
            f"  watch:  cairn run watch {workflow_id}\n  result: cairn run result {workflow_id}",
        )
        return 0
    return await _show_result(args, client, workflow_id)


async def _show_result(args: argparse.Namespace, client: Client, workflow_id: str) -> int:
    handle = client.get_workflow_handle(workflow_id)
    try:
        summary = RunSummary.model_validate(await handle.result())
    except WorkflowFailureError as exc:
        cause = exc.cause
        message = getattr(cause, "message", None) or str(cause)
        _print(args, {"workflow_id": workflow_id, "status": "failed", "error": message}, f"run failed: {message}")
        return 1
    _print(args, {"workflow_id": workflow_id, "status": "completed", **summary.model_dump()}, _summary_text(summary))
    return 0


async def _result(args: argparse.Namespace, client: Client) -> int:
    return await _show_result(args, client, args.workflow_id)


async def _progress(client: Client, workflow_id: str) -> RunProgress:
    raw = await client.get_workflow_handle(workflow_id).query("progress")
    return RunProgress.model_validate(raw)


async def _status(args: argparse.Namespace, client: Client) -> int:
    handle = client.get_workflow_handle(args.workflow_id)
    desc = await handle.describe()
    status = desc.status.name if desc.status else "UNKNOWN"
    progress = await _progress(client, args.workflow_id)
    payload = {"workflow_id": args.workflow_id, "status": status, **progress.model_dump()}
    text = (
        f"{args.workflow_id}: {status} — {progress.phase}, step {progress.step}/{progress.total}"
        f"{f', loss {progress.loss:.4f}' if progress.loss is not None else ''}\n"
        f"  checkpoint {progress.checkpoint}\n  attempts {progress.attempts}, recomputed {progress.recomputed_steps}"
    )
    _print(args, payload, text)
    return 0


def live_step(desc: Any) -> int | None:
    """The running segment's step, from its last heartbeat (finer than the workflow's view)."""
    steps = []
    for pending in desc.raw_description.pending_activities:
        for payload in pending.heartbeat_details.payloads:
            try:
                value = json.loads(payload.data)
            except ValueError:
                continue
            if isinstance(value, dict) and isinstance(value.get("step"), int):
                steps.append(value["step"])
    return max(steps) if steps else None


async def _watch(args: argparse.Namespace, client: Client) -> int:
    from tqdm import tqdm

    handle = client.get_workflow_handle(args.workflow_id)
    bar: tqdm[Any] | None = None
    while True:
        desc = await handle.describe()
        progress = await _progress(client, args.workflow_id)
        if bar is None:
            bar = tqdm(total=progress.total, desc=args.workflow_id, unit="step")
        bar.n = max(progress.step, live_step(desc) or 0)
        bar.set_postfix(
            phase=progress.phase,
            loss="-" if progress.loss is None else f"{progress.loss:.4f}",
            attempts=sum(progress.attempts),
            refresh=False,
        )
        bar.refresh()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            bar.close()
            break
        await asyncio.sleep(args.interval)
    return await _show_result(args, client, args.workflow_id)


async def _journal(args: argparse.Namespace, client: Client) -> int:
    from activities.models import RunInfo
    from cairn.effects import load_journal
    from cairn.stores import open_store

    info = RunInfo.model_validate(await client.get_workflow_handle(args.workflow_id).query("info"))
    journal = load_journal(open_store(info.store), info.run_id)
    payload = {"workflow_id": args.workflow_id, **journal.model_dump(mode="json")}
    lines = [f"journal of run {info.run_id} (version {journal.version}, store {info.store})"]
    for i, e in enumerate(journal.entries, 1):
        receipt = f" -> {e.receipt}" if e.receipt else ""
        detail = f"  {json.dumps(e.detail, sort_keys=True)}" if e.detail else ""
        lines.append(f"{i:>3}. {e.kind:<11} {e.effect:<8} key={e.key}{receipt}{detail}")
    pending = journal.pending_intents()
    if pending:
        lines.append(f"pending intents (outcome unknown until reconciled with the service): {[e.key for e in pending]}")
    _print(args, payload, "\n".join(lines))
    return 0


def _signal(name: str) -> Callable[[argparse.Namespace, Client], Any]:
    async def send(args: argparse.Namespace, client: Client) -> int:
        await client.get_workflow_handle(args.workflow_id).signal(name)
        _print(args, {"workflow_id": args.workflow_id, "signal": name}, f"sent {name} to {args.workflow_id}")
        return 0

    return send


async def _rollback(args: argparse.Namespace, client: Client) -> int:
    await client.get_workflow_handle(args.workflow_id).signal("rollback", args.step)
    _print(args, {"workflow_id": args.workflow_id, "rollback": args.step}, f"sent rollback to step {args.step}")
    return 0


async def _cancel(args: argparse.Namespace, client: Client) -> int:
    await client.get_workflow_handle(args.workflow_id).cancel()
    _print(
        args,
        {"workflow_id": args.workflow_id, "cancel": "requested"},
        f"cancel requested for {args.workflow_id} (the running segment checkpoints first)",
    )
    return 0


def _worker(args: argparse.Namespace) -> int:
    from workers.worker import run

    return asyncio.run(run(args))


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    from workers.worker import add_worker_args

    p = sub.add_parser("worker", help="run a Temporal worker (workflows + activities)")
    common(p)
    add_worker_args(p)
    p.set_defaults(handler=_worker)

    run = sub.add_parser("run", help="start, watch and steer TrainingRun workflows")
    run_sub = run.add_subparsers(dest="run_command", required=True)

    def leaf(name: str, help_text: str, fn: Callable[[argparse.Namespace, Client], Any]) -> argparse.ArgumentParser:
        p = run_sub.add_parser(name, help=help_text)
        common(p)
        add_connection_args(p)
        p.set_defaults(handler=_async(fn), exit_hard=True)
        return p

    p = leaf("start", "start a run from a run file (see examples/run.json)", _start)
    p.add_argument("run_file", metavar="RUN.json")
    p.add_argument("--wait", action="store_true", help="wait for the result and print it")
    p.add_argument("--workflow-id", help="default: the run_id")
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE)
    for name, help_text, fn in (
        ("status", "print a run's status and progress", _status),
        ("watch", "a live progress bar until the run closes", _watch),
        ("result", "wait for and print a run's summary", _result),
        ("pause", "checkpoint and pause", _signal("pause")),
        ("resume", "resume a paused run", _signal("resume")),
        ("stop", "graceful stop: checkpoint now, then finish", _signal("stop")),
        ("checkpoint", "commit a checkpoint now and carry on", _signal("checkpoint_now")),
        ("rollback", "restore training to the checkpoint at (or before) STEP; effects stay", _rollback),
        ("cancel", "cancel the run (the running segment checkpoints first)", _cancel),
        ("journal", "print the run's effect journal (intents, observations, decisions)", _journal),
    ):
        p = leaf(name, help_text, fn)
        p.add_argument("workflow_id", metavar="ID")
        if name == "rollback":
            p.add_argument("step", type=int)
        if name == "watch":
            p.add_argument("--interval", type=float, default=0.5, help="seconds between progress queries")
