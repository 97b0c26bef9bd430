"""Supervision of the worker process (``cairn worker``): a small supervisor process runs the
worker as its child; the worker reports every activity attempt's task token over a pipe
(``channel``, ``interceptor``) and, a few times a second, that it is alive; when the worker dies,
or stays silent past its attempts' heartbeat timeout (hung: it is killed), the supervisor fails
the attempts it left running, so that Temporal retries them at once (``failing``), and starts it
again (``restarts``, ``process``). The README's "Operating it" describes the process model."""

from workers.supervisor.channel import ActivityReport, ReportWriter, reporter_from_environment
from workers.supervisor.failing import WORKER_CRASHED, fail_attempts
from workers.supervisor.interceptor import CRASH_AFTER_COMPLETION, ActivityReporter
from workers.supervisor.process import Supervisor, exit_status
from workers.supervisor.restarts import RestartPolicy, WorkerCrashLoopError

__all__ = [
    "CRASH_AFTER_COMPLETION",
    "WORKER_CRASHED",
    "ActivityReport",
    "ActivityReporter",
    "ReportWriter",
    "RestartPolicy",
    "Supervisor",
    "WorkerCrashLoopError",
    "exit_status",
    "fail_attempts",
    "reporter_from_environment",
]
