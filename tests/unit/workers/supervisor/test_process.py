"""The supervisor's loop with stand-in worker processes (small scripts that report over the real
channel, then crash, exit or wait for a signal) and a stand-in Temporal client: what it fails,
what it says, when it restarts, gives up, or stops."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from tests.conftest import REPO
from workers.supervisor import WORKER_CRASHED, RestartPolicy, Supervisor, WorkerCrashLoopError

CHILD = """
import os, signal, sys, time
from pathlib import Path
from workers.supervisor.channel import ActivityReport, reporter_from_environment

state, plan = Path(sys.argv[1]), sys.argv[2:]
run = len(list(state.glob("run-*")))
(state / f"run-{run}").write_text(str(signal.getsignal(signal.SIGINT) == signal.SIG_IGN))
writer = reporter_from_environment()
step = plan[min(run, len(plan) - 1)]

def report(event, token, heartbeat_timeout=0.0):
    writer.send(ActivityReport(event=event, token=token, activity_type="train_segment", workflow_id="run-x", attempt=1,
                               heartbeat_timeout=heartbeat_timeout))

if step == "crash":  # attempts A and B (tokens b"A", b"B") started, B's outcome sent, then a lost process
    report("started", "QQ=="); report("started", "Qg=="); report("ended", "Qg==")
    os.kill(os.getpid(), signal.SIGKILL)
elif step == "hang":  # alive, attempt A started (heartbeat timeout 0.5 s), then silent: stuck holding the GIL
    writer.send(ActivityReport(event="alive"))
    report("started", "QQ==", heartbeat_timeout=0.5)
    (state / "hanging").write_text("")
    time.sleep(60)
    sys.exit(3)
elif step == "orphan":  # exits 0, but attempt A never ended
    report("started", "QQ==")
    sys.exit(0)
elif step == "serve":
    def stop(*_):
        (state / "stopped").write_text("SIGTERM")
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
    (state / "ready").write_text("")
    time.sleep(60)
    sys.exit(3)
else:
    sys.exit(int(step))
"""


class FakeTemporal:
    """Records fails by task token; the server "already holds the outcome" of ``finished``."""

    def __init__(self, finished: tuple[bytes, ...] = ()) -> None:
        self.finished = finished
        self.fails: list[tuple[bytes, ApplicationError]] = []

    def get_async_activity_handle(self, *, task_token: bytes) -> Any:
        fake = self

        class Handle:
            async def fail(self, error: ApplicationError, **_: Any) -> None:
                fake.fails.append((task_token, error))
                if task_token in fake.finished:
                    raise RPCError("activity not found", RPCStatusCode.NOT_FOUND, b"")

        return Handle()


def supervisor(tmp_path: Path, *plan: str, temporal: FakeTemporal, said: list[str], **policy: Any) -> Supervisor:
    async def connect() -> Any:
        return temporal

    argv = [sys.executable, "-c", CHILD, str(tmp_path), *plan]
    return Supervisor(argv, connect=connect, say=said.append, policy=RestartPolicy(**policy))


@pytest.fixture(autouse=True)
def _importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))


async def test_a_crash_fails_the_attempts_left_running_and_restarts(tmp_path: Path) -> None:
    temporal, said = FakeTemporal(), list[str]()
    code = await supervisor(tmp_path, "crash", "0", temporal=temporal, said=said).run()
    assert code == 0  # the second worker process stopped by itself
    assert [token for token, _ in temporal.fails] == [b"A"]  # B had ended: never failed
    error = temporal.fails[0][1]
    assert error.type == WORKER_CRASHED and not error.non_retryable and "killed by SIGKILL" in str(error)
    assert len(said) == 1 and said[0].endswith(
        "killed by SIGKILL; failed train_segment of run-x (attempt 1) as WorkerCrashed; starting a new one"
    )
    assert sorted(p.name for p in tmp_path.glob("run-*")) == ["run-0", "run-1"]


async def test_a_refused_fail_is_counted_not_reported(tmp_path: Path) -> None:
    temporal, said = FakeTemporal(finished=(b"A",)), list[str]()
    assert await supervisor(tmp_path, "crash", "0", temporal=temporal, said=said).run() == 0
    assert said[0].endswith(
        "train_segment of run-x (attempt 1) had already finished (the server refused the fail); starting a new one"
    )


async def test_a_silent_worker_process_is_killed_as_hung_and_its_attempts_failed(tmp_path: Path) -> None:
    """Its event loop stopped (a thread stuck in I/O holding the interpreter lock): no heartbeat
    reaches the server, yet its SDK threads could still take tasks. Silent past its attempt's
    heartbeat timeout (+ 1 s), it is killed, its attempt failed at once, and a new one started."""
    temporal, said = FakeTemporal(), list[str]()
    started = asyncio.get_running_loop().time()
    assert await supervisor(tmp_path, "hang", "0", temporal=temporal, said=said).run() == 0
    assert (tmp_path / "hanging").exists() and asyncio.get_running_loop().time() - started < 10
    assert [token for token, _ in temporal.fails] == [b"A"]
    error = temporal.fails[0][1]
    assert error.type == WORKER_CRASHED and "showed no sign of life for" in str(error), error
    assert len(said) == 1 and "(hung) and was killed by SIGKILL; failed train_segment of run-x" in said[0], said
    assert said[0].endswith("starting a new one")


async def test_an_exit_that_leaves_attempts_running_is_a_crash(tmp_path: Path) -> None:
    temporal, said = FakeTemporal(), list[str]()
    assert await supervisor(tmp_path, "orphan", "0", temporal=temporal, said=said).run() == 0
    assert [token for token, _ in temporal.fails] == [b"A"] and "exited 0; failed" in said[0]


async def test_the_worker_process_own_exit_status_ends_the_supervisor(tmp_path: Path) -> None:
    temporal, said = FakeTemporal(), list[str]()
    assert await supervisor(tmp_path, "5", temporal=temporal, said=said).run() == 5  # e.g. Temporal unreachable
    assert said == [] and temporal.fails == [] and len(list(tmp_path.glob("run-*"))) == 1


async def test_repeated_crashes_give_up(tmp_path: Path) -> None:
    temporal, said = FakeTemporal(), list[str]()
    loop = supervisor(tmp_path, "1", temporal=temporal, said=said, limit=3, first_backoff_s=0.01)
    with pytest.raises(WorkerCrashLoopError, match="crashed 3 times within 60 s"):
        await loop.run()
    assert len(list(tmp_path.glob("run-*"))) == 3
    assert said[-1].endswith("exited 1; no activity was running") and "in 0.01 s" in said[1]


async def test_ctrl_c_stops_the_worker_process_with_sigterm(tmp_path: Path) -> None:
    temporal, said = FakeTemporal(), list[str]()
    task = asyncio.create_task(supervisor(tmp_path, "serve", temporal=temporal, said=said).run())
    while not (tmp_path / "ready").exists():
        assert not task.done()
        await asyncio.sleep(0.02)
    os.kill(os.getpid(), signal.SIGINT)  # to the supervisor: this process
    assert await asyncio.wait_for(task, timeout=30) == 0
    assert (tmp_path / "stopped").read_text() == "SIGTERM"
    assert (tmp_path / "run-0").read_text() == "True"  # it started with SIGINT ignored
    assert said == [] and temporal.fails == []
