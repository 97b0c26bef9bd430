"""What a running drill shows: its phase, the step its run reached and the faults fired so far, on
stderr only — a line per event where stderr is a file or a pipe, one refreshing line on a terminal."""

from __future__ import annotations

import io

import pytest

from workers.drills.faults import FaultRecord
from workers.drills.progress import DrillProgress, fault_line


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_to_a_pipe_every_event_is_one_line_and_steps_are_paced() -> None:
    stream, clock = io.StringIO(), Clock()
    progress = DrillProgress(stream, every_s=10.0, clock=clock)
    progress.phase("starting stack", "embedded Temporal, SeaweedFS, reservation service")
    progress.phase("faulted run", "400 steps, 2 fault(s)")
    progress.begin_run(total_steps=400, faults=2)
    progress.step(12, fired=0, workers=2)
    progress.step(15, fired=0, workers=2)  # within 10 s of the last step line: nothing
    clock.now += 10.5
    progress.step(15, fired=0, workers=2)
    clock.now += 10.5
    progress.step(15, fired=0, workers=2)  # no progress since the last line: nothing
    progress.fault("fault 1/2 worker-kill: fired at step 37, resumed from step 35 after 1.20 s")
    progress.step(40, fired=1, workers=2)  # a fault line was an event: the next step line is not held back
    progress.phase("baseline", "an uninterrupted in-process run to step 400")
    progress.phase("verifying", "every committed checkpoint")
    progress.close()
    assert stream.getvalue().splitlines() == [
        "drill [starting stack] embedded Temporal, SeaweedFS, reservation service",
        "drill [faulted run] 400 steps, 2 fault(s)",
        "drill [faulted run] step 12/400, faults fired 0/2, 2 worker(s)",
        "drill [faulted run] step 15/400, faults fired 0/2, 2 worker(s)",
        "drill [faulted run] fault 1/2 worker-kill: fired at step 37, resumed from step 35 after 1.20 s",
        "drill [faulted run] step 40/400, faults fired 1/2, 2 worker(s)",
        "drill [baseline] an uninterrupted in-process run to step 400",
        "drill [verifying] every committed checkpoint",
    ]


def test_on_a_terminal_the_step_line_refreshes_in_place_and_events_print_above_it() -> None:
    stream = Terminal()
    progress = DrillProgress(stream, clock=Clock())
    progress.phase("faulted run", "400 steps, 1 fault(s)")
    progress.begin_run(total_steps=400, faults=1)
    progress.step(12, fired=0, workers=2)
    progress.step(13, fired=0, workers=2)  # no pacing on a terminal: the line is redrawn
    progress.fault("fault 1/1 sigterm: fired at step 20")
    progress.close()
    text = stream.getvalue()
    assert "\rdrill [faulted run] step 12/400, faults fired 0/1, 2 worker(s)\x1b[K" in text
    assert "\rdrill [faulted run] step 13/400, faults fired 0/1, 2 worker(s)\x1b[K" in text
    # the event clears the refreshing line, prints on its own line, and the step line comes back under it
    assert "\r\x1b[Kdrill [faulted run] fault 1/1 sigterm: fired at step 20\n" in text
    assert text.endswith("\r\x1b[K")  # closed: nothing left half-drawn
    assert text.count("\n") == 2  # the phase and the fault; the step line never scrolls


def test_progress_goes_to_stderr_never_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    progress = DrillProgress()
    progress.phase("starting stack", "x")
    progress.begin_run(total_steps=10, faults=1)
    progress.step(3, fired=0, workers=1)
    progress.close()
    out, err = capsys.readouterr()
    assert out == "" and "drill [starting stack] x" in err and "step 3/10" in err


def test_disabled_progress_writes_nothing() -> None:
    stream = io.StringIO()
    progress = DrillProgress(stream, enabled=False)
    progress.phase("faulted run", "x")
    progress.begin_run(total_steps=10, faults=1)
    progress.step(3, fired=0, workers=1)
    progress.fault("fault")
    progress.close()
    assert stream.getvalue() == ""


def test_a_fault_line_says_when_it_fired_where_training_resumed_and_what_it_redid() -> None:
    rec = FaultRecord(2, "worker-kill", step_at_fault=37, fired_at=10.0, resumed_at=11.25, resumed_from=35, reached=38)
    assert fault_line(rec, 5) == (
        "fault 2/5 worker-kill: fired at about step 37; training resumed from step 35 after 1.25 s, "
        "3 step(s) recomputed"
    )
    brownout = FaultRecord(3, "storage-brownout", param="1.50", fired_at=10.0)
    assert fault_line(brownout, 5) == "fault 3/5 storage-brownout(1.50): fired; training did not resume"
    unfired = FaultRecord(4, "sigterm", note="run ended first")
    assert fault_line(unfired, 5) == "fault 4/5 sigterm: did not fire (run ended first)"
