"""Which exits are crashes, and when a crashed worker process is started again or given up on."""

from __future__ import annotations

import pytest

from workers.supervisor import RestartPolicy, WorkerCrashLoopError, exit_status
from workers.supervisor.restarts import describe_exit, is_crash


def test_restarts_at_once_then_back_off_then_give_up() -> None:
    policy = RestartPolicy(limit=5, window_s=60, first_backoff_s=1.0, max_delay_s=8.0)
    assert [policy.after_crash(t, "killed by SIGKILL") for t in (0.0, 1.0, 2.0, 3.0)] == [0.0, 1.0, 2.0, 4.0]
    with pytest.raises(WorkerCrashLoopError, match=r"crashed 5 times within 60 s \(last: killed by SIGKILL\)"):
        policy.after_crash(4.0, "killed by SIGKILL")
    assert WorkerCrashLoopError.exit_code != 0


def test_crashes_older_than_the_window_are_forgotten() -> None:
    policy = RestartPolicy(limit=3, window_s=10, first_backoff_s=1.0, max_delay_s=2.0)
    assert policy.after_crash(0.0, "exited 1") == 0.0
    assert policy.after_crash(5.0, "exited 1") == 1.0
    assert policy.after_crash(12.0, "exited 1") == 1.0  # the one at 0 s is out of the window
    assert policy.after_crash(100.0, "exited 1") == 0.0  # a crash long after the others: at once again


def test_the_delay_is_capped() -> None:
    policy = RestartPolicy(limit=10, window_s=60, first_backoff_s=1.0, max_delay_s=3.0)
    assert [policy.after_crash(float(t), "x") for t in range(6)] == [0.0, 1.0, 2.0, 3.0, 3.0, 3.0]


@pytest.mark.parametrize(
    ("returncode", "orphaned", "crash"),
    [
        (-9, False, True),  # SIGKILL, the OOM killer
        (-11, False, True),  # a segfault
        (1, False, True),  # an uncaught exception, os._exit(1)
        (137, False, True),  # os._exit(137)
        (0, False, False),  # stopped
        (5, False, False),  # Temporal unreachable: refused to start, restarting will not help
        (2, False, False),  # bad arguments, a numerics profile this machine cannot run
        (0, True, True),  # exited 0 with attempts still running: it did not stop, it died
    ],
)
def test_which_exits_are_crashes(returncode: int, orphaned: bool, crash: bool) -> None:
    assert is_crash(returncode, orphaned=orphaned) is crash


def test_exit_descriptions_and_statuses() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exited 3"
    assert describe_exit(-200) == "killed by signal 200"
    assert exit_status(-15) == 143 and exit_status(-9) == 137 and exit_status(5) == 5 and exit_status(0) == 0
