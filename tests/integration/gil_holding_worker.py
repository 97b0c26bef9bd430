"""A worker process whose Python side stops at one training step and never comes back, holding the
interpreter lock (as a thread does that faults on a page of a file on a hung NFS mount), while the
SDK's own threads still run: they answer the server's keepalive pings and keep polling.

Test-only, kept out of the product: ``python -m tests.integration.gil_holding_worker --supervised
ARGS`` is ``cairn worker ARGS`` whose worker process is this module. ``HOLD_ENV`` is
``STEP:MARKER``: the first process to reach ``STEP`` creates ``MARKER`` (its pid and the time) and
holds; every other process, and every later attempt, passes.
"""

from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time
from functools import partial

from cairn import faults

HOLD_ENV = "CAIRN_TEST_HOLD_GIL_AT"
_crash = faults.maybe_crash


def _hold_or_crash(point: str, *, step: int | None = None, tag: str | None = None) -> None:
    at, _, marker = os.environ.get(HOLD_ENV, "").partition(":")
    if point == "mid-segment" and at and step == int(at):
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            pass
        else:
            os.write(fd, f"{os.getpid()} {time.time()}\n".encode())
            os.close(fd)
            ctypes.PyDLL(None).sleep(600)  # libc's sleep, called without releasing the GIL
    _crash(point, step=step, tag=tag)


def supervised(argv: list[str]) -> int:
    from workers.client import connect
    from workers.supervisor import Supervisor

    address = argv[argv.index("--address") + 1]
    child = [sys.executable, "-m", "tests.integration.gil_holding_worker", *argv]
    supervisor = Supervisor(
        child, connect=partial(connect, address), say=lambda s: print(f"cairn worker: {s}", flush=True)
    )
    return asyncio.run(supervisor.run())


if __name__ == "__main__":
    args = sys.argv[1:]
    if args and args[0] == "--supervised":
        sys.exit(supervised(args[1:]))
    faults.maybe_crash = _hold_or_crash
    from workers.worker import exit_now, main

    exit_now(main(args))
