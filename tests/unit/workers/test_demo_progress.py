"""``make demo``'s progress bar never goes backwards: it shows the highest step the run reached,
and after a kill it says which step the retry resumed from and that it is recomputing up to the
step the killed attempt had reached — whether or not a sample caught the step lower."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from temporalio.api.enums.v1 import PendingActivityState

from workers.demo_progress import StepProgress, running_segment

SEG = "segment-1"
STARTED, SCHEDULED = (
    PendingActivityState.PENDING_ACTIVITY_STATE_STARTED,
    PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED,
)


def test_the_bar_never_goes_back_and_a_resume_is_said_as_it_happened() -> None:
    progress = StepProgress()
    shown, notes = [], []
    # attempt 1 reached 52 and was killed; attempt 2 had no heartbeat of its own at first (None),
    # then reported 42 (it resumed from the checkpoint at 40), recomputed to 52 and trained on
    samples = [(0, 1), (10, 1), (30, 1), (52, 1), (None, 2), (42, 2), (47, 2), (52, 2), (60, 2)]
    for step, attempt in samples:
        notes += progress.see(step, (SEG, attempt), durable=40)
        shown.append(progress.highest)
        if step == 47:
            assert progress.postfix() == {"recomputing": "47/52"}
    assert shown == [0, 10, 30, 52, 52, 52, 52, 52, 60]
    assert notes == [
        "the retry resumed from step 40 (the last committed checkpoint) and is recomputing steps 41-52, "
        "which the killed attempt had reached",
        "recomputed steps 41-52; now at step 52, training on",
    ]
    assert progress.postfix() == {}


def test_a_retry_whose_recomputation_no_sample_caught_is_still_said() -> None:
    progress = StepProgress()
    notes = [n for step, attempt in [(30, 1), (47, 1), (55, 2)] for n in progress.see(step, (SEG, attempt), 40)]
    assert notes == [
        "the retry resumed from step 40 (the last committed checkpoint) and is recomputing steps 41-47, "
        "which the killed attempt had reached",
        "recomputed steps 41-47; now at step 55, training on",
    ]
    assert progress.highest == 55


def test_a_next_segment_is_no_retry_and_a_lower_sample_alone_is_one() -> None:
    progress = StepProgress()
    assert progress.see(60, (SEG, 1)) == [] and progress.see(61, ("segment-2", 1)) == []
    notes = progress.see(55, ("segment-2", 1), durable=None)  # no attempt seen to change: the step says it
    assert notes[0].startswith("the retry resumed from step 55 ") and progress.highest == 61


def pending(attempt: int, started: float, heartbeat: float | None, step: int, state: int = STARTED) -> Any:
    class Stamp:
        def __init__(self, t: float) -> None:
            self.t = t

        def ToDatetime(self) -> float:  # noqa: N802 - protobuf's name
            return self.t

    fields = {"last_started_time": Stamp(started)} | ({"last_heartbeat_time": Stamp(heartbeat)} if heartbeat else {})
    return SimpleNamespace(
        activity_type=SimpleNamespace(name="train_segment"),
        activity_id=SEG,
        attempt=attempt,
        state=state,
        heartbeat_details=SimpleNamespace(payloads=[SimpleNamespace(data=f'{{"step": {step}}}'.encode())]),
        HasField=lambda name: name in fields,
        **fields,
    )


def test_a_heartbeat_of_an_earlier_attempt_is_not_the_retrys_step() -> None:
    def desc(*activities: Any) -> Any:
        return SimpleNamespace(raw_description=SimpleNamespace(pending_activities=list(activities)))

    assert running_segment(desc(pending(1, started=1.0, heartbeat=2.0, step=47))) == ((SEG, 1), 47)
    assert running_segment(desc(pending(2, started=3.0, heartbeat=2.0, step=47))) == ((SEG, 2), None)
    # a retry waiting to start: the server still shows the killed attempt's start time and heartbeat
    assert running_segment(desc(pending(2, started=1.0, heartbeat=2.0, step=47, state=SCHEDULED))) == ((SEG, 2), None)
    assert running_segment(desc(pending(2, started=3.0, heartbeat=3.5, step=42))) == ((SEG, 2), 42)
    assert running_segment(desc()) is None


def test_into_a_pipe_the_demo_prints_lines_not_a_redrawn_bar() -> None:
    """``make demo | tee demo.log``: a line when what is shown changes, else at most one every
    ``every`` seconds while the step moves; notes as lines; no ``\\r`` frame anywhere."""
    import io

    from workers.demo_progress import ProgressDisplay

    out = io.StringIO()
    shown = ProgressDisplay("demo-run", 120, stream=out, notes=out, every=5.0)
    assert shown.bar is None
    shown.show(0, {"phase": "training"}, now=0.0)
    shown.show(10, {"phase": "training"}, now=1.0)  # moved, but within 5 s of the last line
    shown.show(20, {"phase": "training"}, now=6.0)
    shown.show(20, {"phase": "training"}, now=20.0)  # nothing moved
    shown.show(25, {"phase": "training", "recomputing": "45/52"}, now=21.0)  # what is shown changed
    shown.note("the retry resumed from step 40")
    shown.close()
    assert "\r" not in out.getvalue()
    assert out.getvalue().splitlines() == [
        "demo-run: step 0/120 phase=training",
        "demo-run: step 20/120 phase=training",
        "demo-run: step 25/120 phase=training recomputing=45/52",
        "the retry resumed from step 40",
    ]


def test_on_a_terminal_the_demo_draws_its_bar() -> None:
    import io

    from workers.demo_progress import ProgressDisplay

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    shown = ProgressDisplay("demo-run", 120, stream=out)
    assert shown.bar is not None
    shown.show(30, {"phase": "training"})
    shown.close()
    assert "\r" in out.getvalue() and "30/120" in out.getvalue()
