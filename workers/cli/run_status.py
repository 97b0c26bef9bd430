"""``cairn run status`` and ``cairn run watch``: what a run is doing, each figure from the
freshest source that knows it.

Where the figures come from: the workflow's ``progress`` query knows the run as of its last
*finished* segment (step, loss, validation, checkpoint); the running segment's heartbeat (in
``describe``, no worker needed) knows the step it is at now and that step's loss. Showing the
heartbeat's step beside the query's loss put an older step's loss next to the current step
(``loss`` of step 78 at step 147), so step and loss are always taken together, from one
source: the heartbeat when it is at or past the workflow's step, else the workflow.

A run that ended without completing (failed, cancelled, terminated, timed out) shows its
one-line reason first, and its latest committed checkpoint as its store has it: the workflow
records a checkpoint only when a segment finishes, so a run that failed inside its first
segment had committed checkpoints the workflow never heard of (the error names them).

Ctrl-C of ``watch`` stops watching, not the run: it prints so on stderr (with ``--json`` also
one JSON object on stdout) and exits ``WATCH_INTERRUPTED_EXIT`` (130, the CLI's code for
SIGINT), never an error line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.service import RPCError

from activities.views import RunProgress
from cairn.checkpoint import latest_committed
from cairn.errors import TemporalRefusedError
from cairn.stores import open_store
from workers.cli.output import emit, to_json
from workers.cli.temporal import (
    QueuePollers,
    attempts_text,
    durable_text,
    failure_message,
    heartbeat_progress,
    queue_pollers,
    run_progress,
    run_queues,
    segment_view,
    show_result,
    start_input,
    summary_text,
)
from workflows.training_run import TrainingRun

__all__ = [
    "WATCH_INTERRUPTED_EXIT",
    "LiveView",
    "ProgressLines",
    "live_view",
    "off_loop",
    "status",
    "stopped_watching",
    "watch",
]

WATCH_INTERRUPTED_EXIT = 130
"""Exit status of ``cairn run watch`` stopped by Ctrl-C (the run goes on): the CLI's SIGINT code."""

STORE_TIMEOUT = 15.0
"""Seconds a command waits for the run's store (read from here) before doing without it."""

T = TypeVar("T")


@dataclass(frozen=True)
class LiveView:
    """Where the run is: a step and the loss *of that step*, from one source."""

    step: int
    loss: float | None
    source: Literal["heartbeat", "workflow"]


def live_view(progress: RunProgress | None, desc: Any) -> LiveView | None:
    """The freshest (step, loss): the running segment's last heartbeat when it is at or past the
    workflow's step, else the workflow's own (the end of its last finished segment)."""
    beat = heartbeat_progress(desc) if desc.status == WorkflowExecutionStatus.RUNNING else None
    if beat is not None and (progress is None or beat[0] >= progress.step):
        step, loss = beat
        if loss is None and progress is not None and progress.step == step:
            loss = progress.loss  # a segment that just resumed: the workflow knows this step's loss
        return LiveView(step, loss, "heartbeat")
    if progress is None:
        return None
    return LiveView(progress.step, progress.loss, "workflow")


async def off_loop(fn: Callable[[], T], timeout: float = STORE_TIMEOUT) -> T:
    """``fn()`` in a daemon thread, at most ``timeout`` seconds (``TimeoutError``): a store
    that does not answer must not hold the command, nor its exit."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def work() -> None:
        ok, value = True, None
        try:
            value = fn()
        except BaseException as exc:  # handed to the awaiting task, typed
            ok, value = False, exc  # type: ignore[assignment]
        with contextlib.suppress(RuntimeError):  # the command is over (timed out): its loop is closed
            loop.call_soon_threadsafe(settle, ok, value)

    threading.Thread(target=work, name="cairn-store-read", daemon=True).start()
    return await asyncio.wait_for(future, timeout)


async def committed_in_store(client: Client, workflow_id: str) -> tuple[bool, str | None]:
    """(readable, the run's latest committed checkpoint) from the store its input names."""
    inp = await start_input(client, workflow_id)
    store, run_id = inp.get("store"), inp.get("run_id")
    if not isinstance(store, str) or not isinstance(run_id, str):
        return False, None

    def look() -> str | None:
        ref = latest_committed(open_store(store), run_id)
        return None if ref is None else str(ref)

    try:
        return True, await off_loop(look)
    except Exception:  # noqa: BLE001 - no access to the store from here: the workflow's view instead
        return False, None


async def _closed_reason(handle: Any) -> str | None:
    try:
        await handle.result()  # from history: no worker needed
    except WorkflowFailureError as exc:
        message = failure_message(exc)
        return message.splitlines()[0] if message else None
    return None


async def status(args: argparse.Namespace, client: Client) -> int:
    """Works without a worker: the query needs one, describe, history and the store do not."""
    wf = args.workflow_id
    handle = client.get_workflow_handle_for(TrainingRun.run, wf)
    desc = await handle.describe()
    state = desc.status.name if desc.status else "UNKNOWN"
    running = desc.status == WorkflowExecutionStatus.RUNNING
    # A closed run is never queried (a worker would replay it to answer, and one that failed
    # before its first line cannot be replayed): its result, history and store say it all.
    queues = await run_queues(client, wf, desc.task_queue) if running else [(desc.task_queue, "workflow")]
    pollers = [await queue_pollers(client, queue, kind) for queue, kind in queues]
    progress: RunProgress | None = None
    if running and pollers[0].live:
        with contextlib.suppress(RPCError, TemporalRefusedError):  # no answer: describe and history below
            progress = await run_progress(client, wf)
    payload: dict[str, Any] = {
        "workflow_id": wf,
        "status": state,
        "workers_polling": min(p.live for p in pollers),  # of the queue with the fewest: the run waits on it
        "queues": [asdict(p) for p in pollers],
    }
    if progress is not None:
        payload.update(progress.model_dump())
    lines: list[str] = []
    if desc.status not in (None, WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED):
        reason = await _closed_reason(handle)
        if reason is not None:
            payload["error"] = reason
        lines.append(f"{wf}: {state}" + (f" - {reason}" if reason else ""))
        readable, ref = await committed_in_store(client, wf)
        if not readable:
            ref = progress.checkpoint if progress is not None else None
        payload.update(checkpoint=ref, checkpoint_from="store" if readable else "workflow")
        seen = "latest committed" if readable else "as the workflow recorded it; the store cannot be read from here"
        lines.append(f"  checkpoint  {ref + f' ({seen})' if ref else '- (none committed)'}")
        if progress is not None:
            lines.append(_segments_line(progress))
    elif progress is not None:
        view = live_view(progress, desc)
        assert view is not None
        payload.update(step=view.step, loss=view.loss, step_from=view.source)
        spe = progress.steps_per_epoch
        lines.append(
            f"{wf}: {state} - {progress.phase}, step {view.step}/{progress.total}"
            + (f", epoch {view.step / spe:.2f}" if spe else "")
            + (f", loss {view.loss:.4f}" if view.loss is not None else "")
            + (f", {progress.world_size} ranks" if progress.world_size > 1 else "")
        )
        if progress.val_loss is not None:
            accuracy = "" if progress.val_accuracy is None else f", accuracy {progress.val_accuracy:.4f}"
            lines.append(f"  validation  loss {progress.val_loss:.4f}{accuracy} (last evaluation)")
        segment = segment_view(desc) if running else None
        # The running segment's heartbeat knows its own commits before the workflow does.
        latest = (segment or {}).get("checkpoint") or progress.checkpoint
        payload["checkpoint"] = latest
        lines.append(f"  checkpoint  {latest or '- (none committed yet)'}")
        lines.append(f"  durable     {durable_text(progress.checkpoint, progress.durable_checkpoint)}")
        lines.append(_segments_line(progress))
    elif desc.status == WorkflowExecutionStatus.COMPLETED:
        summary = await handle.result()  # from history: no worker needed
        payload.update(summary.model_dump())
        payload.update(phase="finished", step=summary.steps, total=summary.total_steps)  # as a live run's progress
        lines.append(f"{wf}: COMPLETED")
        lines += ["  " + line for line in summary_text(summary).splitlines()]
    else:
        lines.append(f"{wf}: {state}")
    if running:
        lines += _running_lines(desc, pollers, payload)
    emit(args, payload, "\n".join(lines))
    return 0


def _segments_line(progress: RunProgress) -> str:
    return (
        f"  segments    {attempts_text(progress.attempts, progress.segments, progress.retried_segments)}; "
        f"recomputed {progress.recomputed_steps} step(s); continued-as-new {progress.continued_as_new}x"
        + (f"; checkpoint every {progress.checkpoint_every} steps" if progress.checkpoint_every else "")
    )


def _running_lines(desc: Any, pollers: list[QueuePollers], payload: dict[str, Any]) -> list[str]:
    lines = []
    segment = segment_view(desc)
    if segment is not None:
        payload["segment"] = segment
        seen = f" (last heartbeat {segment['last_heartbeat']})" if "last_heartbeat" in segment else ""
        step = "-" if segment.get("step") is None else segment["step"]  # no heartbeat yet: no step to show
        lines.append(
            f"  segment     attempt {segment['attempt']}, step {step}{seen}"
            + (f"; last failure: {segment['last_failure']}" if segment.get("last_failure") else "")
        )
    for p in pollers:
        if p.live:
            continue
        since = "ever" if p.last_seen_s is None else f"for {p.last_seen_s:.0f} s"
        lines.append(
            f"  worker      no worker is polling task queue {p.queue!r} ({p.kind} tasks) {since}: the run waits "
            "for one; progress shown is the last the server saw; start one with `cairn worker`"
        )
    if all(p.live for p in pollers):
        lines.append("  workers     " + "; ".join(f"{p.live} polling {p.queue!r} ({p.kind})" for p in pollers))
    return lines


def _fields(progress: RunProgress | None, view: LiveView | None, desc: Any = None) -> dict[str, Any]:
    """What ``watch`` shows beside the step. ``retried``: the segments that needed more than one
    attempt — those the workflow recorded, and the running one if it is on its second attempt or
    later (``segment_view``: its heartbeat's or the server's; the workflow counts a segment only
    once it finished)."""
    segment = None if desc is None else segment_view(desc)
    retrying = int(segment is not None and segment["attempt"] > 1)
    return {
        "phase": progress.phase if progress else "no worker",
        "loss": "-" if view is None or view.loss is None else f"{view.loss:.4f}",
        "val_acc": "-" if progress is None or progress.val_accuracy is None else f"{progress.val_accuracy:.3f}",
        "retried": progress.retried_segments + retrying if progress else "-",
    }


LINE_QUERIES = 4
"""Without a terminal, a line at most every this many progress queries (2 s at ``--interval 0.5``)
while only the step moves."""


class ProgressLines:
    """``watch`` where stderr is no terminal (a pipe, a file, CI): a line when the phase or the
    retries change, else at most one every ``every`` seconds while the step moves, never a
    redrawn bar (``\\r`` frames fill a log)."""

    def __init__(self, workflow_id: str, every: float = 10.0) -> None:
        self.workflow_id, self.every = workflow_id, every
        self._last: tuple[Any, ...] | None = None
        self._at = float("-inf")

    def line(self, step: int, total: int, fields: dict[str, Any], now: float) -> str | None:
        key = (fields["phase"], fields["retried"])
        moved = self._last is not None and self._last[0] != step
        if self._last is not None and key == self._last[1:] and not (moved and now - self._at >= self.every):
            return None
        self._last, self._at = (step, *key), now
        shown = " ".join(f"{name}={value}" for name, value in fields.items())
        return f"{self.workflow_id}: step {step}/{total} {shown}"


async def watch(args: argparse.Namespace, client: Client) -> int:
    """Progress on stderr until the run closes (a bar on a terminal, else a line now and then),
    then its result; Ctrl-C stops watching only."""
    from tqdm import tqdm

    wf = args.workflow_id
    handle = client.get_workflow_handle_for(TrainingRun.run, wf)
    bar: tqdm[Any] | None = None
    lines = None if sys.stderr.isatty() else ProgressLines(wf, every=LINE_QUERIES * args.interval)
    try:
        while True:
            desc = await handle.describe()
            if desc.status != WorkflowExecutionStatus.RUNNING:
                break
            try:
                progress: RunProgress | None = await run_progress(client, wf)
            except (RPCError, TemporalRefusedError):
                progress = None  # no worker right now (or no answer yet): show the last heartbeat, keep watching
            view = live_view(progress, desc)
            if lines is not None:
                if progress is not None and view is not None:
                    line = lines.line(view.step, progress.total, _fields(progress, view, desc), time.monotonic())
                    if line is not None:
                        print(line, file=sys.stderr, flush=True)
            else:
                if bar is None and progress is not None:
                    bar = tqdm(total=progress.total, desc=wf, unit="step", initial=view.step if view else 0)
                if bar is not None:
                    if progress is not None and progress.total != bar.total:
                        bar.total = progress.total  # a length in epochs resolves once the trainer said
                    if view is not None:
                        bar.n = view.step  # back to the resume step after a retry: that is where the run is
                    bar.set_postfix(**_fields(progress, view, desc), refresh=False)
                    bar.refresh()
            await asyncio.sleep(args.interval)
    except (asyncio.CancelledError, KeyboardInterrupt):  # Ctrl-C (asyncio.run cancels the command)
        if bar is not None:
            bar.close()
        return stopped_watching(args)
    if bar is not None:
        bar.close()
    return await show_result(args, client, wf)


def stopped_watching(args: argparse.Namespace) -> int:
    """Ctrl-C of ``watch``, wherever it lands (connecting, polling, showing the result): a note,
    not an error; the run keeps going."""
    wf = args.workflow_id
    print(
        f"stopped watching {wf}; the run keeps going on its workers (watch again: cairn run watch {wf}; "
        f"stop it: cairn run stop {wf})",
        file=sys.stderr,
        flush=True,
    )
    if args.json:
        print(to_json({"workflow_id": wf, "watching": "stopped", "run": "keeps going"}), flush=True)
    return WATCH_INTERRUPTED_EXIT
