"""A fault hook for drills and tests: crash this worker process at a named point.

Inert unless ``CAIRN_FAULT`` is set in the worker's environment, e.g.::

    CAIRN_FAULT=after-effect-before-complete:reserve   # after the service committed, before completion
    CAIRN_FAULT=mid-segment:7                          # when training reaches step 7
    CAIRN_FAULT=rank-mid-save:2@20                     # rank 2, its shards written, before the commit of step 20
    CAIRN_FAULT=after-activity-complete:train_segment  # the server took the completion; the supervisor was not told

``CAIRN_FAULT_ONCE`` (a file path) makes it fire once across processes: the marker is created
just before the crash, and a process that finds it does not crash again.
The crash is SIGKILL to itself: no cleanup, no completion, exactly like a lost machine.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

__all__ = ["maybe_crash"]


def maybe_crash(point: str, *, step: int | None = None, tag: str | None = None) -> None:
    spec = os.environ.get("CAIRN_FAULT")
    if not spec:
        return
    name, _, arg = spec.partition(":")
    if name != point:
        return
    if arg and arg != (str(step) if step is not None else tag):
        return
    once = os.environ.get("CAIRN_FAULT_ONCE")
    if once:
        marker = Path(once)
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, f"{point}:{arg} pid={os.getpid()}\n".encode())
        os.fsync(fd)
        os.close(fd)
    os.kill(os.getpid(), signal.SIGKILL)
