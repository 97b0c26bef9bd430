"""What a running drill shows while it runs, on stderr only (stdout carries the report; with
``--json`` one JSON document): its phase (starting stack, faulted run, baseline, verifying), the
step its run has reached, and the faults fired so far.

Where stderr is a file or a pipe every event is one line, and the step at most one line every
``every_s`` seconds; on a terminal the step is one line refreshed in place, with the events
printed above it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from workers.drills.faults import FaultRecord

__all__ = ["DrillProgress", "fault_line"]

_CLEAR = "\r\x1b[K"
"""Back to the start of the line, and erase it."""


class DrillProgress:
    """The drill's progress lines. ``stream``: where they go (default: ``sys.stderr`` as it is
    when each is written); ``enabled=False``: nowhere (``cairn drill --no-progress``)."""

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        enabled: bool = True,
        every_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream, self.enabled, self.every_s, self.clock = stream, enabled, every_s, clock
        self.current = ""
        """The phase now."""
        self.total_steps = 0
        self.faults = 0
        self._status = ""  # the step line (a terminal shows it under the events)
        self._last: tuple[float, int] | None = None  # (when, step) of the last step line to a pipe

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stderr

    def _tty(self) -> bool:
        isatty = getattr(self.stream, "isatty", None)
        return bool(isatty and isatty())

    def _event(self, text: str) -> None:
        if not self.enabled:
            return
        line = f"drill [{self.current}] {text}"
        if self._tty():
            self.stream.write(_CLEAR + line + "\n" + (self._status if self._status else ""))
        else:
            self.stream.write(line + "\n")
            self._last = None  # the next step line follows at once
        self.stream.flush()

    def phase(self, name: str, detail: str) -> None:
        """The drill entered phase ``name`` (or did the next thing in it): one line."""
        self.current = name
        self._event(detail)

    def begin_run(self, total_steps: int, faults: int) -> None:
        """The faulted run started: ``total_steps`` long, with ``faults`` in its schedule."""
        self.current, self.total_steps, self.faults = "faulted run", total_steps, faults
        self._last = None

    def fault(self, text: str) -> None:
        """A fault fired (and what came of it): one line."""
        self._event(text)

    def step(self, step: int, fired: int, workers: int) -> None:
        """Where the run is: its step, the faults fired so far, the workers alive. Called often."""
        if not self.enabled:
            return
        line = (
            f"drill [{self.current}] step {step}/{self.total_steps}, "
            f"faults fired {fired}/{self.faults}, {workers} worker(s)"
        )
        if self._tty():
            self._status = "\r" + line + "\x1b[K"
            self.stream.write(self._status)
        else:
            now = self.clock()
            if self._last is not None and (now - self._last[0] < self.every_s or step == self._last[1]):
                return
            self._last = (now, step)
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self) -> None:
        """The run is over: a terminal's step line is erased (the events stay)."""
        if self.enabled and self._tty() and self._status:
            self.stream.write(_CLEAR)
            self.stream.flush()
        self._status = ""


def fault_line(rec: FaultRecord, planned: int) -> str:
    """A fault as the progress shows it once it is over: when it fired (the step of the run's last
    heartbeat then, which lags a little), where training resumed, after how long, what it redid."""
    head = f"fault {rec.index}/{planned} {rec.kind}" + (f"({rec.param})" if rec.param else "")
    if rec.fired_at is None:
        return f"{head}: did not fire ({rec.note or 'no moment for it'})"
    fired = f"{head}: fired at about step {rec.step_at_fault}" if rec.step_at_fault is not None else f"{head}: fired"
    if rec.recovery_s is None:
        return f"{fired}; training did not resume"
    resumed = f" from step {rec.resumed_from}" if rec.resumed_from is not None else ""
    redone = f", {rec.recomputed} step(s) recomputed" if rec.recomputed is not None else ""
    return f"{fired}; training resumed{resumed} after {rec.recovery_s:.2f} s{redone}"
