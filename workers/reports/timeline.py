"""A run's timeline from Temporal's history (``cairn run report``): its segment attempts, and
segment ends, failures, restores and interruptions placed on the run's steps beside its commits.

Heartbeats are not history events, but a lost attempt's last one is in it: the retry's start
(or the timeout event) carries the failure with the last heartbeat's details (the step it had
reached), and the server failed the attempt exactly ``heartbeat_timeout`` (the scheduled
activity's, the run's own) after the last heartbeat it received. So a lost attempt's last sign
of life is its detection minus that timeout; its detection is the retry's start minus the retry
interval (the scheduled activity's retry policy), or the timeout event itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from temporalio.api.enums.v1 import EventType, TimeoutType

from cairn.errors import TemporalRefusedError
from cairn.runs.record import RunRecord, SegmentAttempt, TimelineEvent

if TYPE_CHECKING:
    from temporalio.client import Client

__all__ = [
    "SEGMENT_ACTIVITIES",
    "HistoryFacts",
    "place_on_steps",
    "read_history",
    "run_events",
    "run_history",
    "timeline_from_history",
]

SEGMENT_ACTIVITIES = ("train_segment", "train_gang_node")
"""Activities that train: a segment in the worker's thread, or one node's share of a gang."""
_DURABLE_STEP = ("open_run", "latest_checkpoint")
"""Bookkeeping activities whose result names the run's latest committed step."""


@dataclass
class HistoryFacts:
    """What one or more executions' histories say: the run's input, its timeline events, its
    segment attempts, and the heartbeat timeout its segments were scheduled with."""

    input: dict[str, Any] = field(default_factory=dict)
    events: list[TimelineEvent] = field(default_factory=list)
    attempts: list[SegmentAttempt] = field(default_factory=list)
    heartbeat_timeout_seconds: float | None = None
    durable_step: int | None = None
    intervals: list[tuple[int, int]] = field(default_factory=list)
    """(step, steps between checkpoints) from each segment whose interval differed from the last."""
    interval_choices: list[dict[str, Any]] = field(default_factory=list)
    """``checkpoint.every: "auto"``: the choices the finished run reported (``RunSummary``)."""


@dataclass
class _Scheduled:
    name: str
    batch: int
    node_input: dict[str, Any]
    at: datetime
    heartbeat_timeout: float
    retry: tuple[float, float, float]  # initial interval, backoff coefficient, maximum interval (s)
    from_step: int | None
    every: int | None = None


async def run_history(client: Client, workflow_id: str) -> HistoryFacts:
    """Every execution of the workflow id (continue-as-new included), in order. No worker is
    needed: history is the server's."""
    executions = [e async for e in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    if not executions:
        raise TemporalRefusedError(f"no workflow with id {workflow_id!r}", field="workflow_id")
    facts = HistoryFacts()
    for execution in sorted(executions, key=lambda e: e.start_time):
        handle = client.get_workflow_handle(workflow_id, run_id=execution.run_id)
        history = [event async for event in handle.fetch_history_events()]
        found = read_history(history, durable_step=facts.durable_step)
        facts.input = facts.input or found.input
        facts.events += found.events
        facts.attempts += found.attempts
        facts.heartbeat_timeout_seconds = facts.heartbeat_timeout_seconds or found.heartbeat_timeout_seconds
        facts.durable_step = found.durable_step
        facts.intervals += [i for i in found.intervals if not facts.intervals or i[1] != facts.intervals[-1][1]]
        facts.interval_choices = found.interval_choices or facts.interval_choices
    return facts


async def run_events(client: Client, workflow_id: str) -> tuple[dict[str, Any], list[TimelineEvent]]:
    """The run's input (store, run id) and its timeline events (``run_history``)."""
    facts = await run_history(client, workflow_id)
    return facts.input, facts.events


def timeline_from_history(history: list[Any]) -> tuple[dict[str, Any], list[TimelineEvent]]:
    """One execution's input and timeline events (``read_history``)."""
    facts = read_history(history)
    return facts.input, facts.events


def _time(event: Any) -> datetime:
    when: datetime = event.event_time.ToDatetime()
    return when.replace(tzinfo=UTC)


def _seconds(duration: Any) -> float:
    return float(duration.seconds + duration.nanos / 1e9)


def _retry_interval(retry: tuple[float, float, float], attempt: int) -> float:
    """The server's wait before ``attempt`` (2, 3, ...) under the retry policy."""
    initial, coefficient, maximum = retry
    return min(initial * coefficient ** max(0, attempt - 2), maximum)


def _reached(failure: Any) -> int | None:
    """The step the last heartbeat of a failed attempt reported (its furthest), if any."""
    for f in (failure, failure.cause if failure.HasField("cause") else None):
        if f is None or not f.HasField("timeout_failure_info"):
            continue
        for payload in f.timeout_failure_info.last_heartbeat_details.payloads:
            details = _decoded(payload.data)
            steps = [details.get(k) for k in ("step", "reached", "committed_step")]
            found = [int(s) for s in steps if isinstance(s, int) and not isinstance(s, bool)]
            if found:
                return max(found)
    return None


def _heartbeat_timed_out(failure: Any) -> bool:
    for f in (failure, failure.cause if failure.HasField("cause") else None):
        if f is not None and f.HasField("timeout_failure_info"):
            return bool(f.timeout_failure_info.timeout_type == TimeoutType.TIMEOUT_TYPE_HEARTBEAT)
    return False


def _last_sign(failure: Any, detected: datetime, heartbeat_timeout: float) -> datetime:
    """A heartbeat timeout fires that long after the last heartbeat; a reported failure is itself
    the attempt's last sign of life."""
    if _heartbeat_timed_out(failure) and heartbeat_timeout > 0:
        return detected - timedelta(seconds=heartbeat_timeout)
    return detected


def _reach_from_retry(
    events: list[TimelineEvent], attempts: list[SegmentAttempt], resumed: Any, recomputed: Any
) -> None:
    """The server's record of a lost attempt carries no heartbeat details; its retry measured
    how far the lost attempt got (``resumed_from_step + recomputed_steps``): fill in the lost
    attempt's last step, and its failure's, where the history alone did not say."""
    if not isinstance(resumed, int) or not isinstance(recomputed, int) or isinstance(recomputed, bool):
        return
    reached = resumed + max(0, recomputed)
    for i in range(len(attempts) - 2, -1, -1):  # before the retry itself, the last one on the list
        a = attempts[i]
        if a.outcome in ("lost", "failed") and a.end_step is None:
            attempts[i] = replace(a, end_step=reached)
            for j in range(len(events) - 1, -1, -1):
                e = events[j]
                if e.kind == "failure" and e.at == a.ended_at and e.step is None:
                    events[j] = replace(e, step=reached)
                    break
            return
        if a.outcome == "completed":
            return


def read_history(history: list[Any], *, durable_step: int | None = None) -> HistoryFacts:
    """One execution's history events (``temporalio.api.history.v1.HistoryEvent``) as the
    run's input, timeline and segment attempts.

    A plain segment is retried by Temporal (its attempts show as ``attempt > 1`` starts); a
    gang segment is one ``train_gang_node`` per node, scheduled together in one workflow task,
    and retried whole by the workflow: the first node that failed is the attempt's one failure,
    the other nodes (cancelled by the workflow, or failing with their broken peer) are part of
    it, a gang interrupted on request is one interruption, and the retry's restore says at
    which world size it resumed (an elastic run may have shrunk). ``durable_step``: the run's
    committed step when this execution began (from the previous one)."""
    facts = HistoryFacts(durable_step=durable_step)
    events, attempts = facts.events, facts.attempts
    scheduled: dict[int, _Scheduled] = {}
    started_at: dict[int, datetime] = {}
    closed_batches: set[int] = set()  # gang attempts already on the list of attempts
    failed_batches: set[int] = set()
    interrupted_batches: set[int] = set()
    for event in history:
        at = _time(event)
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED and not facts.input:
            payloads = event.workflow_execution_started_event_attributes.input.payloads
            facts.input = _decoded(payloads[0].data) if payloads else {}
            carry = facts.input.get("carry")
            if facts.durable_step is None and isinstance(carry, dict) and isinstance(carry.get("step"), int):
                facts.durable_step = carry["step"]
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
            done = event.workflow_execution_completed_event_attributes.result.payloads
            choices = _decoded(done[0].data).get("checkpoint_interval") if done else None
            facts.interval_choices = choices if isinstance(choices, list) else facts.interval_choices
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs_s = event.activity_task_scheduled_event_attributes
            name = attrs_s.activity_type.name
            payloads = attrs_s.input.payloads
            segment_input = _decoded(payloads[0].data) if name in SEGMENT_ACTIVITIES and payloads else {}
            node_input = segment_input if name == "train_gang_node" else {}
            every = segment_input.get("checkpoint_every")
            policy = attrs_s.retry_policy
            initial = _seconds(policy.initial_interval) if policy.HasField("initial_interval") else 1.0
            maximum = _seconds(policy.maximum_interval) if policy.HasField("maximum_interval") else 100 * initial
            retry = (initial, policy.backoff_coefficient or 2.0, maximum)
            hb = _seconds(attrs_s.heartbeat_timeout) if attrs_s.HasField("heartbeat_timeout") else 0.0
            if name in SEGMENT_ACTIVITIES and hb > 0 and facts.heartbeat_timeout_seconds is None:
                facts.heartbeat_timeout_seconds = hb
            batch = attrs_s.workflow_task_completed_event_id
            scheduled[event.event_id] = _Scheduled(
                name, batch, node_input, at, hb, retry, facts.durable_step, every if isinstance(every, int) else None
            )
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            started_at[attrs.scheduled_event_id] = at
            s = scheduled.get(attrs.scheduled_event_id)
            if attrs.attempt > 1 and s is not None and s.name == "train_segment":
                failure = attrs.last_failure
                detail = failure.message if attrs.HasField("last_failure") else "earlier attempt lost"
                detected = at - timedelta(seconds=_retry_interval(s.retry, attrs.attempt))
                sign = (
                    _last_sign(failure, detected, s.heartbeat_timeout) if attrs.HasField("last_failure") else detected
                )
                reached = _reached(failure) if attrs.HasField("last_failure") else None
                lost = attrs.attempt - 1
                events.append(TimelineEvent("failure", sign, reached, f"attempt {lost}: {detail}", detected))
                outcome = "lost" if attrs.HasField("last_failure") and _heartbeat_timed_out(failure) else "failed"
                first = lost == 1  # earlier attempts' starts are not in the history
                attempts.append(
                    SegmentAttempt(
                        lost, s.at if first else None, s.from_step if first else None, sign, reached, outcome, detected
                    )
                )
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs_c = event.activity_task_completed_event_attributes
            s = scheduled.get(attrs_c.scheduled_event_id)
            if s is None or not attrs_c.result.payloads:
                continue
            result = _decoded(attrs_c.result.payloads[0].data)
            if s.name in _DURABLE_STEP and isinstance(result.get("step"), int):
                facts.durable_step = result["step"]
            if s.name not in SEGMENT_ACTIVITIES:
                continue
            step, resumed = result.get("step"), result.get("resumed_from_step")
            last = next((e for e in reversed(events) if e.kind == "segment-end"), None)
            if s.name == "train_gang_node" and last is not None and last.step == step:
                continue  # another node of the same gang segment
            began = started_at.get(attrs_c.scheduled_event_id, s.at)
            world = s.node_input.get("world_size") if isinstance(s.node_input.get("world_size"), int) else None
            n = int(result.get("attempt", 1))
            if s.name == "train_segment" or s.batch not in closed_batches:
                attempts.append(SegmentAttempt(n, began, resumed, at, step, "completed", None, world))
                closed_batches.add(s.batch)
            events.append(TimelineEvent("segment-end", at, step, "segment completed"))
            changed = not facts.intervals or facts.intervals[-1][1] != s.every
            if s.every is not None and isinstance(resumed, int) and changed:
                facts.intervals.append((resumed, s.every))
            if isinstance(step, int):
                facts.durable_step = step
            if n > 1:  # the retry resumed from its last durable checkpoint
                detail = f"attempt {result['attempt']}" + (f" at world size {world}" if world else "")
                events.append(TimelineEvent("restore", began, resumed, detail))
                _reach_from_retry(events, attempts, resumed, result.get("recomputed_steps"))
        elif kind in (EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT):
            timed_out = kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
            attrs_f = (
                event.activity_task_timed_out_event_attributes
                if timed_out
                else event.activity_task_failed_event_attributes
            )
            s = scheduled.get(attrs_f.scheduled_event_id) or _Scheduled("", 0, {}, at, 0.0, (1.0, 2.0, 100.0), None)
            failure = attrs_f.failure
            message = "activity timed out" if timed_out else failure.message
            error = failure.application_failure_info.type if failure.HasField("application_failure_info") else ""
            gang_node = s.name == "train_gang_node"
            if gang_node and s.batch in failed_batches:
                # A node of a gang that already failed: stopped by the workflow (it checkpoints and
                # reports an interruption) or its collectives broke with the failed peer. One
                # failure per gang attempt.
                continue
            began = started_at.get(attrs_f.scheduled_event_id, s.at)
            if not timed_out and error == "SegmentInterrupted":
                details = failure.application_failure_info.details.payloads
                stopped = _decoded(details[0].data).get("step") if details else None
                if not gang_node or s.batch not in interrupted_batches:
                    events.append(TimelineEvent("interrupted", at, None, message))  # once per gang
                    if isinstance(stopped, int):
                        attempts.append(SegmentAttempt(1, began, s.from_step, at, stopped, "interrupted"))
                        facts.durable_step = stopped
                interrupted_batches.add(s.batch)
                continue
            sign, reached = _last_sign(failure, at, s.heartbeat_timeout), _reached(failure)
            if gang_node:
                failed_batches.add(s.batch)
                node = s.node_input.get("node_index")
                message = f"gang node {node}: {message}" if isinstance(node, int) else message
            events.append(TimelineEvent("failure", sign, reached, message, at))
            if s.name in SEGMENT_ACTIVITIES:
                outcome = "lost" if _heartbeat_timed_out(failure) else "failed"
                world = s.node_input.get("world_size") if isinstance(s.node_input.get("world_size"), int) else None
                attempts.append(SegmentAttempt(1, began, s.from_step, sign, reached, outcome, at, world))
                closed_batches.add(s.batch)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            cancelled_id = event.activity_task_canceled_event_attributes.scheduled_event_id
            s = scheduled.get(cancelled_id)
            name_x, batch = (s.name, s.batch) if s is not None else ("", 0)
            if name_x == "train_gang_node" and batch in failed_batches | interrupted_batches:
                continue  # its gang failed (that failure is on the timeline) or is already interrupted
            events.append(TimelineEvent("interrupted", at, None, "segment cancelled on request"))
            interrupted_batches.add(batch)
    return facts


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
