"""The progress ``make demo`` shows while a run recovers from a kill (``workers.demo``): the
highest step the run reached, never lower, and what the retry does meanwhile — where it resumed,
what it recomputes — as it happened."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

from temporalio.api.enums.v1 import PendingActivityState

from workers.reports.timeline import SEGMENT_ACTIVITIES

__all__ = ["StepProgress", "ProgressDisplay", "running_segment"]


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
            notes.append(f"recomputed steps {self.resumed_from + 1}-{self.reach}; now at step {step}, training on")
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


class ProgressDisplay:
    """Where the demo shows its progress: a bar on a terminal; where stderr is none (a pipe, a
    log, CI), a line when the shown fields change, else at most one every ``every`` seconds
    while the step moves — never a redrawn bar (its ``\\r`` frames fill a log). Notes are lines
    either way, on stdout with the demo's other lines."""

    def __init__(
        self, name: str, total: int, stream: TextIO | None = None, notes: TextIO | None = None, every: float = 5.0
    ) -> None:
        from tqdm import tqdm

        self.stream = stream or sys.stderr  # the bar or the progress lines, where tqdm draws
        self.notes = notes or sys.stdout  # the notes, with the demo's other lines
        self.name, self.total, self.every = name, total, every
        self.bar = tqdm(total=total, desc=name, unit="step", file=self.stream) if self.stream.isatty() else None
        self._last: tuple[int, dict[str, Any]] | None = None
        self._at = float("-inf")

    def show(self, step: int, fields: dict[str, Any], now: float | None = None) -> None:
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix(**fields, refresh=True)
            return
        now = time.monotonic() if now is None else now
        if self._last is not None:
            same_fields, moved = self._last[1] == fields, self._last[0] != step
            if same_fields and not (moved and now - self._at >= self.every):
                return
        self._last, self._at = (step, dict(fields)), now
        shown = "".join(f" {k}={v}" for k, v in fields.items())
        print(f"{self.name}: step {step}/{self.total}{shown}", file=self.stream, flush=True)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self.notes)  # above the bar, which is drawn again below it
        else:
            print(text, file=self.notes, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
