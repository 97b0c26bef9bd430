"""The progress ``make demo`` shows while a run recovers from a kill (``workers.demo``): the
highest step the run reached, never lower, and what the retry does meanwhile — where it resumed,
what it recomputes — as it happened."""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import PendingActivityState

from workers.reports.timeline import SEGMENT_ACTIVITIES

__all__ = ["StepProgress", "running_segment"]


@dataclass
class StepProgress:
    """What the demo's bar shows: the highest step the run has reached, so it never goes back.
    A killed attempt's retry resumes from the last committed checkpoint, below the step the
    killed attempt had reached; ``see`` returns a note when the retry is first seen and one when
    it has recomputed up to there, and meanwhile ``postfix`` says where the recomputation is."""

    highest: int = 0
    """The highest step seen."""
    step: int = 0
    resumed_from: int | None = None
    """The step the running retry resumed from, while it recomputes up to ``reach``."""
    reach: int = 0
    """The step the killed attempt had reached."""
    attempt: tuple[str, int] | None = None
    """(activity id, attempt) of the running segment."""
    retried: bool = False
    """A retry was seen, its first step of its own not yet."""

    def see(self, step: int | None, attempt: tuple[str, int] | None = None, durable: int | None = None) -> list[str]:
        """The running segment ``attempt`` is at ``step`` (None: it has reported no step of its
        own yet); ``durable``: the step of the checkpoint a retry resumes from. Returns notes."""
        if attempt is not None and self.attempt is not None and attempt[0] == self.attempt[0]:
            self.retried = self.retried or attempt[1] > self.attempt[1]
        self.attempt = attempt if attempt is not None else self.attempt
        if step is None:
            return []
        notes = []
        if (self.retried or step < self.highest) and self.resumed_from is None:
            start = min(step, durable) if durable is not None else step
            self.retried = False
            if start < self.highest:
                self.resumed_from, self.reach = start, self.highest
                notes.append(
                    f"the retry resumed from step {start} (the last committed checkpoint) and is recomputing "
                    f"steps {start + 1}-{self.reach}, which the killed attempt had reached"
                )
        self.step = step
        if self.resumed_from is not None and step >= self.reach:
            notes.append(f"recomputed steps {self.resumed_from + 1}-{self.reach}; training on from step {step}")
            self.resumed_from = None
        self.highest = max(self.highest, step)
        return notes

    def postfix(self) -> dict[str, str]:
        return {"recomputing": f"{self.step}/{self.reach}"} if self.resumed_from is not None else {}


def running_segment(desc: Any) -> tuple[tuple[str, int], int | None] | None:
    """The running segment's (activity id, attempt), and the step its own last heartbeat reported:
    None while the attempt waits to start or has not heartbeat yet (the server keeps showing the
    previous attempt's heartbeat, and its start time until the retry starts)."""
    for pending in desc.raw_description.pending_activities:
        if pending.activity_type.name not in SEGMENT_ACTIVITIES:
            continue
        own = (
            pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED
            and pending.HasField("last_heartbeat_time")
            and pending.HasField("last_started_time")
            and pending.last_heartbeat_time.ToDatetime() >= pending.last_started_time.ToDatetime()
        )
        step = None
        for payload in pending.heartbeat_details.payloads if own else []:
            with contextlib.suppress(ValueError, AttributeError):
                value = json.loads(payload.data)
                step = value["step"] if isinstance(value.get("step"), int) else step
        return (pending.activity_id, pending.attempt), step
    return None
