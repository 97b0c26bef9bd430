"""A run's store checked before its first step: writes, commits and listings it refuses are one
typed error naming the store, a probe leaves nothing behind, and a run id that already names
another config's checkpoints is refused."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import pytest

from cairn import errors as E
from cairn.checkpoint.options import CheckpointOptions
from cairn.runs.preflight import PROBE_MARK, require_same_config, require_writable
from cairn.session import TrainingSession
from cairn.stores import MemoryStore
from cairn.stores.base import Chunk, ObjectInfo
from tests.conftest import small_config


class RefusingStore(MemoryStore):
    """The in-memory store, refusing one call as a store that cannot be used does."""

    def __init__(self, refuse: str, error: E.CairnError) -> None:
        super().__init__(f"refusing-{refuse}")
        self.refuse, self.error = refuse, error

    def _maybe(self, call: str) -> None:
        if call == self.refuse:
            raise self.error

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        self._maybe("list")
        return super().list(prefix, start_after)

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        self._maybe("write_object")
        super().write_object(key, chunks, size)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._maybe("put_if_absent")
        return super().put_if_absent(key, data)


def test_a_writable_store_passes_and_keeps_nothing_of_the_probe() -> None:
    store = MemoryStore("preflight-ok")
    require_writable(store, "run")
    assert list(store.list()) == []


@pytest.mark.parametrize("call", ["list", "write_object", "put_if_absent"])
def test_a_store_that_refuses_is_one_typed_line_naming_it(call: str) -> None:
    store = RefusingStore(call, E.StoreNotFoundError(f"cannot {call}: Permission denied"))
    with pytest.raises(E.StoreNotFoundError) as info:
        require_writable(store, "run")
    message = str(info.value)
    assert message.startswith(f"store: {store.url} cannot take run run's checkpoints (checked before training): ")
    assert f"cannot {call}: Permission denied" in message and "\n" not in message
    assert not [o for o in MemoryStore.list(store) if PROBE_MARK in o.key]  # a refused commit deletes the probe written


def test_a_failing_store_stays_retryable() -> None:
    store = RefusingStore("write_object", E.StorageError("connection reset"))
    with pytest.raises(E.StorageError) as info:
        require_writable(store, "run")
    assert type(info.value) is E.StorageError and info.value.retryable and "connection reset" in str(info.value)


def test_a_run_id_holding_another_configs_checkpoints_is_refused() -> None:
    store = MemoryStore("preflight-config")
    config = small_config()
    options = CheckpointOptions.from_env()
    TrainingSession.fresh("run", store, config, options=options).run(3)
    require_same_config(store, "run", config, options)  # the same config: its commits are the same
    require_same_config(store, "fresh", small_config(seed=8), options)  # no checkpoints yet
    with pytest.raises(E.ConfigError) as info:
        require_same_config(store, "run", small_config(seed=8), options)
    message = str(info.value)
    assert message.startswith("run_id: run 'run' in memory://preflight-config already holds checkpoints of another")
    assert "latest: step 3; seed differ" in message and "--resume" in message
