"""What a drill sees while it runs: the workers' JSON logs and the server's view of the run.

``WorkerLogs`` reads the drill's worker logs incrementally (one JSON object per line, written by
``cairn worker --log-format json``) and keeps the events the report needs: commits (step, time,
save seconds), segment attempts and the step each resumed from. ``RunView`` is one ``describe``
of the workflow reduced to what the drill acts on: the running activities, their attempts,
the worker running each, their heartbeat step and when the server last failed an attempt.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

__all__ = ["Commit", "Start", "Resume", "WorkerLogs", "Pending", "RunView", "run_view"]

_COMMIT = re.compile(
    r"committed step (?P<step>\d+)(?P<same> \(identical, already committed\))? "
    r"\((?P<fp>[^,]+), (?P<bytes>\d+) bytes, (?P<secs>[0-9.]+) s\)"
)
_RESUME = re.compile(
    r"resumed from step (?P<step>\d+) \(.*?\)(?:; an earlier attempt had reached step (?P<reached>\d+))?$"
)


@dataclass(frozen=True)
class Commit:
    at: float
    step: int
    seconds: float
    created: bool
    worker: str


_END = re.compile(r"segment ended at step (?P<step>\d+)")
_START = re.compile(r"segment to step (?P<target>\d+), attempt (?P<attempt>\d+)")


@dataclass(frozen=True)
class Start:
    """A segment attempt began on a worker (before it restores)."""

    at: float
    attempt: int
    worker: str


@dataclass(frozen=True)
class Resume:
    """A segment attempt restored its state and starts computing."""

    at: float
    step: int
    attempt: int
    reached: int | None
    worker: str


@dataclass
class WorkerLogs:
    paths: list[Path] = field(default_factory=list)
    commits: list[Commit] = field(default_factory=list)
    resumes: list[Resume] = field(default_factory=list)
    starts: list[Start] = field(default_factory=list)
    ends: list[Commit] = field(default_factory=list)
    """Segments that ended (step, time, worker): the worker was idle after each."""
    polling: set[str] = field(default_factory=set)
    """Workers that said they are polling their task queue."""
    _offsets: dict[Path, int] = field(default_factory=dict)

    def add(self, path: Path) -> None:
        self.paths.append(path)

    def poll(self) -> None:
        for path in self.paths:
            try:
                with open(path, "rb") as fh:
                    fh.seek(self._offsets.get(path, 0))
                    chunk = fh.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1  # a line still being written waits for the next poll
            self._offsets[path] = self._offsets.get(path, 0) + end
            for line in chunk[:end].splitlines():
                self._line(line, path.stem)

    def _line(self, raw: bytes, worker: str) -> None:
        try:
            record = json.loads(raw)
            at = datetime.fromisoformat(record["ts"]).timestamp()
            message = str(record["message"])
        except (ValueError, KeyError, TypeError):
            return
        if message.startswith("polling "):
            self.polling.add(worker)
        elif m := _COMMIT.search(message):
            self.commits.append(Commit(at, int(m["step"]), float(m["secs"]), not m["same"], worker))
        elif m := _END.search(message):
            self.ends.append(Commit(at, int(m["step"]), 0.0, False, worker))
        elif m := _START.search(message):
            self.starts.append(Start(at, int(m["attempt"]), worker))
        elif m := _RESUME.search(message):
            attempt = record.get("attempt")
            self.resumes.append(
                Resume(
                    at,
                    int(m["step"]),
                    attempt if isinstance(attempt, int) else 1,
                    int(m["reached"]) if m["reached"] else None,
                    worker,
                )
            )

    def retry_started_after(self, t: float) -> Start | None:
        later = [s for s in self.starts if s.at >= t and s.attempt > 1]
        return min(later, key=lambda s: s.at) if later else None

    def resume_after(self, t: float) -> Resume | None:
        later = [r for r in self.resumes if r.at >= t]
        return min(later, key=lambda r: r.at) if later else None


@dataclass(frozen=True)
class Pending:
    activity_type: str
    activity_id: str
    attempt: int
    running: bool
    worker_pid: int | None
    step: int | None
    last_failed_at: float | None
    """When the server failed the previous attempt (a heartbeat timeout, a reported failure)."""
    started_at: float | None
    """When the server dispatched this attempt to a worker (None while scheduled)."""
    failure: str


@dataclass(frozen=True)
class RunView:
    at: float
    status: str
    pending: tuple[Pending, ...]

    @property
    def segment(self) -> Pending | None:
        return next((p for p in self.pending if p.activity_type == "train_segment"), None)

    @property
    def step(self) -> int | None:
        seg = self.segment
        return seg.step if seg is not None else None


def _seconds(ts: Any) -> float:
    return float(ts.seconds + ts.nanos / 1e9)


def _pid(identity: str) -> int | None:
    head = identity.split("@", 1)[0]
    return int(head) if head.isdigit() else None


def _heartbeat_step(payloads: Any) -> int | None:
    for payload in payloads:
        try:
            value = json.loads(payload.data)
        except ValueError:
            continue
        if isinstance(value, dict) and isinstance(value.get("step"), int):
            return int(value["step"])
    return None


def run_view(desc: Any, at: float) -> RunView:
    """The drill's reduction of ``WorkflowHandle.describe()``."""
    pending = []
    for p in desc.raw_description.pending_activities:
        failed = None
        if p.HasField("last_attempt_complete_time"):
            done = p.last_attempt_complete_time
            failed = done.seconds + done.nanos / 1e9
        elif p.attempt > 1 and p.HasField("next_attempt_schedule_time") and p.HasField("current_retry_interval"):
            # A server that does not fill in the completion time: the retry is scheduled one
            # retry interval after the failure.
            nxt, gap = p.next_attempt_schedule_time, p.current_retry_interval
            failed = (nxt.seconds + nxt.nanos / 1e9) - (gap.seconds + gap.nanos / 1e9)
        pending.append(
            Pending(
                activity_type=p.activity_type.name,
                activity_id=p.activity_id,
                attempt=p.attempt,
                running=p.state == 2,  # PENDING_ACTIVITY_STATE_STARTED
                worker_pid=_pid(p.last_worker_identity),
                step=_heartbeat_step(p.heartbeat_details.payloads),
                last_failed_at=failed,
                started_at=_seconds(p.last_started_time) if p.state == 2 and p.HasField("last_started_time") else None,
                failure=p.last_failure.message if p.HasField("last_failure") else "",
            )
        )
    status = desc.status.name if desc.status is not None else "UNKNOWN"
    return RunView(at=at, status=status, pending=tuple(pending))
