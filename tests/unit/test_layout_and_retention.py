"""One module owns the store layout; retention is linear in the objects of a run; one signer
policy applies to every manifest read."""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointContent, CheckpointKind, CheckpointOptions, read_manifest, write_checkpoint
from cairn.checkpoint.layout import (
    RESERVED_PREFIX,
    RUN_ID_PATTERN,
    checkpoint_prefix,
    manifest_key,
    parse_checkpoint_key,
    pin_key,
    registry_prefix,
)
from cairn.checkpoint.manager import list_checkpoints
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage, pin
from cairn.checkpoint.signing import Signer
from cairn.effects import PublishedModel, publish_model, published_entries
from cairn.stores import MemoryStore
from cairn.stores.base import ObjectInfo

INFERENCE = CheckpointKind.INFERENCE


class CountingStore(MemoryStore):
    """The in-memory double, counting the calls retention makes (no patching of internals)."""

    def __init__(self) -> None:
        super().__init__("counting")
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        self._count("list")
        return super().list(prefix)

    def read(self, key: str) -> bytes:
        self._count("read")
        return super().read(key)

    def delete(self, keys: Iterable[str]) -> None:
        self._count("delete")
        super().delete(keys)


def test_layout_parses_only_checkpoint_keys() -> None:
    key = parse_checkpoint_key(f"{checkpoint_prefix('run', 'training', 7)}/abc/rank000-0000.bin")
    assert key is not None and (key.run_id, key.kind, key.step, key.is_manifest) == ("run", "training", 7, False)
    manifest = parse_checkpoint_key(manifest_key("run", "training", 7))
    assert manifest is not None and manifest.is_manifest
    others = [pin_key("run", "best"), "run/owners/000000000000.json", f"{RESERVED_PREFIX}store-id.json", "run/x/12/y"]
    for other in others:
        assert parse_checkpoint_key(other) is None, other
    assert not RUN_ID_PATTERN.match(RESERVED_PREFIX.rstrip("/"))  # nothing of ours can be a run


def test_a_run_named_registry_does_not_collide_with_the_registry() -> None:
    store = MemoryStore("collide")
    write_checkpoint(store, CheckpointContent(kind=INFERENCE, run_id="registry", step=1), {"w": np.ones(2)})
    publish_model(store, PublishedModel(run_id="registry", checkpoint="c", fingerprint="f", key="k"))
    assert registry_prefix("registry").startswith(RESERVED_PREFIX)
    assert [r.step for r in list_checkpoints(store, "registry")] == [1]
    assert [e.checkpoint for e in published_entries(store, "registry")] == ["c"]
    assert published_entries(store, "inference") == []  # was: run 'registry''s checkpoints, unparseable
    plan = collect_garbage(store, "registry", RetentionPolicy(keep_last=1, grace_seconds=0))
    assert plan.orphans == [] and published_entries(store, "registry")  # GC leaves the registry alone


def test_retention_is_linear_over_ten_thousand_objects() -> None:
    """5,000 checkpoints (10,000 objects): one listing, manifests read only for the kept ones,
    batched deletes — and exactly the right checkpoints survive."""
    store = CountingStore()
    shard = b"\0" * 8
    for step in range(5000):  # the layout of a committed checkpoint; its bytes do not matter here
        store.write_object(f"{checkpoint_prefix('big', 'inference', step)}/n/rank000-0000.bin", [shard])
        store.put_if_absent(manifest_key("big", "inference", step), b"{}")
    pin(store, list_checkpoints(store, "big")[10], "keep-me")
    assert sum(1 for _ in store.list("big/")) >= 10_000
    store.calls.clear()
    plan = collect_garbage(store, "big", RetentionPolicy(keep_last=3, keep_every=1000, grace_seconds=1e9))
    kept = sorted(r.step for r in plan.keep)
    assert kept == [0, 10, 1000, 2000, 3000, 4000, 4997, 4998, 4999]
    assert len(plan.delete) == 5000 - len(kept)
    assert [r.step for r in list_checkpoints(store, "big")] == kept
    assert store.calls["list"] <= 3  # the run, its pins, and nothing per checkpoint
    assert store.calls["read"] <= len(kept) + 1  # kept manifests and the pin
    assert store.calls["delete"] <= 4  # manifests, their shards, orphans (+ nothing per checkpoint)


def test_every_manifest_read_verifies_the_signature_when_a_key_is_configured(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    store = MemoryStore("signed")
    ref = write_checkpoint(
        store, CheckpointContent(kind=INFERENCE, run_id="s", step=1), {"w": np.ones(2)}, options=CheckpointOptions()
    ).ref
    read_manifest(store, ref, expect_kind=None)  # no key configured: fine
    monkeypatch.setenv("CAIRN_SIGNING_KEY", "k" * 32)
    with pytest.raises(E.SignatureError):
        read_manifest(store, ref, expect_kind=None)  # the default reads the configured key
    signed = write_checkpoint(store, CheckpointContent(kind=INFERENCE, run_id="s", step=2), {"w": np.ones(2)}).ref
    assert read_manifest(store, signed, expect_kind=None).signature
    other = CheckpointOptions(signer=Signer(b"another key of 16+ bytes"))
    with pytest.raises(E.SignatureError):
        read_manifest(store, signed, expect_kind=None, options=other)
