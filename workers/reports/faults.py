"""What each fault cost a run, for its report: when the lost segment attempt last showed life,
who detected the loss and when, the stall until training ran again, and the steps recomputed.

Temporal's history records a fault's moment only where it wrote an event for it: a failure or
timeout the workflow saw (a warm worker's own queue, a gang node). A segment Temporal retried
itself keeps only its last attempt's start and the failure before it, not when that failure
happened; its last sign of life is then placed from what is recorded — the handed-back
checkpoint's commit, else the lost attempt's pace (its last kept commit, or its start, plus the
steps to the one its last heartbeat reported at the run's measured seconds per step) — bounded by
the retry's start, and marked as an estimate. Pure: (history's facts, the store's commits) ->
``Fault``; ``workers.reports.timeline`` reads the facts, ``workers.reports.figures`` draws them.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cairn.runs import CommitPoint, SegmentAttempt, TimelineEvent

__all__ = [
    "DETECTORS",
    "TIMINGS",
    "Detector",
    "Fault",
    "Lost",
    "Pace",
    "Trained",
    "fault_of",
    "place",
]


@dataclass(frozen=True)
class Detector:
    """Who noticed a lost attempt, and what its last sign of life was."""

    name: str
    """as the report names the detector: "detected by NAME" """
    sign: str
    """the lost attempt's last sign of life"""
    outcome: str
    """``SegmentAttempt.outcome`` of the lost attempt"""
    color: str


DETECTORS = {
    "supervisor": Detector(
        "its supervisor (the worker process died)", "crash (supervisor's report)", "lost", "tab:red"
    ),
    "heartbeat": Detector("the heartbeat timeout", "last heartbeat", "lost", "tab:purple"),
    "hand-back": Detector("SIGTERM hand-back", "handed back on SIGTERM", "handed back", "tab:orange"),
    "timeout": Detector("the start-to-close timeout", "timed out", "failed", "tab:brown"),
    "error": Detector("the error it reported", "error reported", "failed", "tab:pink"),
}
"""Every way Cairn learns that a segment attempt is gone: the supervisor fails a dead worker
process's attempt (``WorkerCrashed``), the server's heartbeat timeout fires (a lost host, a frozen
process), a worker stopping on SIGTERM commits and hands its segment back (``WorkerShutdown``),
a timeout bounds the attempt, or the attempt reports an error."""

TIMINGS = {
    "recorded": "",
    "commit": "",
    "pace": "estimated from its pace: Temporal retried it and recorded no time",
    "bound": "not recorded: the latest it can have been",
}
"""How a fault's moment is known: an event of the history, the handed-back checkpoint's commit,
the lost attempt's pace (Temporal retried it and recorded no time), or only its bound."""


@dataclass(frozen=True)
class Pace:
    """How fast one finished attempt trained: seconds per step (saves excluded), seconds a save
    blocked training, and seconds from its start to its first step (start-up, restore)."""

    step_seconds: float
    save_seconds: float
    startup_seconds: float


@dataclass(frozen=True)
class Trained:
    """An attempt that reported how it went (completed, or interrupted on request): its
    attempt's facts, when it began training (its restore done; its own measure), the steps it
    recomputed, and its pace."""

    attempt: SegmentAttempt
    training_at: datetime | None
    recomputed: int | None
    pace: Pace | None


@dataclass(frozen=True)
class Lost:
    """What the history records of one lost segment attempt, before it is placed in time."""

    attempt: int
    message: str
    detector: str
    """a key of ``DETECTORS``"""
    started_at: datetime | None
    """its start: recorded, or (a first attempt Temporal retried) its segment's scheduling"""
    anchored: bool
    """whether ``started_at`` is when it began (else only a bound: an earlier attempt of the same
    activity started then)"""
    from_step: int | None
    reached: int | None
    """the step its last heartbeat (or its hand-back) reported; else what its retry measured"""
    reported_at: datetime | None
    """the event in which the server failed it; None: Temporal retried it and recorded no time"""
    latest: datetime | None
    """no later than this was it detected: its retry's start minus the retry policy's wait"""
    heartbeat_timeout: float
    every: int | None
    """steps between its checkpoints"""
    retry_at: datetime | None = None
    """the start of the attempt Temporal retried it with (that attempt recorded the failure)"""
    world_size: int | None = None


@dataclass(frozen=True)
class Fault(TimelineEvent):
    """A lost segment attempt on the run's timeline (``kind`` "failure"): ``at`` is its last sign
    of life, ``step`` the step it had reached, ``detected_at`` when ``detector`` noticed;
    ``timing`` says how those are known (``TIMINGS``). The stall runs from ``at`` to
    ``training_at``, when the next attempt trained again (its restore done) from ``resumed_from``,
    recomputing ``recomputed`` steps."""

    attempt: int = 1
    detector: str = "error"
    timing: str = "recorded"
    retry_at: datetime | None = None
    training_at: datetime | None = None
    resumed_from: int | None = None
    recomputed: int | None = None

    @property
    def stall_end(self) -> datetime:
        """Training again; else the next attempt's start, else the detection (none followed)."""
        return max(self.at, self.training_at or self.retry_at or self.detected_at or self.at)

    @property
    def stalled_seconds(self) -> float:
        return (self.stall_end - self.at).total_seconds()

    @property
    def estimated(self) -> bool:
        return self.timing in ("pace", "bound")

    @property
    def sign(self) -> str:
        """What ``at`` is: the detector's sign of life where recorded; where estimated from the
        pace, when the attempt reached the step its last heartbeat (or hand-back) reported."""
        how = DETECTORS.get(self.detector, DETECTORS["error"])
        if self.timing == "bound":
            return "last sign of life"
        if self.timing == "pace" and self.detector != "hand-back":
            return "last heartbeat"
        return how.sign

    @property
    def label(self) -> str:
        """The fault's marker, as the timeline's legend names it."""
        suffix = {"pace": " (estimated)", "bound": " (at the latest)"}.get(self.timing, "")
        return f"fault: {self.sign}{suffix}"

    def describe(self, t0: datetime) -> str:
        """One line: what happened when (seconds since ``t0``; ``~`` where estimated), what it
        cost, and the failure's own message, whole."""

        def s(t: datetime | None, estimated: bool = False) -> str:
            return "-" if t is None else ("~" if estimated else "") + f"{(t - t0).total_seconds():.1f} s"

        how = DETECTORS.get(self.detector, DETECTORS["error"])
        timing = TIMINGS.get(self.timing, "")
        step = "" if self.step is None else f" at step {self.step}"
        parts = [
            f"attempt {self.attempt}: {self.sign} {s(self.at, self.estimated)}{step}"
            + (f" ({timing})" if timing else ""),
            f"detected by {how.name} {s(self.detected_at, self.estimated)}",
        ]
        if self.retry_at is not None:
            parts.append(f"retry started {s(self.retry_at)}")
        if self.training_at is not None:
            parts.append(f"training again {s(self.training_at)}")
        cost = [f"{'~' if self.estimated else ''}{self.stalled_seconds:.1f} s stalled"]
        if self.recomputed is not None:
            cost.append(f"{self.recomputed} step(s) recomputed")
        return ", ".join(parts) + ": " + ", ".join(cost) + f" — {self.detail}"


def fault_of(event: TimelineEvent) -> Fault | None:
    """``event`` as a fault, if it is a failure (a bare failure event: its detector unknown)."""
    if isinstance(event, Fault):
        return event
    if event.kind == "failure":
        return Fault(event.kind, event.at, event.step, event.detail, event.detected_at)
    return None


def _saves_between(every: int | None, lo: int, hi: int) -> int:
    """Checkpoints a segment saving every ``every`` steps commits past step ``lo`` before ``hi``."""
    if not every or hi <= lo + 1:
        return 0
    return max(0, (hi - 1) // every - lo // every)


def _by_pace(
    lost: Lost, reached: int, commits: Sequence[CommitPoint], pace: Pace | None, upper: datetime
) -> datetime | None:
    """When ``lost`` was at step ``reached``: from its last kept commit in its time (a fact), else
    from its start, at ``pace``."""
    lower = lost.started_at
    mine = [
        (c.at, c.step)
        for c in commits
        if c.at is not None
        and (lower is None or c.at >= lower)
        and c.at <= upper
        and c.step <= reached
        and (lost.from_step is None or c.step >= lost.from_step)
    ]
    if mine:
        at, step = max(mine)
    elif lost.anchored and lost.started_at is not None and lost.from_step is not None and pace is not None:
        at, step = lost.started_at + timedelta(seconds=pace.startup_seconds), lost.from_step
    else:
        return None
    if step == reached:
        return at
    if pace is None:
        return None
    seconds = (reached - step) * pace.step_seconds + _saves_between(lost.every, step, reached) * pace.save_seconds
    return at + timedelta(seconds=seconds)


def _handed_back(lost: Lost, commits: Sequence[CommitPoint], upper: datetime) -> datetime | None:
    """The commit of the checkpoint a hand-back committed at the step it reported, if kept."""
    for c in commits:
        in_time = c.at is not None and (lost.started_at is None or c.at >= lost.started_at) and c.at <= upper
        if c.step == lost.reached and in_time:
            return c.at
    return None


def _unrecorded(
    lost: Lost, reached: int | None, commits: Sequence[CommitPoint], pace: Pace | None, upper: datetime
) -> tuple[datetime, str]:
    """The last sign of life of an attempt Temporal retried without recording when, and how it is
    known (``TIMINGS``): a hand-back's commit, else its pace, else only its bound ``upper``."""
    if reached is not None and lost.detector == "hand-back":
        committed = _handed_back(lost, commits, upper)
        if committed is not None:
            return committed, "commit"
    if reached is not None:
        paced = _by_pace(lost, reached, commits, pace, upper)
        if paced is not None:
            return paced, "pace"
    return upper, "bound"


def place(
    lost: Lost,
    retry_at: datetime | None,
    retry: Trained | None,
    trained: Sequence[Trained],
    commits: Sequence[CommitPoint],
) -> tuple[Fault, SegmentAttempt]:
    """``lost`` on the run's timeline: its fault and the lost attempt, from what the history
    recorded, the attempt that followed it (started at ``retry_at``; ``retry`` if it reported
    how it went), the run's other reporting attempts (``trained``: their pace) and the store's
    kept ``commits``."""
    resumed = retry.attempt.from_step if retry is not None else None
    recomputed = retry.recomputed if retry is not None else None
    reached = lost.reached
    if reached is None and resumed is not None and recomputed is not None:
        reached = resumed + max(0, recomputed)  # what the retry measured from the last heartbeat
    heartbeat = lost.detector == "heartbeat" and lost.heartbeat_timeout > 0
    timeout = timedelta(seconds=lost.heartbeat_timeout if heartbeat else 0.0)
    if lost.reported_at is not None:
        detected, timing = lost.reported_at, "recorded"
        sign = detected - timeout  # a heartbeat timeout fires that long after the last heartbeat
        if lost.started_at is not None:
            sign = max(sign, lost.started_at)
    else:
        latest = lost.latest or retry_at or lost.started_at
        assert latest is not None, "a lost attempt without any recorded time"
        upper = latest - timeout
        sign_at, timing = _unrecorded(lost, reached, commits, _pace(retry, trained), upper)
        sign = min(max(sign_at, lost.started_at or sign_at), upper)
        detected = min(sign + timeout, latest)
    if retry is not None and retry.training_at is not None:
        training_at: datetime | None = retry.training_at
    else:
        training_at = retry_at
    fault = Fault(
        "failure",
        sign,
        reached,
        lost.message,
        detected,
        attempt=lost.attempt,
        detector=lost.detector,
        timing=timing,
        retry_at=retry_at,
        training_at=training_at,
        resumed_from=resumed,
        recomputed=recomputed if recomputed is not None else _recomputed(reached, resumed),
    )
    how = DETECTORS.get(lost.detector, DETECTORS["error"])
    attempt = SegmentAttempt(
        lost.attempt,
        lost.started_at if lost.anchored else None,
        lost.from_step if lost.anchored else None,
        sign,
        reached,
        how.outcome,
        detected,
        lost.world_size,
    )
    return fault, attempt


def _recomputed(reached: int | None, resumed: int | None) -> int | None:
    return None if reached is None or resumed is None else max(0, reached - resumed)


def _pace(retry: Trained | None, trained: Sequence[Trained]) -> Pace | None:
    """The retry's own pace (the same segment, on the same kind of worker), else the run's
    median over the attempts that reported one."""
    if retry is not None and retry.pace is not None:
        return retry.pace
    paces = [t.pace for t in trained if t.pace is not None]
    if not paces:
        return None
    return Pace(
        statistics.median(p.step_seconds for p in paces),
        statistics.median(p.save_seconds for p in paces),
        statistics.median(p.startup_seconds for p in paces),
    )
