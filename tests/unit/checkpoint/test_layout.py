"""The store layout (``cairn.checkpoint.layout``) is owned by one module: only checkpoint keys parse
as checkpoints, and a run named like the registry does not collide with it."""

from __future__ import annotations

import numpy as np

from cairn.checkpoint import CheckpointContent, CheckpointKind, write_checkpoint
from cairn.checkpoint.committed import list_checkpoints
from cairn.checkpoint.layout import (
    RUN_ID_PATTERN,
    checkpoint_prefix,
    manifest_key,
    parse_checkpoint_key,
    pin_key,
    registry_prefix,
)
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage
from cairn.effects import PublishedModel, publish_model, published_entries
from cairn.stores import MemoryStore
from cairn.stores.identity import RESERVED_PREFIX

INFERENCE = CheckpointKind.INFERENCE


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
