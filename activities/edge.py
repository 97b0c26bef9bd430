"""The activity edge: what every Cairn activity (training, gang, effects) does at its border
with Temporal.

It owns the heartbeats (``Heartbeater`` beats from a background thread, so a killed worker is
noticed within the heartbeat timeout whatever phase it died in, and knows when its attempt has
been superseded; ``heartbeat_interval``; ``previous_reach``), the mapping of ``CairnError`` to a
typed ``ApplicationError`` (``activity_errors``), how a segment stopped on request reports it
(``interruption``, ``INTERRUPTED``), and opening the run's store with its checks
(``open_run_store``, ``require_numerics``).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from activities import metrics as m
from activities.inputs import TrainSegmentResult
from activities.log_context import attempt_number
from cairn.errors import CairnError, CheckpointConflictError, NumericsProfileError, one_line
from cairn.numerics import process_numerics
from cairn.runs import require_store_identity
from cairn.stores import Store, open_store

__all__ = [
    "as_application_error",
    "activity_errors",
    "open_run_store",
    "Heartbeater",
    "previous_reach",
    "heartbeat_reach",
    "recomputed_steps",
    "interruption",
    "heartbeat_interval",
    "require_numerics",
    "INTERRUPTED",
    "WORKER_CRASHED",
]

log = logging.getLogger("cairn.activity")

INTERRUPTED = "SegmentInterrupted"
"""Error type of a segment that stopped early on request (pause, stop, checkpoint-now,
cancel) after committing a checkpoint; its details carry the attempt and recomputed steps."""
WORKER_CRASHED = "WorkerCrashed"
"""Error type of an attempt its supervisor failed because the worker process running it died
(``workers.supervisor.failing``); on a worker's own queue non-retryable, with its last heartbeat."""


def as_application_error(exc: CairnError, *details: Any) -> ApplicationError:
    """The concise typed failure Temporal shows (one line; the policy declared on the class),
    with ``details`` for the workflow to read. The one conversion: the workflows raise their own
    refusals through it too (pure, so deterministic).

    Raised ``from None`` by ``activity_errors``: the cause chain (e.g. botocore's) stays in the
    worker log, not in the failure, whose headline must stay readable in ``describe`` and the UI.
    """
    return ApplicationError(one_line(str(exc)), *details, type=exc.type_name, non_retryable=not exc.retryable)


@contextmanager
def activity_errors() -> Iterator[None]:
    try:
        yield
    except CairnError as exc:
        info = activity.info()
        m.ACTIVITY_FAILURES.labels(info.activity_type, exc.type_name).inc()
        if isinstance(exc, CheckpointConflictError):
            m.CONFLICTS.inc()
        log.warning(
            "%s attempt %d failed: %s: %s",
            info.activity_type,
            attempt_number(),
            exc.type_name,
            exc,
            exc_info=exc.retryable,
        )
        raise as_application_error(exc) from None


STALL_MARGIN_S = 1.0
"""How much longer than its heartbeat timeout an attempt may go without a heartbeat before it
counts itself superseded: the SDK sends a heartbeat up to its throttle interval late."""


class Heartbeater:
    """Heartbeats ``details`` every ``interval`` seconds from a background thread, whatever the
    activity's own thread is doing (a long restore or save included), and at once on ``beat``.

    The SDK throttles what reaches the server (the worker's heartbeat throttle interval), so
    the server's view is at most that stale.

    ``superseded`` says when the attempt is no longer its activity's current one: no heartbeat
    went out for longer than the heartbeat timeout (the process was frozen or starved: the server
    has timed the attempt out and retried it), or the server answered a heartbeat that the
    attempt is gone. A thawed process learns the first at once, the second a heartbeat later.
    """

    def __init__(self, interval: float, **details: Any) -> None:
        self.interval = interval
        self._details = dict(details)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._context = contextvars.copy_context()  # the activity's context, for another thread
        self._thread = threading.Thread(target=self._loop, name="cairn-heartbeat", daemon=True)
        timeout = activity.info().heartbeat_timeout
        self.stall_limit = None if timeout is None else timeout.total_seconds() + STALL_MARGIN_S
        self._last = time.monotonic()
        self._superseded: str | None = None

    def update(self, **fields: Any) -> None:
        with self._lock:
            self._details.update(fields)

    def details(self) -> dict[str, Any]:
        with self._lock:
            return dict(self._details)

    def beat(self) -> None:
        self._mark()
        activity.heartbeat(self.details())

    def superseded(self) -> str | None:
        """Why this attempt is no longer current, or None while it is (from any thread)."""
        self._mark(beating=False)
        with self._lock:
            return self._superseded

    def _mark(self, beating: bool = True) -> None:
        """Note a stall past the limit since the last heartbeat; ``beating``: one goes out now."""
        now = time.monotonic()
        with self._lock:
            gap = now - self._last
            if self._superseded is None and self.stall_limit is not None and gap > self.stall_limit:
                self._superseded = f"no heartbeat for {gap:.1f} s, past the heartbeat timeout (this worker stalled)"
            if beating:
                self._last = now

    def notice_cancellation(self) -> None:
        """Read the activity's cancellation: the server saying the attempt is gone (its heartbeat
        found no such attempt, it timed out, the workflow was reset) supersedes it. Called in the
        activity's context (its own thread, or this one's loop)."""
        details = activity.cancellation_details()
        if details is not None and (details.not_found or details.timed_out or details.reset):
            with self._lock:
                self._superseded = self._superseded or "the server no longer knows this attempt"

    def _tick(self) -> None:
        self.notice_cancellation()
        self._mark()
        activity.heartbeat(self.details())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._context.run(self._tick)

    def __enter__(self) -> Heartbeater:
        self._mark()
        activity.heartbeat(self.details())
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def open_run_store(url: str, store_id: str | None) -> Store:
    """Open the run's store and check it is the one the run started on."""
    store = open_store(url)
    require_store_identity(store, store_id)
    return store


def require_numerics(numerics_id: str | None) -> None:
    """Refuse a segment of another numerics profile than this worker's (routing sends none here;
    this is the check behind it): non-retryable, naming both."""
    if numerics_id is None:
        return
    mine = process_numerics()
    if mine.id != numerics_id:
        raise NumericsProfileError(
            f"this segment must be computed under numerics profile {numerics_id}, this worker runs {mine.id}",
            field="numerics",
        )


def heartbeat_interval(default: float = 1.0) -> float:
    """A quarter of this activity's heartbeat timeout, at most ``default``: a busy phase can
    never outlast the timeout between two heartbeats."""
    timeout = activity.info().heartbeat_timeout
    return default if timeout is None else max(0.05, min(default, timeout.total_seconds() / 4))


def previous_reach(info: activity.Info) -> int | None:
    """The furthest step an earlier attempt reported, from its last heartbeat."""
    return heartbeat_reach(info.heartbeat_details)


def recomputed_steps(reached_before: int | None, resumed: int, attempt: int) -> int:
    """Steps earlier attempts of a segment computed past the step this attempt resumed from (it
    redoes them); none on a first attempt."""
    return max(0, (reached_before or 0) - resumed) if attempt > 1 else 0


def heartbeat_reach(details: Any) -> int | None:
    """The furthest step a segment's last heartbeat (its details) reported, if any."""
    if not details or not isinstance(details[0], dict):
        return None
    reached = [details[0].get(k) for k in ("step", "reached", "committed_step")]
    steps = [int(s) for s in reached if isinstance(s, int) and not isinstance(s, bool)]
    return max(steps) if steps else None


def interruption(run_id: str, result: TrainSegmentResult, what: str) -> ApplicationError:
    """How a segment (or a gang's node) that stopped on request, after committing, reports it:
    non-retryable and benign; the workflow reads the attempt and recomputed steps from it."""
    log.info("run %s: %s interrupted on request at step %d", run_id, what, result.step)
    return ApplicationError(
        f"{what} interrupted on request at step {result.step} after committing {result.checkpoint}",
        {"attempt": result.attempt, "recomputed_steps": result.recomputed_steps, "step": result.step},
        type=INTERRUPTED,
        non_retryable=True,
        category=ApplicationErrorCategory.BENIGN,
    )
