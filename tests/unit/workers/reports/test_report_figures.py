"""`cairn run report` of a run whose worker was SIGKILLed in the first epoch, from synthetic but
realistic inputs: Temporal's history (a segment whose first attempt died at step 45 and was
failed by its 10 s heartbeat timeout, its retry from step 40, a second segment) and a store of
which retention kept only the last 3 checkpoints. The figures are checked as data."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from temporalio.api.common.v1 import ActivityType, Payload, Payloads, RetryPolicy
from temporalio.api.enums.v1 import EventType, TimeoutType
from temporalio.api.failure.v1 import Failure, TimeoutFailureInfo
from temporalio.api.history.v1 import (
    ActivityTaskCompletedEventAttributes,
    ActivityTaskScheduledEventAttributes,
    ActivityTaskStartedEventAttributes,
    HistoryEvent,
    WorkflowExecutionStartedEventAttributes,
)

from cairn.runs.record import CommitPoint, RunRecord
from workers.reports.figures import STALL, loss_figure, throughput_figure, timeline_figure
from workers.reports.plots import Figure
from workers.reports.run import attach_history, write_report
from workers.reports.timeline import read_history

T0 = 1_800_000_000.0
HEARTBEAT_TIMEOUT = 10.0
RETRY_INITIAL = 0.2
BATCH = 32


def _payloads(body: dict[str, Any]) -> Payloads:
    return Payloads(payloads=[Payload(data=json.dumps(body).encode())])


class History:
    def __init__(self) -> None:
        self.events: list[HistoryEvent] = []

    def add(self, at: float, kind: int, **attrs: Any) -> int:
        event_id = len(self.events) + 1
        when = Timestamp(seconds=int(T0 + at), nanos=round((at - int(at)) * 1e9))
        self.events.append(HistoryEvent(event_id=event_id, event_time=when, event_type=kind, **attrs))  # type: ignore[arg-type]
        return event_id

    def schedule(self, at: float, name: str) -> int:
        seconds = int(HEARTBEAT_TIMEOUT)
        return self.add(
            at,
            EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
            activity_task_scheduled_event_attributes=ActivityTaskScheduledEventAttributes(
                activity_type=ActivityType(name=name),
                heartbeat_timeout=Duration(seconds=seconds),
                retry_policy=RetryPolicy(
                    initial_interval=Duration(nanos=int(RETRY_INITIAL * 1e9)),
                    backoff_coefficient=2.0,
                    maximum_interval=Duration(seconds=1),
                ),
            ),
        )

    def start(self, at: float, sid: int, attempt: int = 1, last_failure: Failure | None = None) -> None:
        attrs = ActivityTaskStartedEventAttributes(scheduled_event_id=sid, attempt=attempt)
        if last_failure is not None:
            attrs.last_failure.CopyFrom(last_failure)
        self.add(at, EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED, activity_task_started_event_attributes=attrs)

    def complete(self, at: float, sid: int, result: dict[str, Any]) -> None:
        self.add(
            at,
            EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED,
            activity_task_completed_event_attributes=ActivityTaskCompletedEventAttributes(
                scheduled_event_id=sid, result=_payloads(result)
            ),
        )


KILL_AT, REACHED, RESUMED = 19.0, 45, 40
"""The worker was SIGKILLed at t=19 s, its last heartbeat said step 45; the last commit was 40."""
DETECTED = KILL_AT + HEARTBEAT_TIMEOUT
RETRY_AT = DETECTED + RETRY_INITIAL


def killed_in_first_epoch(details: bool = True) -> list[HistoryEvent]:
    """``details``: whether the lost attempt's failure carries its last heartbeat's details (a real
    server's retry start does not: then only the retry's result says how far it got)."""
    h = History()
    h.add(
        0.0,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_STARTED,
        workflow_execution_started_event_attributes=WorkflowExecutionStartedEventAttributes(
            input=_payloads({"run_id": "gpt", "store": "/s", "heartbeat_timeout_seconds": HEARTBEAT_TIMEOUT})
        ),
    )
    opened = h.schedule(0.2, "open_run")
    h.start(0.3, opened)
    h.complete(0.9, opened, {"store_id": "x", "checkpoint": None, "step": 0, "fingerprint": None})
    first = h.schedule(1.0, "train_segment")
    lost = Failure(
        message="activity Heartbeat timeout",
        timeout_failure_info=TimeoutFailureInfo(
            timeout_type=TimeoutType.TIMEOUT_TYPE_HEARTBEAT,
            last_heartbeat_details=_payloads({"step": REACHED, "reached": REACHED, "committed_step": RESUMED})
            if details
            else None,
        ),
    )
    h.start(RETRY_AT, first, attempt=2, last_failure=lost)  # the only start the history keeps
    h.complete(60.0, first, {"step": 60, "attempt": 2, "resumed_from_step": RESUMED, "recomputed_steps": 5})
    second = h.schedule(60.5, "train_segment")
    h.start(60.6, second)
    h.complete(90.0, second, {"step": 120, "attempt": 1, "resumed_from_step": 60, "recomputed_steps": 0})
    return h.events


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(T0 + seconds, tz=UTC)


def record() -> RunRecord:
    """The store's side: every step's loss and lr (from 5.0 down past 0.05: two decades), an
    evaluation every 30 steps, and only the last 3 commits (retention deleted the others)."""
    steps = 120
    loss = [5.0 * math.exp(-k / 25) for k in range(steps)]
    kept = [CommitPoint(s, at(90.0 - (120 - s) * 0.49), 1000, f"/s/gpt/training/{s:012d}") for s in (100, 110, 120)]
    rec = RunRecord(
        run_id="gpt",
        store="/s",
        loss=loss,
        lr=[1e-3] * steps,
        commits=kept,
        latest=kept[-1].checkpoint,
        val_step=[30.0, 60.0, 90.0, 120.0],
        val_loss=[2.0, 0.6, 0.2, 0.1],
        metrics={"val_accuracy": [0.3, 0.6, 0.8, 0.9]},
        batch_size=BATCH,
    )
    return attach_history(rec, read_history(killed_in_first_epoch()))


def all_panels_have_units(fig: Figure) -> None:
    for panel in fig.panels:
        assert "(" in panel.xlabel and "(" in panel.ylabel, (panel.xlabel, panel.ylabel)


def test_the_history_gives_every_attempt_with_the_lost_one_ending_at_its_last_heartbeat() -> None:
    rec = record()
    assert rec.heartbeat_timeout_seconds == HEARTBEAT_TIMEOUT
    lost, retry, second = rec.attempts
    assert (lost.outcome, lost.from_step, lost.end_step) == ("lost", 0, REACHED)
    assert lost.started_at == at(1.0) and lost.ended_at == at(KILL_AT) and lost.detected_at == at(DETECTED)
    assert (retry.outcome, retry.from_step, retry.end_step, retry.started_at) == (
        "completed",
        RESUMED,
        60,
        at(RETRY_AT),
    )
    assert (second.from_step, second.end_step) == (60, 120)


def test_the_timeline_starts_at_step_0_and_shades_the_stall_with_the_failure_at_the_last_heartbeat() -> None:
    rec = record()
    fig = timeline_figure(rec)
    all_panels_have_units(fig)
    (panel,) = fig.panels
    progress = next(s for s in panel.series if s.label.startswith("progress"))
    assert (progress.x[0], progress.y[0]) == (0.0, 0.0)  # step 0, at the first attempt's start
    points = [(x, y) for x, y in zip(progress.x, progress.y, strict=True) if not math.isnan(x)]
    assert (KILL_AT - 1.0, float(REACHED)) in points  # the lost attempt, to its last heartbeat
    assert (RETRY_AT - 1.0, float(RESUMED)) in points  # the retry, from the step it resumed from
    assert points[-1] == (89.0, 120.0)
    (stall,) = [s for s in panel.spans if s.label == STALL]
    assert math.isclose(stall.x0, KILL_AT - 1.0) and math.isclose(stall.x1, RETRY_AT - 1.0)
    (failure,) = [m for m in panel.markers if m.label.startswith("fault")]
    assert math.isclose(failure.x, KILL_AT - 1.0) and failure.y == REACHED  # not at the detection
    (detected,) = panel.vlines
    assert math.isclose(detected.x, DETECTED - 1.0) and "detected" in detected.label
    (restore,) = [m for m in panel.markers if m.label.startswith("retry")]
    assert math.isclose(restore.x, RETRY_AT - 1.0) and restore.y == RESUMED
    kept = next(s for s in panel.series if s.label.startswith("checkpoint committed"))
    assert kept.y == (100.0, 110.0, 120.0)


def test_throughput_covers_every_segment_attempt_with_the_stall_shaded() -> None:
    rec = record()
    fig = throughput_figure(rec)
    all_panels_have_units(fig)
    steps_panel, samples_panel = fig.panels
    bars = [(s.x, s.y[0]) for s in steps_panel.series]
    assert [x for x, _ in bars] == [(0.0, KILL_AT - 1.0), (RETRY_AT - 1.0, 59.0), (59.6, 89.0)]
    expected = [REACHED / (KILL_AT - 1.0), (60 - RESUMED) / (60.0 - RETRY_AT), 60 / 29.4]
    assert all(math.isclose(r, e) for (_, r), e in zip(bars, expected, strict=True))
    assert [s.y[0] for s in samples_panel.series] == [r * BATCH for _, r in bars]
    assert [s.label for s in steps_panel.spans] == [STALL] and [s.label for s in samples_panel.spans] == [STALL]
    assert "steps/s" in steps_panel.ylabel and "samples/s" in samples_panel.ylabel


def test_loss_is_on_a_log_scale_with_validation_loss_and_metrics_on_the_same_figure() -> None:
    fig = loss_figure(record())
    all_panels_have_units(fig)
    loss, metrics, lr = fig.panels
    assert loss.yscale == "log"
    train = loss.series[0]
    assert train.x[0] == 1.0 and len(train.x) == 120  # every step, whatever retention deleted
    val = next(s for s in loss.series if s.label == "validation loss")
    assert val.x == (30.0, 60.0, 90.0, 120.0) and val.y == (2.0, 0.6, 0.2, 0.1)
    assert [s.label for s in metrics.series] == ["val_accuracy"] and "fraction" in metrics.ylabel
    assert "learning rate" in lr.ylabel
    flat = RunRecord("r", "/s", [1.0, 0.5, 0.2], [0.1] * 3, [], "x")
    assert loss_figure(flat).panels[0].yscale == "linear"  # less than a decade: linear


def test_the_report_writes_its_pngs(tmp_path: Path) -> None:
    result, text, files = write_report(record(), tmp_path / "report")
    names = [f.name for f in files]
    assert names == ["loss_lr.png", "timeline.png", "throughput.png", "summary.txt"]
    assert all(f.stat().st_size > 5000 for f in files[:3])
    assert result["failures"] == 1 and result["restores"] == 1 and result["segment_attempts"] == 3
    assert math.isclose(result["stalled_seconds"], RETRY_AT - KILL_AT)
    assert "3 segment attempt(s)" in text
    bare = RunRecord("r", "/s", [1.0, 0.5], [0.1] * 2, [CommitPoint(2, at(1.0), 10, "c")], "c")
    assert write_report(bare, tmp_path / "bare")[0]["segment_attempts"] == 0  # `cairn report`: no history


def test_a_lost_attempt_without_heartbeat_details_ends_where_its_retry_measured() -> None:
    """The server's record of the retry's start has no heartbeat details: the lost attempt's last
    step is its retry's ``resumed_from_step + recomputed_steps`` (what the retry measured)."""
    facts = read_history(killed_in_first_epoch(details=False))
    lost = [a for a in facts.attempts if a.outcome == "lost"]
    assert [(a.from_step, a.end_step) for a in lost] == [(0, REACHED)]
    failures = [e for e in facts.events if e.kind == "failure"]
    assert [e.step for e in failures] == [REACHED]
