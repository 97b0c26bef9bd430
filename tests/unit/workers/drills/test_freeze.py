"""The ``freeze`` fault's bookkeeping: it needs a second worker to take the frozen one's segment, it
is reported with how long the worker was frozen, and a thawed attempt that committed anything
fails the verdict (it must know it was superseded and write nothing)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cairn import errors as E
from workers.drills.faults import FaultRecord, check_targets, zombie_commits
from workers.drills.observe import Commit
from workers.drills.schedule import FAULT_TARGETS, DrillSpec, plan_schedule
from workers.drills.verdict import _faults

T0 = 1_800_000_000.0


def test_freeze_is_a_target_and_needs_a_second_worker() -> None:
    assert "freeze" in FAULT_TARGETS
    schedule = plan_schedule(DrillSpec(seed=2, kills=3, targets=["freeze"]))
    assert [f.kind for f in schedule] == ["freeze"] * 3
    check_targets(schedule, "/abs/store", frozenset(), service=False, workers=2)
    with pytest.raises(E.ConfigError, match="--workers"):
        check_targets(schedule, "/abs/store", frozenset(), service=False, workers=1)


def freeze(zombie: list[int] | None = None, recomputed_to: int = 43) -> FaultRecord:
    return FaultRecord(
        1,
        "freeze",
        fired_at=T0,
        worker_pid=101,
        committed_at_fault=40,
        detected_at=T0 + 3.2,
        resumed_at=T0 + 4.1,
        resumed_from=40,
        reached=recomputed_to,
        thawed_at=T0 + 6.0,
        zombie_commits=zombie,
    )


def verdict(*faults: FaultRecord) -> Any:
    return _faults(SimpleNamespace(faults=list(faults), checkpoint_every=5))


def test_a_freeze_is_reported_with_its_length_and_passes_when_the_zombie_wrote_nothing() -> None:
    record = freeze(zombie=[])
    assert record.to_json(T0)["frozen_s"] == 6.0 and record.to_json(T0)["zombie_commits"] == []
    assert verdict(record).passed


def test_a_zombie_commit_or_a_long_recompute_fails_the_verdict() -> None:
    check = verdict(freeze(zombie=[41]))
    assert not check.passed and "superseded attempt committed step(s) 41" in check.detail
    check = verdict(freeze(zombie=[], recomputed_to=52))
    assert not check.passed and "recomputed 12 steps > interval 5" in check.detail


def test_zombie_commits_are_the_thawed_attempts_own() -> None:
    """Commits the frozen worker created shortly after the thaw, up to an interval past its last
    commit before the freeze; its earlier commits, a save that found its step committed already,
    and a later segment it takes, are not the zombie's."""
    commits = [
        Commit(T0 - 1.0, 40, 0.01, True, "worker-1"),  # before the freeze
        Commit(T0 + 6.1, 45, 0.01, True, "worker-2"),  # the retry
        Commit(T0 + 6.2, 45, 0.01, False, "worker-1"),  # the thawed attempt found it committed: wrote nothing
        Commit(T0 + 6.3, 44, 0.01, True, "worker-1"),  # the thawed attempt committed a step of its own
        Commit(T0 + 7.0, 60, 0.01, True, "worker-1"),  # a later segment it took
    ]
    assert zombie_commits(freeze(), commits, "worker-1", window_s=3.0, every=5) == [44]
    assert zombie_commits(FaultRecord(2, "freeze"), commits, "worker-1", 3.0, 5) == []  # never thawed
    # The freeze caught a commit between its write and its log line: logged after the thaw, yet the
    # retry resumed from it, so it was there before the retry started (before the thaw).
    caught = [Commit(T0 + 6.2, 45, 0.01, True, "worker-1")]
    record = freeze()
    record.resumed_from = 45
    assert zombie_commits(record, caught, "worker-1", window_s=3.0, every=5) == []
