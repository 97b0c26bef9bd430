"""A run report is true for every way a fault is detected: the failure at the lost attempt's last
sign of life, the detection when and by what detected it, the stall shaded to training again,
the stalled seconds and the recomputed steps — checked against known timelines.

Recorded (``histories/``, ``record_fault_histories.py``): real runs on a Temporal dev server with
real worker processes, each fault injected at a moment the recorder noted beside when it saw the
failure detected, the retry start and the retry training again (its log line). Built: the reported
case (a supervised worker SIGKILLed at 54.9 s whose restart took 10 s), a warm segment frozen on
its worker's own queue, a hand-back there."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import pytest

from cairn.runs.record import CommitPoint, RunRecord
from tests.unit.workers.reports.conftest import (
    SUPERVISOR_RETRIED,
    History,
    application_failure,
    at,
    heartbeat_timeout,
    recorded,
    run_of,
    segment_result,
)
from workers.reports.figures import STALL, loss_figure, origin, throughput_figure, timeline_figure
from workers.reports.run import summary, write_report
from workers.reports.timeline import read_history

HEARTBEAT_LAG = 0.4
"""A live attempt's last heartbeat the server holds is at most this old: the activity beats every
0.2 s at most and the SDK forwards at most every 0.2 s (``HEARTBEAT_THROTTLE``)."""
TIMER_PRECISION = 1.1
"""The server fires a heartbeat timeout at its expiry or up to about a second later."""


def shown(record: RunRecord) -> dict[str, Any]:
    """What the report shows of the run's one fault, in seconds since the run started."""
    t0 = origin(record)
    assert t0 is not None
    fig = timeline_figure(record)
    (panel,) = fig.panels
    (failure,) = [m for m in panel.markers if m.marker == "x"]
    (detected,) = [v for v in panel.vlines if "detected" in v.label]
    (stall,) = [s for s in panel.spans if s.label == STALL]
    restores = [m.x for m in panel.markers if m.label.startswith("retry started")]
    return {
        "t0": t0.timestamp(),
        "failure": failure,
        "detected": detected,
        "stall": stall,
        "restores": restores,
        "figure": fig,
        "summary": summary(record),
    }


# -- recorded runs -------------------------------------------------------------------------------
SCENARIOS = {
    "supervised_crash": "supervisor",  # shared queue: Temporal retried it; no time recorded
    "own_queue_crash": "supervisor",  # a warm worker's own queue: the supervisor's fail is an event
    "host_loss": "heartbeat timeout",  # supervisor and worker killed together
    "freeze": "heartbeat timeout",  # SIGSTOP: alive, silent
    "hand_back": "SIGTERM hand-back",
}


@pytest.mark.parametrize("keep_last", [None, 3], ids=["all-kept", "retention-kept-3"])
@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_a_recorded_fault_is_shown_where_and_when_it_happened(scenario: str, keep_last: int | None) -> None:
    run = recorded(scenario, keep_last)
    truth, seen = run.truth, shown(run.record)

    def x(key: str) -> float:
        return float(truth[key]) - float(seen["t0"])

    failure, detected, stall, s = seen["failure"], seen["detected"], seen["stall"], seen["summary"]
    # the last sign of life: at the fault, or a heartbeat before it (not at the retry)
    assert x("fault_at") - HEARTBEAT_LAG <= failure.x <= x("fault_at") + 0.1, (failure.x, x("fault_at"))
    # the detection: by the detector that detected it, when it did
    assert SCENARIOS[scenario] in detected.label, detected.label
    if SCENARIOS[scenario] == "heartbeat timeout":
        assert x("detected_at") - TIMER_PRECISION <= detected.x <= x("detected_at") + 0.1, (detected.x, truth)
    else:
        assert abs(detected.x - x("detected_at")) <= 0.3, (detected.x, x("detected_at"))
    assert [round(r, 2) for r in seen["restores"]] == [round(x("retry_started_at"), 2)]
    # the stall: from the last sign of life to training again, counted as shaded
    assert math.isclose(stall.x0, failure.x) and abs(stall.x1 - x("training_at")) <= 0.05, (stall, truth)
    assert math.isclose(s["stalled_seconds"], stall.x1 - stall.x0, abs_tol=1e-3)
    real = x("training_at") - x("fault_at")
    assert real - 0.05 <= s["stalled_seconds"] <= real + HEARTBEAT_LAG, (s["stalled_seconds"], real)
    # the steps recomputed: the step the lost attempt reached, less the one its retry resumed from
    (fault,) = s["faults"]
    assert failure.y == fault["step"] >= truth["step_at_fault"]
    assert s["recomputed_steps"] == fault["recomputed_steps"] == fault["step"] - fault["resumed_from_step"]
    assert s["failures"] + s["hand_backs"] == 1 and s["hand_backs"] == (scenario == "hand_back")
    # told in full under the plot
    assert any(fault["message"] in note for note in seen["figure"].notes), seen["figure"].notes


# -- the reported case ---------------------------------------------------------------------------
ORIGIN = 0.3
"""The segment was scheduled (and its first attempt started) 0.3 s after the workflow."""
KILL, CRASH_REPORTED, RETRY, TRAINING = 54.9, 55.0, 65.5, 71.0
"""Seconds since the run started: the worker process SIGKILLed, its supervisor's report, the
retry's start (the restarted process took 10 s to poll) and its first step (a 5.5 s restore)."""
EVERY, REACHED, RESUMED = 20, 52, 40


def step_time(k: int) -> float:
    """When the first attempt finished step ``k``: a 2 s start-up, 1 s a step, 0.1 s a save."""
    return 2.0 + k + 0.1 * ((k - 1) // EVERY)


def supervised_crash(keep_last: int | None = None) -> RunRecord:
    """One supervised worker, checkpointing every 20 steps from step 0; its worker process is
    SIGKILLed at 54.9 s (step 52 was its last heartbeat); the supervisor fails the attempt
    (retryable: Temporal retries it on the shared queue, recording no time); the retry starts when
    the restarted process polls, 10 s later, restores step 40 in 5.5 s and trains to step 100."""
    h = History({"run_id": "run", "store": "/s", "heartbeat_timeout_seconds": 30})
    opened = h.schedule(0.1, "open_run")
    h.start(0.1, opened)
    h.complete(0.2, opened, {"step": 0})
    sid = h.schedule(ORIGIN, "train_segment", {"checkpoint_every": EVERY}, heartbeat_timeout=30)
    crashed = application_failure(SUPERVISOR_RETRIED, "WorkerCrashed")
    h.start(ORIGIN + RETRY, sid, attempt=2, last_failure=crashed)
    end = TRAINING + 60 * 1.0 + 0.3
    result = segment_result(100, RESUMED, 2, REACHED - RESUMED, train=60.0, saves=3, blocked=0.3)
    h.complete(ORIGIN + end, sid, result)
    lost = [CommitPoint(k, at(ORIGIN + step_time(k)), 100, f"c{k}") for k in (20, 40)]
    retry = [
        CommitPoint(k, at(ORIGIN + TRAINING + (k - RESUMED) + 0.1 * ((k - 41) // EVERY)), 100, f"c{k}")
        for k in (60, 80, 100)
    ]
    commits = [CommitPoint(0, at(ORIGIN + 1.9), 100, "c0"), *lost, *retry]
    return run_of(read_history(h.events), commits[-keep_last:] if keep_last else commits, 100)


def test_the_reported_case_a_supervised_crash_retried_by_temporal_after_a_slow_restart() -> None:
    seen = shown(supervised_crash())
    failure, detected, stall, s = seen["failure"], seen["detected"], seen["stall"], seen["summary"]
    assert KILL - 1.0 <= failure.x <= KILL, failure  # at its last heartbeat, not at the retry (65.5 s)
    assert failure.y == REACHED
    assert "supervisor" in detected.label and KILL - 1.0 <= detected.x <= CRASH_REPORTED + 0.1, detected
    assert seen["restores"] == [pytest.approx(RETRY)]
    assert stall.x0 == failure.x and stall.x1 == pytest.approx(TRAINING)  # to training again, not the retry
    assert KILL - 1.0 <= TRAINING - s["stalled_seconds"] <= KILL  # ~16 s, not 0.2 s
    assert s["recomputed_steps"] == REACHED - RESUMED
    assert s["checkpoint_intervals"] == [{"from_step": 0, "every": EVERY}]  # the segment's start, not the retry's


def test_without_the_lost_attempts_commits_its_failure_is_an_estimate_said_to_be_one() -> None:
    """Retention deleted the commits of the lost attempt: its last sign of life is estimated from
    its start and the run's pace (marked so, bounded by the retry), the stall still ends at
    training again."""
    seen = shown(supervised_crash(keep_last=3))
    failure, stall = seen["failure"], seen["stall"]
    assert 0.0 < failure.x <= RETRY - 0.2 and "estimated" in failure.label
    assert stall.x1 == pytest.approx(TRAINING)
    assert any("estimated" in note for note in seen["figure"].notes)


def test_throughput_leaves_the_recovery_out_as_a_shaded_gap() -> None:
    rec = supervised_crash()
    steps_panel = throughput_figure(rec).panels[0]
    (stall,) = steps_panel.spans
    lost, retry = sorted(steps_panel.series, key=lambda s: s.x[0])
    assert lost.x[1] == pytest.approx(stall.x0)  # the lost attempt, to its last sign of life
    assert retry.x[0] == pytest.approx(TRAINING) == pytest.approx(stall.x1)  # the retry, from training again
    assert retry.y[0] == pytest.approx(60 / 60.3)  # 60 steps in 60.3 s of training (its saves included)


def test_the_summary_says_what_happened_in_full(tmp_path: Any) -> None:
    result, text, _ = write_report(supervised_crash(), tmp_path)
    assert "checkpoint every 20 from step 0" in text
    assert "1 failure(s)" in text and "12 step(s) recomputed" in text
    assert SUPERVISOR_RETRIED in text and "detected by its supervisor" in text
    assert f"{result['stalled_seconds']:.1f} s stalled" in text


# -- the workflow's own view: a warm segment's failures are events --------------------------------
def warm_segment(failure: Any, failed_at: float, timed_out: bool) -> RunRecord:
    """A first segment to step 60, then the second on the warm worker's own queue, failed at
    ``failed_at`` back to the workflow, which offers it to every worker (one retry from step 80)."""
    h = History({"run_id": "run", "store": "/s"})
    first = h.schedule(1.0, "train_segment", {"checkpoint_every": 10}, heartbeat_timeout=10)
    h.start(1.0, first)
    h.complete(61.0, first, segment_result(60, 0, 1, 0, train=59.0))
    warm = h.schedule(61.1, "train_segment", {"checkpoint_every": 10}, heartbeat_timeout=10)
    h.start(61.1, warm)
    (h.time_out if timed_out else h.fail)(failed_at, warm, failure)
    again = h.schedule(failed_at + 0.1, "train_segment", {"checkpoint_every": 10, "prior_attempts": 1})
    h.start(failed_at + 0.2, again)
    h.complete(failed_at + 42.2, again, segment_result(120, 80, 2, 5, train=40.0))
    return run_of(read_history(h.events), [], 120)


def test_a_frozen_warm_segment_is_detected_by_its_heartbeat_timeout_at_the_event() -> None:
    rec = warm_segment(heartbeat_timeout({"step": 85, "attempt": 1}), failed_at=96.0, timed_out=True)
    seen = shown(rec)
    failure, detected, stall = seen["failure"], seen["detected"], seen["stall"]
    assert failure.x == pytest.approx(96.0 - 10 - 1.0) and failure.y == 85  # the last heartbeat: 10 s before
    assert detected.x == pytest.approx(96.0 - 1.0) and "heartbeat timeout" in detected.label
    assert stall.x1 == pytest.approx(96.0 + 2.2 - 1.0)  # training again: 2 s into the retry
    assert seen["summary"]["recomputed_steps"] == 5 and seen["summary"]["stalled_seconds"] == pytest.approx(12.2)
    assert "estimated" not in failure.label


def test_a_hand_back_is_no_failure_and_is_detected_by_the_sigterm() -> None:
    handed = application_failure(
        "worker shutting down at step 80 (checkpoint c80 committed)", "WorkerShutdown", {"attempt": 1, "step": 80}
    )
    rec = warm_segment(handed, failed_at=81.5, timed_out=False)
    seen = shown(rec)
    assert seen["failure"].x == pytest.approx(80.5) and seen["failure"].y == 80
    assert "SIGTERM" in seen["detected"].label and seen["detected"].x == pytest.approx(80.5)
    s = seen["summary"]
    assert (s["failures"], s["hand_backs"]) == (0, 1)


# -- other figures ---------------------------------------------------------------------------------
def test_metrics_of_different_scales_get_axes_of_their_own() -> None:
    rec = supervised_crash()
    rec.val_step = [25.0, 50.0, 75.0, 100.0]
    rec.metrics = {"val_accuracy": [0.3, 0.5, 0.6, 0.62], "val_perplexity": [19.0, 17.0, 16.0, 15.2]}
    panels = loss_figure(rec).panels
    metric_panels = [p for p in panels if any(s.label.startswith("val_") for s in p.series)]
    assert [[s.label for s in p.series] for p in metric_panels] == [["val_accuracy"], ["val_perplexity"]]
    accuracy, perplexity = metric_panels
    assert "fraction" in accuracy.ylabel and "perplexity" in perplexity.ylabel


def test_times_are_seconds_since_the_first_attempt_started() -> None:
    t0 = origin(supervised_crash())
    assert isinstance(t0, datetime) and t0 == at(ORIGIN)
