"""A run's timeline from Temporal's history (``cairn run report``): segment ends, failures,
restores and interruptions, placed on the run's steps beside its commits."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC
from typing import TYPE_CHECKING, Any

from temporalio.api.enums.v1 import EventType

from cairn.errors import TemporalRefusedError
from cairn.runs.record import RunRecord, TimelineEvent

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = ["SEGMENT_ACTIVITIES", "place_on_steps", "run_events", "timeline_from_history"]

SEGMENT_ACTIVITIES = ("train_segment", "train_gang_node")
"""Activities that train: a segment in the worker's thread, or one node's share of a gang."""


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


def place_on_steps(record: RunRecord) -> None:
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
