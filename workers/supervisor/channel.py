"""The report channel from a worker process to its supervisor: a pipe the child inherits.

The worker process writes one JSON line per event (``ActivityReport``: an activity attempt
started, or its outcome reached the server, or — a few times a second, from its event loop —
that it is alive); the supervisor reads them into the table of attempts that are running
(``RunningAttempts``) and the time of its last sign of life. ``CAIRN_SUPERVISOR`` (``PID:FD``) tells the
child its supervisor's pid and the pipe's write end; a process without it has no supervisor.
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import logging
import os
import signal
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from activities.inputs import WORKER_ID, WORKER_ID_ENV

__all__ = [
    "SUPERVISOR_ENV",
    "ActivityReport",
    "ReportReader",
    "ReportWriter",
    "RunningAttempts",
    "child_environment",
    "reporter_from_environment",
]

SUPERVISOR_ENV = "CAIRN_SUPERVISOR"
log = logging.getLogger("cairn.supervisor")
_PR_SET_PDEATHSIG = 1


class ActivityReport(BaseModel):
    """One event of one activity attempt, as the worker process saw it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    event: Literal["started", "ended", "alive"]
    token: str = ""
    """The attempt's task token, base64: what the supervisor fails it by."""
    activity_type: str = ""
    workflow_id: str = ""
    attempt: int = 0
    workflow_run_id: str = ""
    task_queue: str = ""
    """The queue the attempt was taken from: a worker's own queue (a warm segment) or a shared one."""
    heartbeat_timeout: float = 0.0
    """The attempt's heartbeat timeout in seconds (0: none): how long the worker process may show
    no sign of life before the server has given up on the attempt anyway."""

    @property
    def task_token(self) -> bytes:
        return base64.b64decode(self.token)

    def describe(self) -> str:
        return f"{self.activity_type} of {self.workflow_id or '?'} (attempt {self.attempt})"


def child_environment(write_fd: int) -> dict[str, str]:
    """The variables of a worker process this supervisor starts: it reports to this process over
    ``write_fd``, and keeps this supervisor's worker id (every restarted worker polls the same
    own queue, so a segment offered to the crashed one is picked up by its replacement)."""
    return {SUPERVISOR_ENV: f"{os.getpid()}:{write_fd}", WORKER_ID_ENV: WORKER_ID}


class ReportWriter:
    """The worker process's end. Writes never block the event loop and never raise: a report
    that cannot be written (the supervisor is gone, the pipe full) only costs its fast path
    (the heartbeat timeout still notices a lost attempt)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        os.set_blocking(fd, False)
        os.set_inheritable(fd, False)  # the worker's own subprocesses (gang ranks) do not report

    def send(self, report: ActivityReport) -> None:
        line = report.model_dump_json().encode() + b"\n"
        try:
            os.write(self.fd, line)  # one write per line (the event loop is the only writer)
        except OSError as exc:
            log.debug("report to the supervisor not sent: %s", exc)


def reporter_from_environment() -> ReportWriter | None:
    """This process's channel to its supervisor, if it has one (the variable is removed, so
    that processes this one starts do not inherit it); the process also gets SIGTERM if the
    supervisor dies: it then stops as on any SIGTERM (checkpoint, hand back)."""
    value = os.environ.pop(SUPERVISOR_ENV, "")
    pid_text, _, fd_text = value.partition(":")
    if not (pid_text.isdigit() and fd_text.isdigit()):
        return None
    _die_with(int(pid_text))
    return ReportWriter(int(fd_text))


def _die_with(supervisor_pid: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != supervisor_pid:  # it died before the line above took effect
        os.kill(os.getpid(), signal.SIGTERM)


class ReportReader:
    """The supervisor's end: whole lines in, reports out (a torn or foreign line is skipped)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = b""
        self.at_end = False
        """Every writer has closed the pipe (the worker process is gone)."""
        os.set_blocking(fd, False)

    def read_available(self) -> list[ActivityReport]:
        """Every report the pipe holds now, without waiting."""
        while True:
            try:
                chunk = os.read(self.fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                self.at_end = True
                break
            self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        reports = []
        for line in lines:
            try:
                reports.append(ActivityReport.model_validate_json(line))
            except ValidationError:
                log.debug("unreadable report from the worker process skipped: %r", line[:200])
        return reports

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self.fd)


@dataclass
class RunningAttempts:
    """The attempts a worker process has started and whose outcome has not reached the server."""

    attempts: dict[str, ActivityReport]

    @classmethod
    def empty(cls) -> RunningAttempts:
        return cls({})

    def apply(self, report: ActivityReport) -> None:
        if report.event == "started":
            self.attempts[report.token] = report
        elif report.event == "ended":
            self.attempts.pop(report.token, None)

    def hang_limit(self, idle: float, margin: float) -> float:
        """How long the worker process may show no sign of life: the shortest heartbeat timeout
        of the attempts it runs, plus ``margin``, or ``idle`` when none has one."""
        timeouts = [a.heartbeat_timeout for a in self.attempts.values() if a.heartbeat_timeout > 0]
        return min(timeouts) + margin if timeouts else idle

    def take(self) -> list[ActivityReport]:
        """The attempts left running (oldest first), and an empty table."""
        left = list(self.attempts.values())
        self.attempts.clear()
        return left
