"""Retention (``cairn.checkpoint.retention``) is linear in the objects of a run: one listing,
each manifest read once (judged: ``cairn.checkpoint.committed``), batched deletes."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from cairn.checkpoint.committed import list_checkpoints
from cairn.checkpoint.layout import checkpoint_prefix, manifest_key
from cairn.checkpoint.manifest import CheckpointKind
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage, pin
from cairn.stores import MemoryStore
from cairn.stores.base import ObjectInfo
from tests.conftest import stamped_manifest

INFERENCE = CheckpointKind.INFERENCE


class CountingStore(MemoryStore):
    """The in-memory double, counting the calls retention makes (no patching of internals)."""

    def __init__(self) -> None:
        super().__init__("counting")
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        self._count("list")
        return super().list(prefix, start_after)

    def read(self, key: str, max_bytes: int) -> bytes:
        self._count("read")
        return super().read(key, max_bytes)

    def delete(self, keys: Iterable[str]) -> None:
        self._count("delete")
        super().delete(keys)


def test_retention_is_linear_over_ten_thousand_objects() -> None:
    """5,000 checkpoints (10,000 objects): one listing, each manifest read once, batched deletes
    — and exactly the right checkpoints survive."""
    store = CountingStore()
    shard = b"\0" * 8
    for step in range(5000):  # the layout of a committed checkpoint; its shard's bytes do not matter here
        store.write_object(f"{checkpoint_prefix('big', 'inference', step)}/n/rank000-0000.bin", [shard])
        store.put_if_absent(manifest_key("big", "inference", step), stamped_manifest("big", INFERENCE, step))
    pin(store, list_checkpoints(store, "big")[10], "keep-me")
    assert sum(1 for _ in store.list("big/")) >= 10_000
    store.calls.clear()
    plan = collect_garbage(store, "big", RetentionPolicy(keep_last=3, keep_every=1000, grace_seconds=1e9))
    calls = dict(store.calls)
    kept = sorted(r.step for r in plan.keep)
    assert kept == [0, 10, 1000, 2000, 3000, 4000, 4997, 4998, 4999]
    assert len(plan.delete) == 5000 - len(kept)
    assert [r.step for r in list_checkpoints(store, "big")] == kept
    assert calls["list"] <= 3  # the run, its pins, its intents (after the uncommits), nothing per checkpoint
    assert calls["read"] <= 5000 + 1  # every manifest once (judged before it is kept or deleted) and the pin
    assert calls["delete"] <= 4  # manifests, their shards, orphans (+ nothing per checkpoint)
