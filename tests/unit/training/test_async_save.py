"""Async save: backpressure (one save in flight per run by default)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from cairn.checkpoint.options import CheckpointOptions
from cairn.config import TrainConfig
from cairn.session import TrainingSession
from cairn.stores import MemoryStore
from cairn.stores.base import Chunk
from cairn.training.async_save import AsyncCheckpointer


class GatedStore(MemoryStore):
    """Shard writes wait for a gate: a save stays 'in flight' until the test opens it."""

    def __init__(self) -> None:
        super().__init__("gated")
        self.gate = threading.Event()
        self.writes = 0

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        self.gate.wait(timeout=30)
        self.writes += 1
        super().write_object(key, chunks, size)


def test_second_save_waits_for_the_first(config: TrainConfig) -> None:
    store = GatedStore()
    session = TrainingSession.fresh("bp", MemoryStore("bp-src"), config)
    saver = AsyncCheckpointer(store, "bp", options=CheckpointOptions.from_env())
    first = saver.save_async(session.state)
    returned: dict[str, Any] = {}

    advanced = session.state.copy()  # a second save under another key (step 1)
    advanced.step, advanced.cursor = 1, config.batch_size
    advanced.history = {k: [0.0] for k in advanced.history}

    def second() -> None:
        returned["handle"] = saver.save_async(advanced)

    t = threading.Thread(target=second)
    t.start()
    time.sleep(0.3)
    assert "handle" not in returned and not first.done()  # blocked: one save in flight
    store.gate.set()
    t.join(timeout=30)
    assert first.result(timeout=30).ref.step == 0
    assert returned["handle"].result(timeout=30).ref.step == 1
    saver.close()


def test_reused_snapshot_buffers_never_mix_saves(config: TrainConfig) -> None:
    """Snapshot buffers are reused once their save is over, never while it is in flight."""
    from cairn.checkpoint import latest_committed
    from cairn.checkpoint.compare import compare_states
    from cairn.training import load_training

    store = GatedStore()
    session = TrainingSession.fresh("reuse", MemoryStore("reuse-src"), config)
    saver = AsyncCheckpointer(store, "reuse", options=CheckpointOptions.from_env(), max_in_flight=2)
    expected = []
    handles = []
    for step in range(3):
        state = session.state.copy()
        state.step, state.cursor = step, step * config.batch_size
        state.history = {k: [float(i) for i in range(step)] for k in state.history}
        for arr in [*state.params.values(), *state.m.values(), *state.v.values()]:
            arr[...] = float(step + 1)
        expected.append(state.copy())
        handles.append(saver.save_async(state))
        for arr in [*state.params.values(), *state.m.values(), *state.v.values()]:
            arr[...] = -7.0  # mutated right after the call
        if step == 1:
            assert not handles[0].done()  # two saves in flight: two distinct buffers
            store.gate.set()
    refs = [h.result(timeout=30).ref for h in handles]
    saver.close()
    for ref, want in zip(refs, expected, strict=True):
        got, _ = load_training(store, ref)
        assert compare_states(got, want) == []
    assert latest_committed(store, "reuse") == refs[-1]
