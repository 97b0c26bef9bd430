"""Warm segments (``cairn.runs.warm`` and the segment activity's choice of session): a held
session is used only when it is exactly the store's latest commit, on a first attempt, for the
same config and store, with no rollback; everything else restores. Warm and cold continue to the
same bits, and the warm path restores nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from activities.inputs import TrainSegmentInput, own_queue
from activities.training import _session
from cairn.checkpoint import list_checkpoints
from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig
from cairn.runs.warm import WarmRuns, warm_key
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.training import manager
from tests.conftest import digits_config, small_config


def segment(store: Path, config: TrainConfig, target: int, **extra: Any) -> TrainSegmentInput:
    return TrainSegmentInput(
        run_id="run", config=config, store=str(store), target_step=target, checkpoint_every=5, **extra
    )


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> WarmRuns:
    cache = WarmRuns(capacity=2)
    monkeypatch.setattr("activities.training.WARM", cache)
    return cache


def held_after(store: Path, config: TrainConfig, cache: WarmRuns, steps: int) -> TrainingSession:
    session = TrainingSession.resume_latest("run", LocalStore(store), config)
    session.run(steps)
    cache.keep("run", warm_key(config.canonical_json(), str(store)), session)
    return session


@pytest.mark.parametrize("make_config", [small_config, digits_config])
def test_a_held_session_continues_from_memory_to_the_cold_paths_bits(
    tmp_path: Path, cache: WarmRuns, make_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config()
    store = tmp_path / "s"
    held = held_after(store, config, cache, 10)
    reads: list[str] = []
    original = manager.load_training_with_trainer
    monkeypatch.setattr(
        "cairn.session.load_training_with_trainer", lambda *a, **k: reads.append("restore") or original(*a, **k)
    )
    key = warm_key(config.canonical_json(), str(store))
    session, source = _session(segment(store, config, 20), 1, LocalStore(store), key, None)
    warm = source == "memory"
    assert warm and session is held and reads == []  # no build, no restore
    session.run(10)
    cold = TrainingSession.fresh("cold", tmp_path / "c", config)
    cold.run(10)
    cold.run(10)
    assert compare_states(session.state, cold.state) == []
    assert cache.nbytes == 0 and cache.runs == 0  # taken out while it trains


def test_any_doubt_takes_the_cold_path(tmp_path: Path, cache: WarmRuns) -> None:
    config = small_config()
    store = tmp_path / "s"
    key = warm_key(config.canonical_json(), str(store))

    def choose(**extra: Any) -> tuple[TrainingSession, bool]:
        attempt = extra.pop("attempt", 1)
        session, source = _session(segment(store, config, 40, **extra), attempt, LocalStore(store), key, None)
        return session, source == "memory"

    held_after(store, config, cache, 10)
    other = TrainingSession.resume_latest("run", LocalStore(store), config)
    other.run(5)  # another worker committed step 15 meanwhile
    session, warm = choose()
    assert not warm and session.state.step == 15
    held_after(store, config, cache, 5)
    assert not choose(attempt=2)[1]  # a retry trusts only the store
    held_after(store, config, cache, 5)
    rollback = str(list_checkpoints(LocalStore(store), "run")[0])
    session, warm = choose(resume_from=rollback)
    assert not warm and session.state.step == 10
    held_after(store, config, cache, 5)
    other_config = small_config(seed=99)
    assert cache.take("run", warm_key(other_config.canonical_json(), str(store))) is None  # another config: dropped
    assert cache.runs == 0


def test_the_cache_is_bounded_and_only_keeps_committed_states(tmp_path: Path) -> None:
    cache = WarmRuns(capacity=1)
    config = small_config()
    a = TrainingSession.fresh("a", tmp_path / "a", config)
    a.run(3)
    b = TrainingSession.fresh("b", tmp_path / "b", config)
    b.run(3)
    cache.keep("a", "k", a)
    cache.keep("b", "k", b)  # the least recently used goes
    assert cache.runs == 1 and cache.take("a", "k") is None and cache.take("b", "k") is not None
    a.run(2, checkpoint_at_end=False)  # its state is past its last commit: not held
    cache.keep("a", "k", a)
    assert cache.runs == 0
    off = WarmRuns(capacity=0)
    off.keep("b", "k", b)
    assert off.runs == 0
    idle = WarmRuns(capacity=2, idle_seconds=0.0)
    idle.keep("b", "k", b)
    assert idle.runs == 0  # released at once when idle


def test_a_worker_names_its_own_queue_beside_every_queue_it_polls() -> None:
    assert own_queue("cairn-training", "w1") == "cairn-training#w-w1"
    assert own_queue(own_queue("q@x86-64-v3", "w1"), "w1") == "q@x86-64-v3#w-w1"
