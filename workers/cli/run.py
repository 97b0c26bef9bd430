"""``cairn run ...``: start, inspect (status, watch, result, list, journal, report) and steer
(pause, resume, stop, checkpoint, rollback, cancel) TrainingRun workflows."""

from __future__ import annotations

import argparse
import contextlib
import json
from collections.abc import Callable
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from activities.inputs import DEFAULT_TASK_QUEUE, WORKFLOW_TYPE
from cairn.config import TrainConfig, load_config, parse_config
from cairn.effects import load_journal
from cairn.errors import ConfigError
from cairn.numerics import DEFAULT_PROFILE, NAMES
from cairn.runs import run_record
from cairn.stores import open_store
from workers.cli.args import Common, add_set_arg
from workers.cli.output import emit, report_dir
from workers.cli.run_start import load_start_input, start
from workers.cli.run_status import status, stopped_watching, watch
from workers.cli.temporal import (
    live_step,
    query_run,
    show_result,
    temporal_command,
)
from workers.client import add_connection_args
from workers.reports.run import attach_history, write_report
from workers.reports.timeline import run_history
from workflows.training_run import TrainingRun

__all__ = ["register"]


def register(sub: Any, common: Common) -> None:
    run = sub.add_parser("run", help="start, watch and steer TrainingRun workflows")
    run_sub = run.add_subparsers(dest="run_command", required=True)

    def leaf(
        name: str,
        help_text: str,
        fn: Callable[[argparse.Namespace, Client], Any],
        prepare: Callable[[argparse.Namespace], None] | None = None,
    ) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = run_sub.add_parser(name, help=help_text)
        common(p)
        add_connection_args(p)
        p.set_defaults(handler=temporal_command(fn, prepare), exit_hard=True)
        return p

    p = leaf("list", "list runs: status, start time, current step", _list)
    p.add_argument("--limit", type=int, default=50, help="at most this many (newest first)")
    p = leaf("start", "start a run from a run file (see examples/run.json)", start, load_start_input)
    p.add_argument("run_file", metavar="RUN.json", help="the run file: JSON, YAML or TOML by extension")
    add_set_arg(p, "the run file")
    p.add_argument("--wait", action="store_true", help="wait for the result and print it")
    p.add_argument("--workflow-id", help="default: the run_id")
    p.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE)
    p.add_argument(
        "--world-size",
        type=int,
        metavar="W",
        help="override the file's world_size: ranks of a distributed run (needs config.distributed; W divides "
        "distributed.microbatches)",
    )
    p.add_argument("--nodes", metavar="A,B", help="override the file's nodes (hosts of the gang, by worker --node)")
    p.add_argument("--total-steps", type=int, help="override the file's length (e.g. to continue a finished run)")
    p.add_argument(
        "--numerics",
        dest="run_numerics",
        choices=NAMES,
        metavar="PROFILE",
        help=f"override the file's numerics profile ({', '.join(NAMES)}; default {DEFAULT_PROFILE}): segments go "
        "only to workers of that profile",
    )
    for name, help_text, fn in (
        ("status", "print a run's status and progress (a closed run: why, and its latest checkpoint)", status),
        ("watch", "a live progress bar until the run closes (Ctrl-C stops watching, exit 130; the run goes on)", watch),
        ("result", "wait for and print a run's summary", _result),
        ("pause", "checkpoint and pause", _signal(TrainingRun.pause)),
        ("resume", "resume a paused run", _signal(TrainingRun.resume)),
        ("stop", "graceful stop: checkpoint now, then finish", _signal(TrainingRun.stop)),
        ("checkpoint", "commit a checkpoint now and carry on", _signal(TrainingRun.checkpoint_now)),
        ("rollback", "restore training to the checkpoint at (or before) STEP; effects stay", _rollback),
        ("cancel", "cancel the run (the running segment checkpoints first)", _cancel),
        ("journal", "print the run's effect journal (intents, observations, decisions)", _journal),
        ("report", "write PNG plots and a summary of a run (loss, lr, commits, failures, speed)", _report),
    ):
        p = leaf(name, help_text, fn)
        p.add_argument("workflow_id", metavar="ID")
        if name == "rollback":
            p.add_argument("step", type=int)
        if name == "report":
            p.add_argument("--out", metavar="DIR", help="where the PNGs go (default ./cairn-report-RUN_ID)")
            p.add_argument(
                "--config",
                help="the run's config, trusting the trainer it names (default: the config in the workflow's "
                "recorded input, as its workers read it)",
            )
        if name == "watch":
            p.add_argument("--interval", type=float, default=0.5, help="seconds between progress queries")
            p.set_defaults(on_interrupt=stopped_watching)


async def _result(args: argparse.Namespace, client: Client) -> int:
    return await show_result(args, client, args.workflow_id)


async def _report(args: argparse.Namespace, client: Client) -> int:
    facts = await run_history(client, args.workflow_id)
    inp = facts.input
    store_url, run_id = inp.get("store"), inp.get("run_id")
    if not isinstance(store_url, str) or not isinstance(run_id, str):
        raise ConfigError("workflow input", expected="a TrainingRun input with store and run_id", found=inp)
    config = load_config(args.config) if args.config else _recorded_config(inp)
    record = attach_history(run_record(open_store(store_url), run_id, config), facts)
    result, text, files = write_report(record, report_dir(args.out, run_id))
    emit(args, {"workflow_id": args.workflow_id, **result, "files": [str(f) for f in files]}, text)
    return 0


def _recorded_config(inp: dict[str, Any]) -> TrainConfig | None:
    """The trainer config of a run's recorded input: the run's own, where its workers read it
    (None when it does not parse here; the trust rule then asks for ``--config``)."""
    try:
        return parse_config(inp.get("config"), "workflow input config")
    except ConfigError:
        return None


def _progress_text(row: dict[str, Any]) -> str:
    if row.get("step") is None:
        return "-"
    return f"{row['step']}/{row['total']}" if row.get("total") is not None else str(row["step"])


async def _list(args: argparse.Namespace, client: Client) -> int:
    """Runs (TrainingRun workflows), newest first: status, start time, progress from history."""
    rows = []
    seen: set[str] = set()
    async for execution in client.list_workflows(f"WorkflowType = '{WORKFLOW_TYPE}'", limit=args.limit):
        status = execution.status.name if execution.status else "UNKNOWN"
        row: dict[str, Any] = {
            "workflow_id": execution.id,
            "status": status,
            "started": execution.start_time.isoformat(timespec="seconds"),
            "closed": execution.close_time.isoformat(timespec="seconds") if execution.close_time else None,
            "task_queue": execution.task_queue,
        }
        if execution.status == WorkflowExecutionStatus.RUNNING:
            row["step"] = live_step(await client.get_workflow_handle(execution.id).describe())
        elif execution.status == WorkflowExecutionStatus.COMPLETED and execution.id not in seen:
            handle = client.get_workflow_handle_for(TrainingRun.run, execution.id, run_id=execution.run_id)
            with contextlib.suppress(ApplicationError):  # a result an older release wrote: no progress shown
                summary = await handle.result()  # from history: no worker needed
                row.update(step=summary.steps, total=summary.total_steps)
        seen.add(execution.id)
        rows.append(row)
    unique: dict[str, dict[str, Any]] = {}
    for row in rows:  # newest first: keep each workflow id's latest execution (continue-as-new)
        unique.setdefault(row["workflow_id"], row)
    lines = [f"{'WORKFLOW ID':<32} {'STATUS':<11} {'STARTED':<26} STEP"]
    lines += [
        f"{r['workflow_id']:<32} {r['status']:<11} {r['started']:<26} {_progress_text(r)}" for r in unique.values()
    ]
    emit(args, {"runs": list(unique.values())}, "\n".join(lines) if unique else "(no runs)")
    return 0


async def _journal(args: argparse.Namespace, client: Client) -> int:
    handle = client.get_workflow_handle_for(TrainingRun.run, args.workflow_id)
    info = await query_run(handle, TrainingRun.info)
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
    emit(args, payload, "\n".join(lines))
    return 0


def _signal(method: Any) -> Callable[[argparse.Namespace, Client], Any]:
    name = method.__name__

    async def send(args: argparse.Namespace, client: Client) -> int:
        await client.get_workflow_handle_for(TrainingRun.run, args.workflow_id).signal(method)
        emit(args, {"workflow_id": args.workflow_id, "signal": name}, f"sent {name} to {args.workflow_id}")
        return 0

    return send


async def _rollback(args: argparse.Namespace, client: Client) -> int:
    if args.step < 0:
        raise ConfigError("STEP", expected=">= 0", found=args.step)
    await client.get_workflow_handle_for(TrainingRun.run, args.workflow_id).signal(TrainingRun.rollback, args.step)
    emit(args, {"workflow_id": args.workflow_id, "rollback": args.step}, f"sent rollback to step {args.step}")
    return 0


async def _cancel(args: argparse.Namespace, client: Client) -> int:
    await client.get_workflow_handle(args.workflow_id).cancel()
    emit(
        args,
        {"workflow_id": args.workflow_id, "cancel": "requested"},
        f"cancel requested for {args.workflow_id}: the running segment checkpoints first, then the run ends "
        "CANCELED (it takes effect when a worker picks the run up)",
    )
    return 0
