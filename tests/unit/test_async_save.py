"""Async save: backpressure (one save in flight per run by default)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from typing import Any

from cairn.checkpoint.async_save import AsyncCheckpointer
from cairn.config import TrainConfig
from cairn.session import TrainingSession
from cairn.stores import MemoryStore
from cairn.stores.base import Chunk


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
    saver = AsyncCheckpointer(store, "bp")
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
