"""Shared by the report tests: Temporal histories built event by event at chosen times, and the
recorded ones (``histories/``, written by ``record_fault_histories.py``) read back with the
store's commits and the moments the recorder saw."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.common.v1 import ActivityType, Payload, Payloads, RetryPolicy
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure, TimeoutFailureInfo
from temporalio.api.history.v1 import (
    ActivityTaskCompletedEventAttributes,
    ActivityTaskFailedEventAttributes,
    ActivityTaskScheduledEventAttributes,
    ActivityTaskStartedEventAttributes,
    ActivityTaskTimedOutEventAttributes,
    HistoryEvent,
    WorkflowExecutionStartedEventAttributes,
)
from temporalio.client import WorkflowHistory

from cairn.runs.record import CommitPoint, RunRecord
from workers.reports.run import attach_history
from workers.reports.timeline import HistoryFacts, read_history

T0 = 1_800_000_000.0
RECORDED = Path(__file__).resolve().parent / "histories"


def payloads(body: dict[str, Any]) -> Payloads:
    return Payloads(payloads=[Payload(data=json.dumps(body).encode())])


def at(seconds: float) -> datetime:
    """``seconds`` after ``T0``, the moment every built history counts from."""
    return datetime.fromtimestamp(T0 + seconds, tz=UTC)


class History:
    """A workflow history built event by event, each at a chosen time (seconds after ``T0``)."""

    def __init__(self, run_input: dict[str, Any]) -> None:
        self.events: list[HistoryEvent] = []
        attrs = WorkflowExecutionStartedEventAttributes(input=payloads(run_input))
        self.add(
            0.0, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED, workflow_execution_started_event_attributes=attrs
        )

    def add(self, seconds: float, kind: int, **attrs: Any) -> int:
        event_id = len(self.events) + 1
        when = Timestamp(seconds=int(T0 + seconds), nanos=round((seconds - int(seconds)) * 1e9))
        self.events.append(HistoryEvent(event_id=event_id, event_time=when, event_type=kind, **attrs))  # type: ignore[arg-type]
        return event_id

    def schedule(
        self,
        seconds: float,
        name: str,
        body: dict[str, Any] | None = None,
        heartbeat_timeout: float = 10.0,
        retry_initial: float = 0.2,
        batch: int = 0,
    ) -> int:
        return self.add(
            seconds,
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
            activity_task_scheduled_event_attributes=ActivityTaskScheduledEventAttributes(
                activity_type=ActivityType(name=name),
                input=payloads(body or {}),
                heartbeat_timeout=Duration(seconds=int(heartbeat_timeout), nanos=int(heartbeat_timeout % 1 * 1e9)),
                retry_policy=RetryPolicy(
                    initial_interval=Duration(nanos=int(retry_initial * 1e9)),
                    backoff_coefficient=2.0,
                    maximum_interval=Duration(seconds=1),
                ),
                workflow_task_completed_event_id=batch,
            ),
        )

    def start(self, seconds: float, sid: int, attempt: int = 1, last_failure: Failure | None = None) -> None:
        attrs = ActivityTaskStartedEventAttributes(scheduled_event_id=sid, attempt=attempt)
        if last_failure is not None:
            attrs.last_failure.CopyFrom(last_failure)
        self.add(seconds, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED, activity_task_started_event_attributes=attrs)

    def complete(self, seconds: float, sid: int, result: dict[str, Any]) -> None:
        attrs = ActivityTaskCompletedEventAttributes(scheduled_event_id=sid, result=payloads(result))
        self.add(seconds, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED, activity_task_completed_event_attributes=attrs)

    def fail(self, seconds: float, sid: int, failure: Failure) -> None:
        attrs = ActivityTaskFailedEventAttributes(scheduled_event_id=sid, failure=failure)
        self.add(seconds, EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED, activity_task_failed_event_attributes=attrs)

    def time_out(self, seconds: float, sid: int, failure: Failure) -> None:
        attrs = ActivityTaskTimedOutEventAttributes(scheduled_event_id=sid, failure=failure)
        self.add(seconds, EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT, activity_task_timed_out_event_attributes=attrs)


def heartbeat_timeout(details: dict[str, Any] | None = None) -> Failure:
    """The server's failure of an attempt whose heartbeats stopped (with its last details, as on
    a timeout event; a retry's start carries none)."""
    info = TimeoutFailureInfo(timeout_type=TimeoutType.TIMEOUT_TYPE_HEARTBEAT)
    if details is not None:
        info.last_heartbeat_details.CopyFrom(payloads(details))
    return Failure(message="activity Heartbeat timeout", source="Server", timeout_failure_info=info)


def application_failure(message: str, error: str, details: dict[str, Any] | None = None) -> Failure:
    info = ApplicationFailureInfo(type=error)
    if details is not None:
        info.details.CopyFrom(payloads(details))
    return Failure(message=message, application_failure_info=info)


SUPERVISOR_RETRIED = (
    "the worker process running this attempt died (killed by SIGKILL); its supervisor failed the attempt "
    "so that it is retried now"
)


def segment_result(
    step: int, resumed: int, attempt: int, recomputed: int, train: float, saves: int = 0, blocked: float = 0.0
) -> dict[str, Any]:
    """A ``TrainSegmentResult`` as the history holds it (the fields the report reads)."""
    return {
        "step": step,
        "attempt": attempt,
        "resumed_from_step": resumed,
        "recomputed_steps": recomputed,
        "train_seconds": train,
        "saves": saves,
        "blocked_save_seconds": blocked,
    }


def run_of(facts: HistoryFacts, commits: list[CommitPoint], steps: int, **fields: Any) -> RunRecord:
    """The store's side of a run (every step's loss and lr, the kept ``commits``) with ``facts``."""
    loss = [2.0 / (1 + k / 10) for k in range(steps)]
    latest = commits[-1].checkpoint if commits else ""
    return attach_history(RunRecord("run", "/s", loss, [1e-3] * steps, commits, latest, **fields), facts)


@dataclass(frozen=True)
class Recorded:
    """A recorded run: its report's record, and what the recorder saw (unix seconds)."""

    record: RunRecord
    truth: dict[str, Any]


def recorded(scenario: str, keep_last: int | None = None) -> Recorded:
    """``histories/SCENARIO.json`` as a run record; ``keep_last``: only the last commits kept,
    as retention leaves them."""
    body = json.loads((RECORDED / f"{scenario}.json").read_text())
    truth = body["truth"]
    (history,) = body["histories"]  # one execution: no continue-as-new in a recorded run
    facts = read_history(list(WorkflowHistory.from_json(truth["run_id"], history).events))
    commits = [
        CommitPoint(step, datetime.fromtimestamp(when, tz=UTC), size, f"/s/run/training/{step:012d}")
        for step, when, size in truth["commits"]
    ]
    kept = commits[-keep_last:] if keep_last else commits
    return Recorded(run_of(facts, kept, truth["steps"]), truth)
