"""``cairn run ...`` and ``cairn worker``: start, watch and steer TrainingRun workflows."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, timedelta
from typing import Any

from temporalio.api.enums.v1 import EventType, TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowQueryFailedError,
)
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from activities.models import DEFAULT_TASK_QUEUE, WORKFLOW_TYPE, RunProgress, RunSummary, TrainingRunInput
from cairn.errors import ConfigError, TemporalRefusedError, TemporalUnavailableError
from cairn.numerics import DEFAULT_PROFILE, NAMES
from cairn.runs.record import RunRecord, TimelineEvent
from workers.client import add_connection_args, connect
from workers.run_input import load_run_input
from workflows.training_run import TrainingRun

__all__ = ["register", "live_step"]

QUERY_TIMEOUT = timedelta(seconds=5)


_REFUSALS = {
    RPCStatusCode.NOT_FOUND,
    RPCStatusCode.ALREADY_EXISTS,
    RPCStatusCode.INVALID_ARGUMENT,
    RPCStatusCode.FAILED_PRECONDITION,
    RPCStatusCode.PERMISSION_DENIED,
    RPCStatusCode.UNAUTHENTICATED,
}
"""Temporal's answers that a retry would get again: reported as ``TemporalRefusedError``."""


def _async(
    fn: Callable[[argparse.Namespace, Client], Any], prepare: Callable[[argparse.Namespace], None] | None = None
) -> Callable[[argparse.Namespace], int]:
    """A command that talks to Temporal; ``prepare`` checks local input before connecting."""

    def handler(args: argparse.Namespace) -> int:
        if prepare is not None:
            prepare(args)

        async def go() -> int:
            try:
                client = await connect(args.address, args.namespace)
            except RuntimeError as exc:  # the SDK's connection failure
                raise TemporalUnavailableError(f"cannot connect to Temporal: {exc}") from None
            try:
                code: int = await fn(args, client)
                return code
            except RPCError as exc:
                if exc.status in _REFUSALS:
                    raise TemporalRefusedError(f"Temporal refused: {exc.message}") from None
                raise TemporalUnavailableError(f"Temporal did not answer: {exc.message}") from None

        return asyncio.run(go())

    return handler


def _print(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    from workers.cli.main import to_json

    print(to_json(payload) if args.json else text)


def _attempts_text(attempts: list[int], segments: int, retried: int) -> str:
    recent = f", recent attempts {attempts}" if attempts else ""
    return f"{segments} segment(s), {retried} retried{recent}"


def _summary_text(s: RunSummary) -> str:
    lines = [
        f"run {s.run_id}: {s.steps}/{s.total_steps} steps{' (stopped early)' if s.stopped_early else ''}",
        f"checkpoint   {s.checkpoint or '- (none committed)'}",
        f"fingerprint  {s.fingerprint or '-'}",
        f"segments     {_attempts_text(s.attempts, s.segments, s.retried_segments)}; "
        f"recomputed {s.recomputed_steps} step(s); continued-as-new {s.continued_as_new}x",
    ]
    if s.world_size > 1:
        lines.append(f"world size   {s.world_size} rank(s) at the end")
    if s.loss is not None:
        lines.append(f"loss         {s.loss:.6f}")
    if s.val_loss is not None:
        lines.append(f"validation   loss {s.val_loss:.6f}, accuracy {s.val_accuracy or 0:.4f}")
    if s.reproducibility:
        lines.append(f"contract     {s.reproducibility}")
    for name, receipt in s.effects.items():
        lines.append(f"effect       {name}: {receipt}")
    return "\n".join(lines)


def _load_start_input(args: argparse.Namespace) -> None:
    overrides: dict[str, Any] = {}
    if args.world_size is not None:
        overrides["world_size"] = args.world_size
    if args.nodes is not None:
        # "" clears the file's nodes (one node, any worker); an empty name in a list is refused, not dropped.
        overrides["nodes"] = args.nodes.split(",") if args.nodes.strip() else []
    if args.total_steps is not None:
        overrides.update(total_steps=args.total_steps, total_epochs=None)
    if args.run_numerics is not None:
        overrides["numerics"] = args.run_numerics
    args.run_input = load_run_input(args.run_file, overrides=overrides)  # bad input: exit 2 even with Temporal down


async def _start(args: argparse.Namespace, client: Client) -> int:
    from workers.client import WORKFLOW_TASK_TIMEOUT

    inp: TrainingRunInput = args.run_input
    workflow_id = args.workflow_id or inp.run_id
    try:
        handle = await client.start_workflow(
            TrainingRun.run, inp, id=workflow_id, task_queue=args.task_queue, task_timeout=WORKFLOW_TASK_TIMEOUT
        )
    except WorkflowAlreadyStartedError:
        raise TemporalRefusedError(
            f"a workflow with id {workflow_id!r} is already running: watch it with `cairn run watch {workflow_id}`, "
            "or start this run under another --workflow-id",
            field="workflow_id",
        ) from None
    if not args.wait:
        _print(
            args,
            {
                "workflow_id": workflow_id,
                "run_id": handle.result_run_id,
                "task_queue": args.task_queue,
                "store": inp.store,
            },
            f"started {WORKFLOW_TYPE} {workflow_id} on task queue {args.task_queue!r} (store {inp.store}, numerics "
            f"{inp.numerics})\n"
            f"  watch:  cairn run watch {workflow_id}\n  result: cairn run result {workflow_id}",
        )
        return 0
    return await _show_result(args, client, workflow_id)


def _closed_word(status: WorkflowExecutionStatus | None) -> str:
    return (
        {
            WorkflowExecutionStatus.FAILED: "failed",
            WorkflowExecutionStatus.CANCELED: "cancelled",
            WorkflowExecutionStatus.TERMINATED: "terminated",
            WorkflowExecutionStatus.TIMED_OUT: "timed out",
        }.get(status, "did not complete")
        if status
        else "did not complete"
    )


def _failure_message(exc: BaseException) -> str:
    """The innermost readable message of a workflow failure (the activity's typed error)."""
    cause: BaseException | None = exc
    message = str(exc)
    while cause is not None:
        text = getattr(cause, "message", None) or str(cause)
        kind = getattr(cause, "type", None)
        if text:
            message = f"{kind}: {text}" if kind else text
        cause = cause.__cause__ or getattr(cause, "cause", None)
    return message


async def _show_result(args: argparse.Namespace, client: Client, workflow_id: str) -> int:
    handle = client.get_workflow_handle_for(TrainingRun.run, workflow_id)
    try:
        summary = await handle.result()
    except WorkflowFailureError as exc:
        desc = await handle.describe()
        word = _closed_word(desc.status)
        message = _failure_message(exc)
        _print(args, {"workflow_id": workflow_id, "status": word, "error": message}, f"run {word}: {message}")
        return 1
    _print(args, {"workflow_id": workflow_id, "status": "completed", **summary.model_dump()}, _summary_text(summary))
    return 0


async def _result(args: argparse.Namespace, client: Client) -> int:
    return await _show_result(args, client, args.workflow_id)


async def _pollers(client: Client, task_queue: str) -> int:
    """How many workers polled the task queue recently (Temporal keeps them listed a while)."""
    resp = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return len(resp.pollers)


async def _query(handle: Any, query: Any) -> Any:
    """A query to the run; a run that cannot answer (its input never decoded: it failed before
    its first line) is a one-line ``TemporalRefusedError``, not the SDK's traceback."""
    try:
        return await handle.query(query, rpc_timeout=QUERY_TIMEOUT)
    except WorkflowQueryFailedError as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if "Expected workflow input" in reason:  # the SDK's words for a run whose input never decoded
            reason = "its input never decoded, so it failed before its first step"
        raise TemporalRefusedError(
            f"workflow {handle.id!r} cannot answer queries ({reason}); `cairn run result {handle.id}` "
            "says how it ended",
            field="workflow_id",
        ) from None


async def _progress(client: Client, workflow_id: str) -> RunProgress:
    handle = client.get_workflow_handle_for(TrainingRun.run, workflow_id)
    return await _query(handle, TrainingRun.progress)


SEGMENT_ACTIVITIES = ("train_segment", "train_gang_node")
"""Activities that train: a segment in the worker's thread, or one node's share of a gang."""


def _segment_view(desc: WorkflowExecutionDescription) -> dict[str, Any] | None:
    """The running segment as the server saw it last: attempt, heartbeat, last failure."""
    for pending in desc.raw_description.pending_activities:
        if pending.activity_type.name not in SEGMENT_ACTIVITIES:
            continue
        view: dict[str, Any] = {"attempt": pending.attempt, "state": pending.state}
        for payload in pending.heartbeat_details.payloads:
            try:
                value = json.loads(payload.data)
            except ValueError:
                continue
            if isinstance(value, dict):
                view.update({k: value.get(k) for k in ("step", "checkpoint", "loss")})
        if pending.HasField("last_heartbeat_time"):
            view["last_heartbeat"] = pending.last_heartbeat_time.ToDatetime().isoformat(timespec="seconds") + "Z"
        if pending.HasField("last_failure"):
            view["last_failure"] = pending.last_failure.message
        return view
    return None


async def _status(args: argparse.Namespace, client: Client) -> int:
    """Works without a worker: the query needs one, describe and the result do not."""
    handle = client.get_workflow_handle_for(TrainingRun.run, args.workflow_id)
    desc = await handle.describe()
    status = desc.status.name if desc.status else "UNKNOWN"
    pollers = await _pollers(client, desc.task_queue)
    progress: RunProgress | None = None
    if pollers:
        with contextlib.suppress(RPCError, TemporalRefusedError):  # no answer: describe and result below
            progress = await _progress(client, args.workflow_id)
    payload: dict[str, Any] = {"workflow_id": args.workflow_id, "status": status, "workers_polling": pollers}
    lines: list[str] = []
    if progress is not None:
        payload.update(progress.model_dump())
        lines.append(
            f"{args.workflow_id}: {status} - {progress.phase}, step {progress.step}/{progress.total}"
            + (f", epoch {progress.epoch:.2f}" if progress.epoch is not None else "")
            + (f", loss {progress.loss:.4f}" if progress.loss is not None else "")
            + (f", {progress.world_size} ranks" if progress.world_size > 1 else "")
        )
        if progress.val_loss is not None:
            accuracy = progress.val_accuracy or 0.0
            lines.append(f"  validation  loss {progress.val_loss:.4f}, accuracy {accuracy:.4f} (last epoch end)")
        running = _segment_view(desc) if desc.status == WorkflowExecutionStatus.RUNNING else None
        # The running segment's heartbeat knows its own commits before the workflow does.
        latest = (running or {}).get("checkpoint") or progress.checkpoint
        payload["checkpoint"] = latest
        lines.append(f"  checkpoint  {latest or '- (none committed yet)'}")
        lines.append(
            f"  segments    {_attempts_text(progress.attempts, progress.segments, progress.retried_segments)}; "
            f"recomputed {progress.recomputed_steps} step(s); continued-as-new {progress.continued_as_new}x"
        )
    elif desc.status == WorkflowExecutionStatus.COMPLETED:
        summary = await handle.result()  # from history: no worker needed
        payload.update(summary.model_dump())
        lines.append(f"{args.workflow_id}: COMPLETED")
        lines += ["  " + line for line in _summary_text(summary).splitlines()]
    else:
        lines.append(f"{args.workflow_id}: {status}")
        if desc.status not in (None, WorkflowExecutionStatus.RUNNING):
            try:
                await handle.result()
            except WorkflowFailureError as exc:
                payload["error"] = _failure_message(exc)
                lines.append(f"  {_closed_word(desc.status)}: {payload['error']}")
    if desc.status == WorkflowExecutionStatus.RUNNING:
        segment = _segment_view(desc)
        if segment is not None:
            payload["segment"] = segment
            seen = f" (last heartbeat {segment['last_heartbeat']})" if "last_heartbeat" in segment else ""
            lines.append(
                f"  segment     attempt {segment['attempt']}, step {segment.get('step', '-')}{seen}"
                + (f"; last failure: {segment['last_failure']}" if segment.get("last_failure") else "")
            )
        if not pollers:
            lines.append(
                f"  worker      no worker is polling task queue {desc.task_queue!r}: progress shown is the last "
                "the server saw; start one with `cairn worker`"
            )
    _print(args, payload, "\n".join(lines))
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

    handle = client.get_workflow_handle_for(TrainingRun.run, args.workflow_id)
    bar: tqdm[Any] | None = None
    while True:
        desc = await handle.describe()
        if desc.status != WorkflowExecutionStatus.RUNNING:
            if bar is not None:
                bar.close()
            break
        try:
            progress: RunProgress | None = await _progress(client, args.workflow_id)
        except (RPCError, TemporalRefusedError):
            progress = None  # no worker right now (or no answer yet): show the last heartbeat, keep watching
        total = progress.total if progress else None
        if bar is None and total is not None:
            bar = tqdm(total=total, desc=args.workflow_id, unit="step")
        if bar is not None:
            bar.n = max(progress.step if progress else 0, live_step(desc) or 0)
            bar.set_postfix(
                phase=progress.phase if progress else "no worker",
                loss="-" if progress is None or progress.loss is None else f"{progress.loss:.4f}",
                val_acc="-" if progress is None or progress.val_accuracy is None else f"{progress.val_accuracy:.3f}",
                retried=progress.retried_segments if progress else "-",
                refresh=False,
            )
            bar.refresh()
        await asyncio.sleep(args.interval)
    return await _show_result(args, client, args.workflow_id)


async def run_events(client: Client, workflow_id: str) -> tuple[dict[str, Any], list[TimelineEvent]]:
    """The run's input (store, run id) and what Temporal's history says happened to its
    segments, over every execution of the workflow id (continue-as-new included). No worker
    is needed: history is the server's."""
    first_input: dict[str, Any] = {}
    events: list[TimelineEvent] = []
    executions = [e async for e in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    if not executions:
        raise TemporalRefusedError(f"no workflow with id {workflow_id!r}", field="workflow_id")
    for execution in sorted(executions, key=lambda e: e.start_time):
        handle = client.get_workflow_handle(workflow_id, run_id=execution.run_id)
        history = [event async for event in handle.fetch_history_events()]
        inp, found = timeline_from_history(history)
        first_input = first_input or inp
        events += found
    return first_input, events


def timeline_from_history(history: list[Any]) -> tuple[dict[str, Any], list[TimelineEvent]]:
    """One execution's history events (``temporalio.api.history.v1.HistoryEvent``) as the
    run's input and timeline: segment ends, failures, restores, interruptions.

    A plain segment is retried by Temporal (its attempts show as ``attempt > 1`` starts); a
    gang segment is one ``train_gang_node`` per node, scheduled together in one workflow task,
    and retried whole by the workflow: the first node that failed is the attempt's one failure,
    the other nodes (cancelled by the workflow, or failing with their broken peer) are part of
    it, a gang interrupted on request is one interruption, and the retry's restore says at
    which world size it resumed (an elastic run may have shrunk)."""
    first_input: dict[str, Any] = {}
    events: list[TimelineEvent] = []
    scheduled: dict[int, tuple[str, int, dict[str, Any]]] = {}  # id -> (type, batch, input)
    started_at: dict[int, Any] = {}
    failed_batches: set[int] = set()
    interrupted_batches: set[int] = set()
    for event in history:
        at = event.event_time.ToDatetime().replace(tzinfo=UTC)
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED and not first_input:
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            first_input = _decoded(payloads[0].data) if payloads else {}
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs_s = event.activity_task_scheduled_event_attributes
            name = attrs_s.activity_type.name
            payloads = attrs_s.input.payloads
            node_input = _decoded(payloads[0].data) if name == "train_gang_node" and payloads else {}
            scheduled[event.event_id] = (name, attrs_s.workflow_task_completed_event_id, node_input)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            started_at[attrs.scheduled_event_id] = at
            if attrs.attempt > 1 and scheduled.get(attrs.scheduled_event_id, ("",))[0] == "train_segment":
                detail = attrs.last_failure.message if attrs.HasField("last_failure") else "earlier attempt lost"
                events.append(TimelineEvent("failure", at, None, f"attempt {attrs.attempt - 1}: {detail}"))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs_c = event.activity_task_completed_event_attributes
            kind_c, _, node_input = scheduled.get(attrs_c.scheduled_event_id, ("", 0, {}))
            if kind_c in SEGMENT_ACTIVITIES and attrs_c.result.payloads:
                result = _decoded(attrs_c.result.payloads[0].data)
                last = next((e for e in reversed(events) if e.kind == "segment-end"), None)
                if kind_c == "train_gang_node" and last is not None and last.step == result.get("step"):
                    continue  # another node of the same gang segment
                events.append(TimelineEvent("segment-end", at, result.get("step"), "segment completed"))
                if int(result.get("attempt", 1)) > 1:  # the retry resumed from its last durable checkpoint
                    resumed_at = started_at.get(attrs_c.scheduled_event_id, at)
                    detail = f"attempt {result['attempt']}"
                    if isinstance(node_input.get("world_size"), int):
                        detail += f" at world size {node_input['world_size']}"
                    events.append(TimelineEvent("restore", resumed_at, result.get("resumed_from_step"), detail))
        elif kind in (EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT):
            timed_out = kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
            attrs_f = (
                event.activity_task_timed_out_event_attributes
                if timed_out
                else event.activity_task_failed_event_attributes
            )
            name_f, batch, node_input = scheduled.get(attrs_f.scheduled_event_id, ("", 0, {}))
            failure = attrs_f.failure
            message = "activity timed out" if timed_out else failure.message
            error = failure.application_failure_info.type if failure.HasField("application_failure_info") else ""
            gang_node = name_f == "train_gang_node"
            if gang_node and batch in failed_batches:
                # A node of a gang that already failed: stopped by the workflow (it checkpoints and
                # reports an interruption) or its collectives broke with the failed peer. One
                # failure per gang attempt.
                continue
            if not timed_out and error == "SegmentInterrupted":
                if not gang_node or batch not in interrupted_batches:
                    events.append(TimelineEvent("interrupted", at, None, message))  # once per gang
                interrupted_batches.add(batch)
                continue
            if gang_node:
                failed_batches.add(batch)
                node = node_input.get("node_index")
                message = f"gang node {node}: {message}" if isinstance(node, int) else message
            events.append(TimelineEvent("failure", at, None, message))
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            cancelled_id = event.activity_task_canceled_event_attributes.scheduled_event_id
            name_x, batch, _ = scheduled.get(cancelled_id, ("", 0, {}))
            if name_x == "train_gang_node" and batch in failed_batches | interrupted_batches:
                continue  # its gang failed (that failure is on the timeline) or is already interrupted
            events.append(TimelineEvent("interrupted", at, None, "segment cancelled on request"))
            interrupted_batches.add(batch)
    return first_input, events


def _decoded(data: bytes) -> dict[str, Any]:
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _place_on_steps(record: RunRecord) -> None:
    """Events without a step sit at the step of the last known point before them (a commit, a
    segment's end, a restore), else of the first one after them."""
    known = sorted(
        [(c.at, c.step) for c in record.commits if c.at is not None]
        + [(e.at, e.step) for e in record.events if e.step is not None]
    )
    for i, event in enumerate(record.events):
        if event.step is None:
            before = [step for at, step in known if at <= event.at]
            after = [step for at, step in known if at > event.at]
            record.events[i] = replace(event, step=before[-1] if before else (after[0] if after else 0))


async def _report(args: argparse.Namespace, client: Client) -> int:
    from cairn.runs.record import run_record
    from cairn.stores import open_store
    from workers.cli.main import report_dir
    from workers.reports.run import write_report

    inp, events = await run_events(client, args.workflow_id)
    store_url, run_id = inp.get("store"), inp.get("run_id")
    if not isinstance(store_url, str) or not isinstance(run_id, str):
        raise ConfigError("workflow input", expected="a TrainingRun input with store and run_id", found=inp)
    record = run_record(open_store(store_url), run_id)
    record.events = events
    _place_on_steps(record)
    result, text, files = write_report(record, report_dir(args.out, run_id))
    _print(args, {"workflow_id": args.workflow_id, **result, "files": [str(f) for f in files]}, text)
    return 0


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
    _print(args, {"runs": list(unique.values())}, "\n".join(lines) if unique else "(no runs)")
    return 0


async def _journal(args: argparse.Namespace, client: Client) -> int:
    from cairn.effects import load_journal
    from cairn.stores import open_store

    handle = client.get_workflow_handle_for(TrainingRun.run, args.workflow_id)
    info = await _query(handle, TrainingRun.info)
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


def _signal(method: Any) -> Callable[[argparse.Namespace, Client], Any]:
    name = method.__name__

    async def send(args: argparse.Namespace, client: Client) -> int:
        await client.get_workflow_handle_for(TrainingRun.run, args.workflow_id).signal(method)
        _print(args, {"workflow_id": args.workflow_id, "signal": name}, f"sent {name} to {args.workflow_id}")
        return 0

    return send


async def _rollback(args: argparse.Namespace, client: Client) -> int:
    if args.step < 0:
        raise ConfigError("STEP", expected=">= 0", found=args.step)
    await client.get_workflow_handle_for(TrainingRun.run, args.workflow_id).signal(TrainingRun.rollback, args.step)
    _print(args, {"workflow_id": args.workflow_id, "rollback": args.step}, f"sent rollback to step {args.step}")
    return 0


async def _cancel(args: argparse.Namespace, client: Client) -> int:
    await client.get_workflow_handle(args.workflow_id).cancel()
    _print(
        args,
        {"workflow_id": args.workflow_id, "cancel": "requested"},
        f"cancel requested for {args.workflow_id}: the running segment checkpoints first, then the run ends "
        "CANCELED (it takes effect when a worker picks the run up)",
    )
    return 0


def _worker(args: argparse.Namespace) -> int:
    from workers.logs import configure_logging
    from workers.worker import run

    configure_logging(args.log_format)
    return asyncio.run(run(args))


def register(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    from workers.worker import add_worker_args

    p = sub.add_parser("worker", help="run a Temporal worker (workflows + activities)")
    common(p)
    add_worker_args(p)
    p.set_defaults(handler=_worker, exit_hard=True)

    run = sub.add_parser("run", help="start, watch and steer TrainingRun workflows")
    run_sub = run.add_subparsers(dest="run_command", required=True)

    def leaf(
        name: str,
        help_text: str,
        fn: Callable[[argparse.Namespace, Client], Any],
        prepare: Callable[[argparse.Namespace], None] | None = None,
    ) -> argparse.ArgumentParser:
        p = run_sub.add_parser(name, help=help_text)
        common(p)
        add_connection_args(p)
        p.set_defaults(handler=_async(fn, prepare), exit_hard=True)
        return p

    p = leaf("list", "list runs: status, start time, current step", _list)
    p.add_argument("--limit", type=int, default=50, help="at most this many (newest first)")
    p = leaf("start", "start a run from a run file (see examples/run.json)", _start, _load_start_input)
    p.add_argument("run_file", metavar="RUN.json")
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
        ("status", "print a run's status and progress", _status),
        ("watch", "a live progress bar until the run closes", _watch),
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
        if name == "watch":
            p.add_argument("--interval", type=float, default=0.5, help="seconds between progress queries")
            p.set_defaults(
                interrupt_note="stopped watching {workflow_id}; the run keeps going on its workers "
                "(watch again: cairn run watch {workflow_id}; stop it: cairn run stop {workflow_id})"
            )
