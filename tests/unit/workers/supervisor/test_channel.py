"""The report channel: reports written by the worker process arrive whole at the supervisor,
whatever the pipe does; a report that cannot be written never blocks or raises."""

from __future__ import annotations

import base64
import contextlib
import os
from collections.abc import Iterator

import pytest

from workers.supervisor import ActivityReport, ReportWriter
from workers.supervisor.channel import ReportReader, RunningAttempts


def report(event: str, token: bytes, attempt: int = 1) -> ActivityReport:
    return ActivityReport.model_validate(
        {
            "event": event,
            "token": base64.b64encode(token).decode(),
            "activity_type": "train_segment",
            "workflow_id": "run-1",
            "attempt": attempt,
        }
    )


@pytest.fixture
def pipe() -> Iterator[tuple[ReportReader, ReportWriter]]:
    read_fd, write_fd = os.pipe()
    reader, writer = ReportReader(read_fd), ReportWriter(write_fd)
    yield reader, writer
    reader.close()
    with contextlib.suppress(OSError):  # a test closed it
        os.close(write_fd)


def test_reports_round_trip(pipe: tuple[ReportReader, ReportWriter]) -> None:
    reader, writer = pipe
    sent = [report("started", b"\x00token-a\xff"), report("started", b"b", 3), report("ended", b"\x00token-a\xff")]
    for r in sent:
        writer.send(r)
    got = reader.read_available()
    assert got == sent and got[0].task_token == b"\x00token-a\xff"
    assert got[1].describe() == "train_segment of run-1 (attempt 3)"
    assert reader.read_available() == [] and not reader.at_end


def test_a_line_split_across_reads_and_a_foreign_line(pipe: tuple[ReportReader, ReportWriter]) -> None:
    reader, writer = pipe
    line = report("started", b"a").model_dump_json().encode() + b"\n"
    os.write(writer.fd, b"not a report\n" + line[:10])
    assert reader.read_available() == []  # the foreign line skipped, the torn one kept
    os.write(writer.fd, line[10:])
    assert reader.read_available() == [report("started", b"a")]


def test_the_end_of_the_pipe_is_seen(pipe: tuple[ReportReader, ReportWriter]) -> None:
    reader, writer = pipe
    writer.send(report("started", b"a"))
    os.close(writer.fd)
    assert reader.read_available() == [report("started", b"a")] and reader.at_end


def test_writes_never_block_nor_raise(pipe: tuple[ReportReader, ReportWriter]) -> None:
    reader, writer = pipe
    for i in range(2000):  # far more than a pipe buffer holds, nobody reading
        writer.send(report("started", f"token-{i}".encode()))
    reader.close()
    writer.send(report("ended", b"x"))  # the supervisor is gone: EPIPE, swallowed


def test_running_attempts_are_the_started_minus_the_ended() -> None:
    running = RunningAttempts.empty()
    for r in (report("started", b"a"), report("started", b"b"), report("ended", b"a"), report("ended", b"zz")):
        running.apply(r)
    assert running.take() == [report("started", b"b")]
    assert running.take() == []


def test_signs_of_life_change_no_attempt_and_the_hang_limit_follows_the_heartbeat_timeouts() -> None:
    running = RunningAttempts.empty()
    assert running.hang_limit(idle=30.0, margin=1.0) == 30.0  # nothing running: the idle bound
    running.apply(ActivityReport(event="started", token="QQ==", heartbeat_timeout=10.0))
    running.apply(ActivityReport(event="started", token="Qg==", heartbeat_timeout=3.0))
    running.apply(ActivityReport(event="started", token="Qw=="))  # an activity without one
    running.apply(ActivityReport(event="alive"))
    assert len(running.attempts) == 3
    assert running.hang_limit(idle=30.0, margin=1.0) == 4.0  # the shortest heartbeat timeout + margin
    running.apply(ActivityReport(event="ended", token="Qg=="))
    assert running.hang_limit(idle=30.0, margin=1.0) == 11.0
