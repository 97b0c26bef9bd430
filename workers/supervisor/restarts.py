"""When the supervisor starts a crashed worker process again, and when it gives up.

The first crash is restarted at once; more crashes within ``window_s`` wait 1 s, 2 s, 4 s ...
(at most ``max_delay_s``); the ``limit``-th crash within the window ends the supervisor with
``WorkerCrashLoopError`` (its service manager decides what next). Which exits count as a crash
is decided here too (``is_crash``).
"""

from __future__ import annotations

import signal
from collections import deque
from dataclasses import dataclass, field

from cairn.errors import WorkerCrashLoopError

__all__ = ["RestartPolicy", "WorkerCrashLoopError", "describe_exit", "is_crash", "OWN_EXIT_CODES"]

OWN_EXIT_CODES = frozenset({0, 2, 3, 4, 5, 130, 143})
"""Exit statuses a worker process chooses itself: stopped (0, or interrupted), or refused to
start (bad arguments or numerics profile 2, Temporal unreachable 5, ...). Anything else — a
signal (SIGKILL, a segfault, the OOM killer), an uncaught exception (1), ``os._exit(n)`` with
another code — is a crash."""


def describe_exit(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited {returncode}"


def is_crash(returncode: int, *, orphaned: bool) -> bool:
    """Whether a worker process that was not asked to stop died rather than stopped: a crash
    status, or any exit that left attempts running."""
    return returncode < 0 or returncode not in OWN_EXIT_CODES or orphaned


@dataclass
class RestartPolicy:
    limit: int = 5
    window_s: float = 60.0
    first_backoff_s: float = 1.0
    max_delay_s: float = 8.0
    _crashes: deque[float] = field(default_factory=deque)

    def after_crash(self, now: float, how: str) -> float:
        """The delay before the next start, after a crash at ``now`` (monotonic seconds);
        raises ``WorkerCrashLoopError`` at the ``limit``-th crash within the window."""
        self._crashes.append(now)
        while self._crashes and self._crashes[0] <= now - self.window_s:
            self._crashes.popleft()
        recent = len(self._crashes)
        if recent >= self.limit:
            raise WorkerCrashLoopError(
                f"the worker process crashed {recent} times within {self.window_s:g} s (last: {how}); not restarting it"
            )
        if recent == 1:
            return 0.0
        return float(min(self.first_backoff_s * 2 ** (recent - 2), self.max_delay_s))
