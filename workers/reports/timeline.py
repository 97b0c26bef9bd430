"""A run's timeline from Temporal's history (``cairn run report``): its segment attempts, and
segment ends, restores, training starts, interruptions and faults placed on the run's steps
beside its commits.

Heartbeats are not history events. What the history does record of a lost attempt depends on who
handled it: a failure or timeout the workflow saw is an event at the moment the server failed the
attempt (the supervisor's report, the heartbeat timeout, a hand-back); a segment Temporal retried
itself keeps only its last attempt's start, carrying the failure before it, so that failure's
moment is placed by ``workers.reports.faults``. A finished attempt measured when it began
training (its result's training seconds): the end of a stall.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from temporalio.api.enums.v1 import EventType, TimeoutType

from activities.edge import INTERRUPTED, WORKER_CRASHED
from cairn.errors import TemporalRefusedError
from cairn.runs import CommitPoint, RunRecord, SegmentAttempt, TimelineEvent
from workers.reports.faults import Lost, Pace, Trained, place

if TYPE_CHECKING:
    from collections.abc import Sequence

    from temporalio.client import Client

__all__ = [
    "SEGMENT_ACTIVITIES",
    "WORKER_SHUTDOWN",
    "HistoryFacts",
    "place_on_steps",
    "read_history",
    "run_events",
    "run_history",
    "timeline_from_history",
]

SEGMENT_ACTIVITIES = ("train_segment", "train_gang_node")
"""Activities that train: a segment in the worker's thread, or one node's share of a gang."""
WORKER_SHUTDOWN = "WorkerShutdown"
"""Error type of a segment its worker handed back on SIGTERM, after committing."""
_DURABLE_STEP = ("open_run", "latest_checkpoint")
"""Bookkeeping activities whose result names the run's latest committed step."""


@dataclass
class HistoryFacts:
    """What one or more executions' histories say: the run's input, what its segment attempts
    did (``trained``, ``lost``, ``marks``), and the heartbeat timeout its segments were scheduled
    with. ``timeline(commits)`` places them: the run's events and attempts."""

    input: dict[str, Any] = field(default_factory=dict)
    marks: list[TimelineEvent] = field(default_factory=list)
    """Segment ends, restores, training starts and interruptions."""
    trained: list[Trained] = field(default_factory=list)
    """Attempts that reported how they went (completed, interrupted)."""
    lost: list[Lost] = field(default_factory=list)
    starts: list[datetime] = field(default_factory=list)
    """Every recorded start of a segment attempt."""
    heartbeat_timeout_seconds: float | None = None
    durable_step: int | None = None
    intervals: list[tuple[int, int]] = field(default_factory=list)
    """(step, steps between checkpoints) from each segment whose interval differed from the last."""
    interval_choices: list[dict[str, Any]] = field(default_factory=list)
    """``checkpoint.every: "auto"``: the choices the finished run reported (``RunSummary``)."""

    def timeline(self, commits: Sequence[CommitPoint] = ()) -> tuple[list[TimelineEvent], list[SegmentAttempt]]:
        """The run's events and segment attempts in time order, each lost attempt placed with the
        store's kept ``commits`` (``workers.reports.faults.place``)."""
        placed = [place(lost, *self._retry_of(lost), self.trained, commits) for lost in self.lost]
        events = sorted([*self.marks, *(f for f, _ in placed)], key=lambda e: e.at)
        attempts = [t.attempt for t in self.trained] + [a for _, a in placed]
        return events, sorted(attempts, key=lambda a: a.started_at or a.ended_at or datetime.min.replace(tzinfo=UTC))

    def _retry_of(self, lost: Lost) -> tuple[datetime | None, Trained | None]:
        """The start of the attempt that followed ``lost`` (Temporal's retry, which recorded the
        failure; else the first attempt started after the failure event) and, if that attempt
        reported how it went, its report (a gang's: its first node's to report, before any
        other loss)."""
        retry_at = lost.retry_at
        if retry_at is None and lost.reported_at is not None:
            retry_at = min((t for t in self.starts if t >= lost.reported_at), default=None)
        if retry_at is None:
            return None, None
        losses = [x.reported_at or x.retry_at for x in self.lost if x is not lost]
        for t in sorted(self.trained, key=lambda t: t.attempt.started_at or retry_at):
            began = t.attempt.started_at
            if began is None or began < retry_at:
                continue
            if any(at is not None and retry_at < at <= began for at in losses):
                return retry_at, None  # that attempt was lost too
            return retry_at, t
        return retry_at, None

    @property
    def events(self) -> list[TimelineEvent]:
        return self.timeline()[0]

    @property
    def attempts(self) -> list[SegmentAttempt]:
        return self.timeline()[1]

    def extend(self, later: HistoryFacts) -> None:
        """Add a later execution's facts (continue-as-new)."""
        self.input = self.input or later.input
        self.marks += later.marks
        self.trained += later.trained
        self.lost += later.lost
        self.starts += later.starts
        self.heartbeat_timeout_seconds = self.heartbeat_timeout_seconds or later.heartbeat_timeout_seconds
        self.durable_step = later.durable_step
        self.intervals += [i for i in later.intervals if not self.intervals or i[1] != self.intervals[-1][1]]
        self.interval_choices = later.interval_choices or self.interval_choices


@dataclass
class _Scheduled:
    name: str
    batch: int
    segment_input: dict[str, Any]
    at: datetime
    heartbeat_timeout: float
    retry: tuple[float, float, float]  # initial interval, backoff coefficient, maximum interval (s)
    from_step: int | None
    every: int | None = None

    @property
    def node_input(self) -> dict[str, Any]:
        return self.segment_input if self.name == "train_gang_node" else {}

    def int_field(self, key: str) -> int | None:
        value = self.segment_input.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else None


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
        facts.extend(read_history(history, durable_step=facts.durable_step))
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


def _chain(failure: Any) -> list[Any]:
    return [failure, *([failure.cause] if failure.HasField("cause") else [])]


def _reached(failure: Any) -> int | None:
    """The step a failed attempt last reported (its furthest): its last heartbeat's details, or
    the details its supervisor or its hand-back attached."""
    for f in _chain(failure):
        if f.HasField("timeout_failure_info"):
            payloads = f.timeout_failure_info.last_heartbeat_details.payloads
        elif f.HasField("application_failure_info"):
            payloads = f.application_failure_info.details.payloads
        else:
            continue
        for payload in payloads:
            details = _decoded(payload.data)
            steps = [details.get(k) for k in ("step", "reached", "committed_step")]
            found = [int(s) for s in steps if isinstance(s, int) and not isinstance(s, bool)]
            if found:
                return max(found)
    return None


def _error_type(failure: Any) -> str:
    for f in _chain(failure):
        if f.HasField("application_failure_info"):
            return str(f.application_failure_info.type)
    return ""


def _timeout_type(failure: Any) -> int | None:
    for f in _chain(failure):
        if f.HasField("timeout_failure_info"):
            return int(f.timeout_failure_info.timeout_type)
    return None


def _detector(failure: Any) -> str:
    """Who failed the attempt (a key of ``workers.reports.faults.DETECTORS``)."""
    timeout = _timeout_type(failure)
    if timeout == TimeoutType.TIMEOUT_TYPE_HEARTBEAT:
        return "heartbeat"
    if timeout is not None:
        return "timeout"
    return {WORKER_CRASHED: "supervisor", WORKER_SHUTDOWN: "hand-back"}.get(_error_type(failure), "error")


def _trained(
    s: _Scheduled, result: dict[str, Any], began: datetime, at: datetime
) -> tuple[SegmentAttempt, datetime | None, Pace | None]:
    """A finished attempt, when it began training (its own measure: its end minus its training
    and save seconds) and its pace."""
    step, resumed = result.get("step"), result.get("resumed_from_step")
    world = s.int_field("world_size") if s.name == "train_gang_node" else None
    attempt = SegmentAttempt(int(result.get("attempt", 1)), began, resumed, at, step, "completed", None, world)
    train, blocked, saves = (result.get(k) for k in ("train_seconds", "blocked_save_seconds", "saves"))
    if not isinstance(train, int | float) or train <= 0:
        return attempt, None, None
    blocked = float(blocked) if isinstance(blocked, int | float) else 0.0
    training_at = max(began, min(at, at - timedelta(seconds=float(train) + blocked)))
    steps = (step - resumed) if isinstance(step, int) and isinstance(resumed, int) else 0
    if steps <= 0:
        return attempt, training_at, None
    per_save = blocked / saves if isinstance(saves, int) and saves > 0 else 0.0
    pace = Pace(float(train) / steps, per_save, (training_at - began).total_seconds())
    return attempt, training_at, pace


def read_history(history: list[Any], *, durable_step: int | None = None) -> HistoryFacts:
    """One execution's history events (``temporalio.api.history.v1.HistoryEvent``) as the
    run's input and what its segment attempts did.

    A plain segment is retried by Temporal (its attempts show as ``attempt > 1`` starts), or,
    on a warm worker's own queue, failed back to the workflow, which offers it again; a gang
    segment is one ``train_gang_node`` per node, scheduled together in one workflow task, and
    retried whole by the workflow: the first node that failed is the attempt's one failure,
    the other nodes (cancelled by the workflow, or failing with their broken peer) are part of
    it, a gang interrupted on request is one interruption, and the retry's restore says at
    which world size it resumed (an elastic run may have shrunk). ``durable_step``: the run's
    committed step when this execution began (from the previous one)."""
    facts = HistoryFacts(durable_step=durable_step)
    scheduled: dict[int, _Scheduled] = {}
    started: dict[int, tuple[datetime, int]] = {}  # scheduled event id -> (start, attempt)
    closed_batches: set[int] = set()  # gang attempts already on the list of attempts
    failed_batches: set[int] = set()
    interrupted_batches: set[int] = set()
    last_end: int | None = None  # the step of the last segment end
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
                name, batch, segment_input, at, hb, retry, facts.durable_step, every if isinstance(every, int) else None
            )
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            started[attrs.scheduled_event_id] = (at, attrs.attempt)
            s = scheduled.get(attrs.scheduled_event_id)
            if s is None or s.name not in SEGMENT_ACTIVITIES:
                continue
            facts.starts.append(at)
            if attrs.attempt > 1 and s.name == "train_segment":  # Temporal retried it: the failure before
                failure = attrs.last_failure
                recorded = attrs.HasField("last_failure")
                first = attrs.attempt == 2  # earlier attempts' starts are not in the history
                facts.lost.append(
                    Lost(
                        attempt=attrs.attempt - 1 + (s.int_field("prior_attempts") or 0),
                        message=failure.message if recorded else "earlier attempt lost",
                        detector=_detector(failure) if recorded else "error",
                        started_at=s.at,
                        anchored=first,
                        from_step=s.from_step if first else None,
                        reached=_reached(failure) if recorded else None,
                        reported_at=None,
                        latest=at - timedelta(seconds=_retry_interval(s.retry, attrs.attempt)),
                        heartbeat_timeout=s.heartbeat_timeout,
                        every=s.every,
                        retry_at=at,
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
            if s.name == "train_gang_node" and (s.batch in closed_batches or last_end == step):
                continue  # another node of the same gang segment
            closed_batches.add(s.batch)
            began = started.get(attrs_c.scheduled_event_id, (s.at, 1))[0]
            attempt, training_at, pace = _trained(s, result, began, at)
            recomputed = result.get("recomputed_steps")
            facts.trained.append(
                Trained(attempt, training_at, recomputed if isinstance(recomputed, int) else None, pace)
            )
            facts.marks.append(TimelineEvent("segment-end", at, step, "segment completed"))
            last_end = step if isinstance(step, int) else last_end
            if attempt.attempt > 1:  # the retry resumed from its last durable checkpoint
                world = attempt.world_size
                detail = f"attempt {attempt.attempt}" + (f" at world size {world}" if world else "")
                facts.marks.append(TimelineEvent("restore", began, resumed, detail))
            if training_at is not None and isinstance(resumed, int):
                facts.marks.append(TimelineEvent("training", training_at, resumed, f"attempt {attempt.attempt} trains"))
            start = s.from_step if s.from_step is not None else resumed
            changed = not facts.intervals or facts.intervals[-1][1] != s.every
            if s.every is not None and isinstance(start, int) and changed:
                facts.intervals.append((start, s.every))
            if isinstance(step, int):
                facts.durable_step = step
        elif kind in (EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT):
            timed_out = kind == EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT
            attrs_f = (
                event.activity_task_timed_out_event_attributes
                if timed_out
                else event.activity_task_failed_event_attributes
            )
            sid = attrs_f.scheduled_event_id
            s = scheduled.get(sid) or _Scheduled("", 0, {}, at, 0.0, (1.0, 2.0, 100.0), None)
            failure = attrs_f.failure
            if _timeout_type(failure) == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START:
                continue  # no attempt started (a warm worker's queue not polled): offered again, not a fault
            message = "activity timed out" if timed_out and not failure.message else failure.message
            gang_node = s.name == "train_gang_node"
            if gang_node and s.batch in failed_batches:
                # A node of a gang that already failed: stopped by the workflow (it checkpoints and
                # reports an interruption) or its collectives broke with the failed peer. One
                # failure per gang attempt.
                continue
            began, tries = started.get(sid, (s.at, 1))
            if not timed_out and _error_type(failure) == INTERRUPTED:
                details = failure.application_failure_info.details.payloads
                stopped = _decoded(details[0].data).get("step") if details else None
                if not gang_node or s.batch not in interrupted_batches:
                    facts.marks.append(TimelineEvent("interrupted", at, None, message))  # once per gang
                    if isinstance(stopped, int):
                        attempt = SegmentAttempt(tries, began, s.from_step, at, stopped, "interrupted")
                        facts.trained.append(Trained(attempt, None, None, None))
                        facts.durable_step = stopped
                interrupted_batches.add(s.batch)
                continue
            if gang_node:
                failed_batches.add(s.batch)
                node = s.int_field("node_index")
                message = f"gang node {node}: {message}" if node is not None else message
            if s.name not in SEGMENT_ACTIVITIES:
                facts.marks.append(TimelineEvent("failure", at, None, message, at))
                continue
            number = (s.int_field("attempt") or 1) if gang_node else tries + (s.int_field("prior_attempts") or 0)
            facts.lost.append(
                Lost(
                    attempt=number,
                    message=message,
                    detector=_detector(failure),
                    started_at=began,
                    anchored=True,
                    from_step=s.from_step if tries == 1 else None,
                    reached=_reached(failure),
                    reported_at=at,
                    latest=at,
                    heartbeat_timeout=s.heartbeat_timeout,
                    every=s.every,
                    world_size=s.int_field("world_size") if gang_node else None,
                )
            )
            closed_batches.add(s.batch)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED:
            cancelled_id = event.activity_task_canceled_event_attributes.scheduled_event_id
            s = scheduled.get(cancelled_id)
            name_x, batch = (s.name, s.batch) if s is not None else ("", 0)
            if name_x == "train_gang_node" and batch in failed_batches | interrupted_batches:
                continue  # its gang failed (that failure is on the timeline) or is already interrupted
            facts.marks.append(TimelineEvent("interrupted", at, None, "segment cancelled on request"))
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
