"""Worker logging: one line per event, as text or JSON (``--log-format`` / ``CAIRN_LOG_FORMAT``).

Every line carries ``run_id``, ``workflow_id``, ``step``, ``attempt`` and ``activity`` (empty
outside an activity: ``activities.log_context``), so logs can be read by run id. A segment logs
its start, the step it resumed from, every commit and its end with the loss. Expected events (a
hand-back on SIGTERM, a segment interrupted on request) log one line, not a traceback.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import Literal

from activities.log_context import FIELDS, ContextFilter

__all__ = ["LOG_FORMATS", "JsonFormatter", "configure_logging", "log_format_from_env"]

LOG_FORMATS = ("text", "json")
LogFormat = Literal["text", "json"]
_TEXT = (
    "%(asctime)s %(levelname)s %(name)s [run=%(run_id)s wf=%(workflow_id)s step=%(step)s attempt=%(attempt)s]: "
    "%(message)s"
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the context fields, and the
    exception (type and message; the traceback only at DEBUG level)."""

    def format(self, record: logging.LogRecord) -> str:
        body: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        body.update({k: getattr(record, k, None) for k in FIELDS})
        if record.exc_info and record.exc_info[1] is not None:
            body["error"] = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
            if record.levelno <= logging.DEBUG:
                body["traceback"] = self.formatException(record.exc_info)
        return json.dumps(body, default=str)


class _QuietExpectedFailures(logging.Filter):
    """The SDK logs every failed activity with a traceback; a hand-back on SIGTERM and a
    segment interrupted on request are expected, and the activity logs them in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return getattr(exc, "type", None) not in ("WorkerShutdown", "SegmentInterrupted")


def log_format_from_env() -> LogFormat:
    value = os.environ.get("CAIRN_LOG_FORMAT", "text").strip().lower()
    return "json" if value == "json" else "text"


def configure_logging(fmt: LogFormat = "text", level: int = logging.INFO) -> None:
    """Worker logs say what training does (segments, resume points, commits, loss), once."""
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(_TEXT))
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # boto3 announces credential discovery at INFO for every client it builds: not news.
    for noisy in ("botocore", "boto3", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.getLogger("temporalio.activity").addFilter(_QuietExpectedFailures())
