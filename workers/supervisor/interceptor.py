"""The worker-process side of supervision: an activity interceptor that reports each attempt's
task token to the supervisor when it starts, and again once its outcome reached the server.

"Ended" is reported when the SDK's task for the attempt is done: the SDK has returned from
the activity, encoded the outcome and sent it, and the server has answered that call. Until
then the supervisor counts the attempt as running, so a crash anywhere before that point is
failed at once (a fail of an attempt whose completion the server already holds is refused).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from temporalio import activity
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from cairn import faults
from workers.supervisor.channel import ActivityReport, ReportWriter

__all__ = ["ActivityReporter", "CRASH_AFTER_COMPLETION"]

CRASH_AFTER_COMPLETION = "after-activity-complete"
"""Crash point (``CAIRN_FAULT=after-activity-complete:ACTIVITY_TYPE``): the server holds the
attempt's completion, the supervisor has not been told it ended."""


class ActivityReporter(Interceptor):
    """Reports every activity attempt of this worker to its supervisor over ``writer``."""

    def __init__(self, writer: ReportWriter) -> None:
        self.writer = writer

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ReportingInbound(next, self.writer)


class _ReportingInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, writer: ReportWriter) -> None:
        super().__init__(next)
        self.writer = writer

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.is_local:  # part of its workflow task, not failable by token: the task's timeout covers it
            return await super().execute_activity(input)
        started = ActivityReport(
            event="started",
            token=base64.b64encode(info.task_token).decode(),
            activity_type=info.activity_type,
            workflow_id=info.workflow_id or "",
            attempt=info.attempt,
            workflow_run_id=info.workflow_run_id or "",
            task_queue=info.task_queue,
            heartbeat_timeout=info.heartbeat_timeout.total_seconds() if info.heartbeat_timeout else 0.0,
        )
        self.writer.send(started)
        try:
            return await super().execute_activity(input)
        finally:
            ended = started.model_copy(update={"event": "ended"})
            task = asyncio.current_task()  # the SDK's task of this attempt: it sends the outcome
            if task is None:
                self.writer.send(ended)
            else:
                task.add_done_callback(lambda _task: self._outcome_sent(ended))

    def _outcome_sent(self, ended: ActivityReport) -> None:
        faults.maybe_crash(CRASH_AFTER_COMPLETION, tag=ended.activity_type)
        self.writer.send(ended)
