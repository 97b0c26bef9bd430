"""``cairn run report``'s timeline from Temporal history, for gang segments: the node that
failed is the failure, the nodes the workflow cancelled because of it are not interruptions,
and the retry's restore names the world size it resumed at (an elastic run shrinks)."""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.common.v1 import ActivityType, Payload, Payloads
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import ApplicationFailureInfo, Failure, TimeoutFailureInfo
from temporalio.api.history.v1 import (
    ActivityTaskCanceledEventAttributes,
    ActivityTaskCompletedEventAttributes,
    ActivityTaskFailedEventAttributes,
    ActivityTaskScheduledEventAttributes,
    ActivityTaskStartedEventAttributes,
    ActivityTaskTimedOutEventAttributes,
    HistoryEvent,
    WorkflowExecutionStartedEventAttributes,
)

from workers.reports.faults import Fault
from workers.reports.timeline import timeline_from_history


class History:
    """A history built event by event, one second apart."""

    def __init__(self) -> None:
        self.events: list[HistoryEvent] = []

    def add(self, kind: int, **attrs: Any) -> int:
        event_id = len(self.events) + 1
        when = Timestamp(seconds=1_800_000_000 + event_id)
        self.events.append(HistoryEvent(event_id=event_id, event_time=when, event_type=kind, **attrs))  # type: ignore[arg-type]
        return event_id

    def started(self, body: dict[str, Any]) -> None:
        payloads = Payloads(payloads=[Payload(data=json.dumps(body).encode())])
        self.add(
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
            workflow_execution_started_event_attributes=WorkflowExecutionStartedEventAttributes(input=payloads),
        )

    def gang(self, batch: int, world: int, nodes: int) -> list[int]:
        ids = []
        for node in range(nodes):
            body = {"world_size": world, "node_index": node, "nnodes": nodes}
            ids.append(
                self.add(
                    EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
                    activity_task_scheduled_event_attributes=ActivityTaskScheduledEventAttributes(
                        activity_type=ActivityType(name="train_gang_node"),
                        workflow_task_completed_event_id=batch,
                        input=Payloads(payloads=[Payload(data=json.dumps(body).encode())]),
                    ),
                )
            )
        for sid in ids:
            self.add(
                EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED,
                activity_task_started_event_attributes=ActivityTaskStartedEventAttributes(
                    scheduled_event_id=sid, attempt=1
                ),
            )
        return ids

    def failed(self, sid: int, message: str, error: str = "RankFailedError") -> None:
        failure = Failure(message=message, application_failure_info=ApplicationFailureInfo(type=error))
        self.add(
            EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED,
            activity_task_failed_event_attributes=ActivityTaskFailedEventAttributes(
                scheduled_event_id=sid, failure=failure
            ),
        )

    def timed_out(self, sid: int) -> None:
        self.add(
            EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT,
            activity_task_timed_out_event_attributes=ActivityTaskTimedOutEventAttributes(
                scheduled_event_id=sid,
                failure=Failure(
                    message="activity Heartbeat timeout",
                    timeout_failure_info=TimeoutFailureInfo(timeout_type=TimeoutType.TIMEOUT_TYPE_HEARTBEAT),
                ),
            ),
        )

    def cancelled(self, sid: int) -> None:
        self.add(
            EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED,
            activity_task_canceled_event_attributes=ActivityTaskCanceledEventAttributes(scheduled_event_id=sid),
        )

    def completed(self, sid: int, result: dict[str, Any]) -> None:
        self.add(
            EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
            activity_task_completed_event_attributes=ActivityTaskCompletedEventAttributes(
                scheduled_event_id=sid, result=Payloads(payloads=[Payload(data=json.dumps(result).encode())])
            ),
        )


def summary(events: list[Any]) -> list[tuple[str, int | None, str]]:
    return [(e.kind, e.step, e.detail) for e in events]


def test_a_failed_gang_attempt_is_one_failure_and_its_retry_a_restore_at_its_world_size() -> None:
    h = History()
    h.started({"run_id": "r", "store": "/s"})
    first = h.gang(batch=100, world=4, nodes=2)
    h.failed(first[1], "rank 3 exited with -9")  # node 1 fails, the workflow cancels node 0,
    h.failed(first[0], "stopped at step 7 on request", error="SegmentInterrupted")  # which checkpoints
    second = h.gang(batch=200, world=4, nodes=2)
    h.timed_out(second[0])  # node 0's worker vanished: its heartbeat stops
    h.failed(second[1], "rank 2: connection closed by peer", error="GangFailedError")  # its peer broke
    third = h.gang(batch=300, world=2, nodes=1)  # elastic: half the ranks on the first node
    h.completed(third[0], {"step": 12, "attempt": 3, "resumed_from_step": 6})
    inp, events = timeline_from_history(h.events)
    assert inp == {"run_id": "r", "store": "/s"}
    assert summary(events) == [  # in time order: the restore where the retry started, before its end
        ("failure", None, "gang node 1: rank 3 exited with -9"),
        ("failure", None, "gang node 0: activity Heartbeat timeout"),
        ("restore", 6, "attempt 3 at world size 2"),
        ("segment-end", 12, "segment completed"),
    ]
    failures = [e for e in events if isinstance(e, Fault)]
    assert [f.detector for f in failures] == ["error", "heartbeat"]  # what failed each gang attempt
    # each stalls until the next gang attempt started (none reported its training time)
    lost_first, lost_second = failures
    assert lost_first.detected_at is not None and lost_first.retry_at is not None
    assert lost_first.detected_at < lost_first.retry_at < lost_second.at and lost_second.retry_at == events[2].at


def test_every_way_the_other_nodes_of_a_failed_gang_end_is_part_of_its_one_failure() -> None:
    h = History()
    ids = h.gang(batch=100, world=6, nodes=3)
    h.failed(ids[2], "rank 5 exited with -9")
    h.failed(ids[0], "stopped at step 3 on request", error="SegmentInterrupted")  # stopped, checkpointed
    h.cancelled(ids[1])  # cancelled before its code ran
    _, events = timeline_from_history(h.events)
    assert summary(events) == [("failure", None, "gang node 2: rank 5 exited with -9")]


def test_a_gang_interrupted_on_request_is_one_interruption() -> None:
    h = History()
    ids = h.gang(batch=100, world=4, nodes=2)
    for sid in ids:
        h.cancelled(sid)
    ids = h.gang(batch=200, world=4, nodes=2)
    for sid in ids:
        h.failed(sid, "stopped at step 9 on request", error="SegmentInterrupted")
    _, events = timeline_from_history(h.events)
    assert summary(events) == [
        ("interrupted", None, "segment cancelled on request"),
        ("interrupted", None, "stopped at step 9 on request"),
    ]
