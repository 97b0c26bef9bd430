"""The supervisor of ``cairn worker``: it runs the worker process as its child, keeps the table
of attempts the child reports running, and when the child dies fails those attempts at once
(``failing``) and starts a new child (``restarts``). A child that shows no sign of life for
longer than its attempts' heartbeat timeout (its event loop stuck: a thread holding the
interpreter lock in I/O that does not return) is killed and handled as one that died: its
heartbeats stopped, yet its SDK threads could still take tasks they would never run. SIGTERM and
SIGINT go on to the child as SIGTERM; it stops as it always does (checkpoint, hand back), and the
supervisor exits with its status.

The child stays in the supervisor's process group, so killing that group (a service manager,
a test) still stops both.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Sequence

from temporalio.client import Client

from workers.supervisor.channel import ActivityReport, ReportReader, RunningAttempts, child_environment
from workers.supervisor.failing import FailOutcome, fail_attempts
from workers.supervisor.restarts import RestartPolicy, WorkerCrashLoopError, describe_exit, is_crash

__all__ = ["Supervisor", "exit_status"]

CONNECT_WAIT_S = 5.0
"""How long a crash waits for the supervisor's own Temporal connection before leaving its
attempts to their heartbeat timeout."""
HANG_MARGIN_S = 1.0
"""A child is hung once silent for its attempts' shortest heartbeat timeout plus this."""
IDLE_HANG_S = 30.0
"""A child with no attempt (or none with a heartbeat timeout) is hung once silent this long."""
HANG_CHECK_S = 0.25
KILL_WAIT_S = 2.0
"""How long a hung child killed may take to exit (one stuck in uninterruptible I/O cannot, until
the I/O returns) before its attempts are failed anyway."""
log = logging.getLogger("cairn.supervisor")


def exit_status(returncode: int) -> int:
    """The shell's convention: a process killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class Supervisor:
    """Runs ``argv`` (a bare worker process) until it stops on request or crashes too often;
    ``connect`` makes its own Temporal client (``workers.client.connect`` with the worker's
    connection settings)."""

    def __init__(
        self,
        argv: Sequence[str],
        *,
        connect: Callable[[], Awaitable[Client]],
        say: Callable[[str], None],
        policy: RestartPolicy | None = None,
    ) -> None:
        self.argv = list(argv)
        self.connect = connect
        self.say = say
        self.policy = policy or RestartPolicy()
        self.stopping: signal.Signals | None = None
        self._stop = asyncio.Event()
        self._child: subprocess.Popen[bytes] | None = None
        self._client_task: asyncio.Task[Client] | None = None

    async def run(self) -> int:
        """Supervise until the worker process stops; its exit status (128 + N after signal N)."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self._forward, sig)
        self._client_task = asyncio.create_task(self._connect())
        try:
            while True:
                pid, returncode, orphans, silent = await self._run_child()
                if silent is None:
                    assert returncode is not None
                    how = describe_exit(returncode)
                else:
                    gone = describe_exit(returncode) if returncode is not None else "killed"
                    how = f"showed no sign of life for {silent:.1f} s (hung) and was {gone}"
                outcome = await fail_attempts(await self._client(), orphans, how) if orphans else FailOutcome()
                crashed = silent is not None or is_crash(returncode or 0, orphaned=bool(orphans))
                if self.stopping is not None or not crashed:
                    if orphans:
                        self.say(f"worker process {pid} {how}; {outcome.summary()}")
                    return exit_status(returncode or 0)
                try:
                    delay = self.policy.after_crash(time.monotonic(), how)
                except WorkerCrashLoopError:
                    self.say(f"worker process {pid} {how}; {outcome.summary()}")
                    raise
                when = f" in {delay:g} s" if delay else ""
                self.say(f"worker process {pid} {how}; {outcome.summary()}; starting a new one{when}")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), timeout=delay)
                if self.stopping is not None:
                    return 0
        finally:
            self._client_task.cancel()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)

    def _forward(self, sig: signal.Signals) -> None:
        """SIGTERM to the worker process for SIGTERM and SIGINT alike: it stops the same way on
        both, and it ignores the SIGINT a terminal's Ctrl-C sends it directly (``_start``)."""
        self.stopping = sig
        self._stop.set()
        if self._child is not None and self._child.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self._child.send_signal(signal.SIGTERM)

    def _start(self, write_fd: int) -> subprocess.Popen[bytes]:
        """The worker process, in this process's group (a kill of the group reaches it), started
        with SIGINT ignored until it sets its own handlers: a Ctrl-C reaches every process of the
        terminal's group, and one still importing would die of it with a traceback."""
        loop = asyncio.get_running_loop()
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            return subprocess.Popen(self.argv, pass_fds=(write_fd,), env={**os.environ, **child_environment(write_fd)})
        finally:
            loop.add_signal_handler(signal.SIGINT, self._forward, signal.SIGINT)

    async def _run_child(self) -> tuple[int, int | None, list[ActivityReport], float | None]:
        """Start the worker process and wait for its end: its pid, exit status (None: killed as
        hung and not gone yet), the attempts it left running, and how long it had been silent
        when it was killed as hung (None: it ended by itself)."""
        loop = asyncio.get_running_loop()
        read_fd, write_fd = os.pipe()
        reader = ReportReader(read_fd)
        running = RunningAttempts.empty()
        alive: list[float] = []  # the last sign of life (none yet: it is starting, not hung)
        try:
            child = self._start(write_fd)
        finally:
            os.close(write_fd)  # the child's copy is the only writer: its death is the pipe's end

        def on_readable() -> None:
            reports = reader.read_available()
            for report in reports:
                running.apply(report)
            if reports:
                alive[:] = [time.monotonic()]
            if reader.at_end:
                loop.remove_reader(read_fd)

        self._child = child
        if self.stopping is not None:  # asked to stop while starting it
            child.send_signal(signal.SIGTERM)
        loop.add_reader(read_fd, on_readable)
        try:
            returncode, silent = await self._wait_or_kill_hung(child, running, alive)
        finally:
            self._child = None
            loop.remove_reader(read_fd)
            for report in reader.read_available():  # what it wrote just before it died
                running.apply(report)
            reader.close()
        return child.pid, returncode, running.take(), silent

    async def _wait_or_kill_hung(
        self, child: subprocess.Popen[bytes], running: RunningAttempts, alive: list[float]
    ) -> tuple[int | None, float | None]:
        """The child's exit status, or — once it has been silent past ``hang_limit`` — SIGKILL
        it: its status if it exits within ``KILL_WAIT_S`` (else None), and how long it was silent."""
        waiter = asyncio.ensure_future(asyncio.to_thread(child.wait))
        checked = time.monotonic()
        while not waiter.done():
            await asyncio.wait({waiter}, timeout=HANG_CHECK_S)
            now = time.monotonic()
            if now - checked > HANG_CHECK_S + HANG_MARGIN_S and alive:
                alive[:] = [now]  # this process stalled too (a frozen host): no verdict on the child
            checked = now
            silent = now - alive[0] if alive else 0.0
            if waiter.done() or self.stopping is not None or silent <= running.hang_limit(IDLE_HANG_S, HANG_MARGIN_S):
                continue
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(waiter), timeout=KILL_WAIT_S)
            return (waiter.result() if waiter.done() else None), silent
        return waiter.result(), None

    async def _connect(self) -> Client:
        """The supervisor's own Temporal connection, made while the worker runs (so a crash does
        not wait for it); retried quietly: the worker process reports connection trouble."""
        wait = 1.0
        while True:
            try:
                return await self.connect()
            except Exception as exc:  # noqa: BLE001 - the worker process reports it, typed and once
                log.debug("supervisor: cannot connect to Temporal yet: %s", exc)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 30.0)

    async def _client(self) -> Client | None:
        assert self._client_task is not None
        try:
            return await asyncio.wait_for(asyncio.shield(self._client_task), timeout=CONNECT_WAIT_S)
        except TimeoutError:
            log.warning("supervisor: no Temporal connection; the attempts left running wait for the heartbeat timeout")
            return None
