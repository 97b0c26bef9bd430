"""What every worker log line carries: run id, workflow id, step and attempt.

Activities set the run id (and, while training, the step) in a context variable; the filter
adds those and the activity's own workflow id, attempt and type to every record logged from
an activity's thread. ``workers.logs`` formats them as text or JSON.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from temporalio import activity

__all__ = ["FIELDS", "ContextFilter", "attempt_number", "run_context", "set_step"]

FIELDS = ("run_id", "workflow_id", "step", "attempt", "activity")
_CONTEXT: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("cairn_log_context", default=None)


@contextmanager
def run_context(run_id: str, attempt: int | None = None) -> Iterator[None]:
    """Tag this activity's log lines with ``run_id`` (and the step, once ``set_step`` is called).
    ``attempt``: the segment's attempt as the run counts it, where it differs from Temporal's
    (a segment re-offered after its attempt was lost on a worker's own queue starts again at
    Temporal attempt 1; ``TrainSegmentInput.prior_attempts`` counts the lost ones)."""
    context: dict[str, Any] = {"run_id": run_id, "step": None}
    if attempt is not None:
        context["attempt"] = attempt
    token = _CONTEXT.set(context)
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def set_step(step: int) -> None:
    context = _CONTEXT.get()
    if context is not None:
        context["step"] = step


def attempt_number() -> int:
    """This activity's attempt as the run counts it (``run_context``'s, else Temporal's)."""
    context = _CONTEXT.get() or {}
    return context.get("attempt") or activity.info().attempt


class ContextFilter(logging.Filter):
    """Adds ``FIELDS`` to every record (None where unknown), so formats can always name them."""

    def filter(self, record: logging.LogRecord) -> bool:
        values: dict[str, Any] = dict.fromkeys(FIELDS)
        if activity.in_activity():
            info = activity.info()
            values.update(workflow_id=info.workflow_id, attempt=info.attempt, activity=info.activity_type)
        values.update(_CONTEXT.get() or {})
        for key, value in values.items():
            if not hasattr(record, key) or getattr(record, key) is None:
                setattr(record, key, value)
        return True
