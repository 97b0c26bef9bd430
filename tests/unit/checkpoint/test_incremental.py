"""Incremental checkpoints (``cairn.checkpoint.reuse``, ``intents``, ``retention``, ``copy``):
a block the run already holds is referenced, not rewritten; every checkpoint restores bit for
bit with the fingerprint of a full save; GC counts references, crashed or racing a save."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from cairn import errors as E
from cairn.checkpoint import intents as intents_module
from cairn.checkpoint.blocks import parts_of, split_blocks
from cairn.checkpoint.commit import CommitResult, write_checkpoint
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.copy import copy_checkpoint
from cairn.checkpoint.layout import intents_prefix, manifest_key
from cairn.checkpoint.manifest import CheckpointKind, Manifest
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.reader import read_logical, read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.retention import GcPlan, RetentionPolicy, collect_garbage
from cairn.checkpoint.reuse import durable_blocks, forget_blocks, write_rank_blocks
from cairn.config import parse_config
from cairn.distributed.checkpoint import coordinated_save, read_blocks
from cairn.distributed.comm import SoloComm
from cairn.gang.job import GangJob
from cairn.gang.rank import run_rank
from cairn.session import TrainingSession
from cairn.stores import LocalStore, MemoryStore
from cairn.stores.base import Chunk
from cairn.trainers.pytorch import TorchOptions, TorchSetup, TorchTrainer
from cairn.training.manager import load_training, save_training
from tests.conftest import dist_config, rewrite_manifest, rewrite_rank_index
from workers.cli.main import main as cli

RUN = "tune"
TRAINING = CheckpointKind.TRAINING
BLOCK = 4096
OPTIONS = CheckpointOptions(incremental=True, block_bytes=BLOCK, shard_bytes=64 << 10)
FULL = CheckpointOptions(block_bytes=BLOCK, shard_bytes=64 << 10)


class CountingStore(MemoryStore):
    """The in-memory double, counting the bytes written into shard files."""

    def __init__(self, name: str = "counting") -> None:
        super().__init__(name)
        self.shard_bytes = 0
        self.on_write: Callable[[str], None] | None = None

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        data = b"".join(bytes(memoryview(c).cast("B")) for c in chunks)
        super().write_object(key, [data], size=len(data))
        if key.endswith(".bin") and "/history/" not in key:
            self.shard_bytes += len(data)
        if self.on_write is not None:
            self.on_write(key)


class CrashingStore(CountingStore):
    """Deletes ``allowed`` objects, then fails: a GC killed midway."""

    allowed = 10**9

    def delete(self, keys: Iterable[str]) -> None:
        for key in list(keys):
            if self.allowed <= 0:
                raise E.StorageError("killed mid-GC")
            self.allowed -= 1
            super().delete([key])


def state_at(step: int, frozen: np.ndarray) -> dict[str, np.ndarray]:
    """A fine-tuning state: a large frozen base and a small adapter that changes every step."""
    rng = np.random.default_rng(step)
    return {
        "param/base": frozen,
        "param/adapter": rng.standard_normal(300),
        "optim/adapter/exp_avg": rng.standard_normal(300),
        "step": np.array([step], dtype=np.int64),
    }


FROZEN = np.random.default_rng(0).standard_normal((64, 256))  # 128 KiB: 32 blocks
CHANGING_BYTES = 300 * 8 * 2 + 8  # the adapter, its moment and the step: 3 + 3 + 1 blocks


def content(step: int) -> CheckpointContent:
    return CheckpointContent(kind=TRAINING, run_id=RUN, step=step, cursor=step, meta={"note": "incremental"})


def save(store: MemoryStore, step: int, options: CheckpointOptions = OPTIONS) -> CommitResult:
    return write_checkpoint(
        store,
        content(step),
        state_at(step, FROZEN),
        options=options,
        block_bytes=BLOCK,
        incremental=options.incremental,
    )


def restore(store: MemoryStore, step: int) -> tuple[dict[str, np.ndarray], Manifest]:
    ref = CheckpointRef(store.url, RUN, TRAINING, step)
    manifest = read_manifest(store, ref, expect_kind=TRAINING, options=FULL)
    return read_logical(store, ref, manifest), manifest


def full_fingerprint(step: int) -> str:
    """The fingerprint of a full (non-incremental) save of the same state, in its own store."""
    return save(MemoryStore(f"full-{step}"), step, FULL).manifest.fingerprint


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return set(a) == set(b) and all(a[k].dtype == b[k].dtype and a[k].tobytes() == b[k].tobytes() for k in a)


def linked_shards(store: MemoryStore, step: int) -> set[str]:
    root = json.loads(store.read(manifest_key(RUN, "training", step), 1 << 30))
    return {k for r in root["indexes"] for k in r.get("linked", [])}


def shard_objects(store: MemoryStore) -> set[str]:
    return {o.key for o in store.list(f"{RUN}/training/") if o.key.endswith(".bin")}


def test_every_checkpoint_after_the_first_writes_only_the_changed_blocks() -> None:
    store = CountingStore()
    written = []
    for step in range(0, 60, 10):
        before = store.shard_bytes
        result = save(store, step)
        written.append(store.shard_bytes - before)
        assert result.created and result.manifest.fingerprint == full_fingerprint(step)
    total = FROZEN.nbytes + CHANGING_BYTES
    assert written[0] == total  # nothing to reference yet
    assert written[1:] == [CHANGING_BYTES] * 5  # the frozen base is referenced, never rewritten
    for step in range(0, 60, 10):  # every checkpoint restores bit for bit, from wherever its bytes are
        arrays, manifest = restore(store, step)
        assert same(arrays, state_at(step, FROZEN)) and manifest.fingerprint == full_fingerprint(step)
    assert linked_shards(store, 50) and all("/000000000000/" in k for k in linked_shards(store, 50))  # never chained


def test_an_unchanged_state_references_everything_and_writes_nothing() -> None:
    store = CountingStore()
    save(store, 0)
    state = state_at(0, FROZEN)
    before = store.shard_bytes
    result = write_checkpoint(store, content(1), state, options=OPTIONS, block_bytes=BLOCK, incremental=True)
    assert store.shard_bytes == before and result.manifest.total_bytes == FROZEN.nbytes + CHANGING_BYTES
    arrays, _ = restore(store, 1)
    assert same(arrays, state)


def test_gc_keeps_every_referenced_block_and_deletes_the_unreferenced() -> None:
    store = CountingStore()
    for step in range(0, 120, 10):
        save(store, step)
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=3, grace_seconds=3600), now=time.time() + 3 * 3600)
    assert [r.step for r in plan.keep] == [90, 100, 110] and plan.referenced
    for step in (90, 100, 110):
        arrays, _ = restore(store, step)
        assert same(arrays, state_at(step, FROZEN))
    needed = set().union(*(linked_shards(store, s) for s in (90, 100, 110)))
    own = {k for k in shard_objects(store) if k.split("/")[2] in ("000000000090", "000000000100", "000000000110")}
    assert shard_objects(store) == needed | own  # step 0's frozen shards stay; every other shard is gone
    assert needed and all("/000000000000/" in k for k in needed)


@pytest.mark.parametrize("allowed", [0, 1, 2, 5, 9, 14, 20, 30])
def test_a_gc_killed_midway_never_deletes_a_referenced_block(allowed: int) -> None:
    """Step 10 wrote the frozen base; it is retired (not kept) while every kept checkpoint links
    it. A GC killed after any number of deletes leaves every kept checkpoint whole."""
    store = CrashingStore()
    for step in range(10, 130, 10):
        save(store, step)
    store.allowed = allowed
    policy = RetentionPolicy(keep_last=3, keep_every=50, grace_seconds=3600)
    with contextlib.suppress(E.StorageError):
        collect_garbage(store, RUN, policy, now=time.time() + 3 * 3600)
    kept = [50, 100, 110, 120]
    for step in kept:
        arrays, _ = restore(store, step)
        assert same(arrays, state_at(step, FROZEN))
    store.allowed = 10**9
    plan = collect_garbage(store, RUN, policy, now=time.time() + 3 * 3600)  # the rerun finishes the job
    assert [r.step for r in plan.keep] == kept
    for step in kept:
        arrays, _ = restore(store, step)
        assert same(arrays, state_at(step, FROZEN))
    steps = {k.split("/")[2] for k in shard_objects(store)}
    assert steps == {f"{s:012d}" for s in [10, *kept]}  # step 10: only its linked shards are left
    assert {k for k in shard_objects(store) if "/000000000010/" in k} == linked_shards(store, 120)


def test_a_save_racing_gc_is_protected_by_its_intent(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer knows step 0 (it committed it); another writer's full checkpoint at 10 is the
    latest; a GC keeping only the latest runs just before the save at 20 commits — after every
    check the save makes. Its intent keeps step 0's shards; the save at 20 restores."""
    store = CountingStore()
    save(store, 0)
    remembered = durable_blocks(store, RUN, "training")
    save(store, 10, FULL)  # another writer: a full checkpoint
    assert durable_blocks(store, RUN, "training") is remembered

    fired: list[object] = []
    real_put = store.put_if_absent

    def put_if_absent(key: str, data: bytes) -> bool:
        if key == manifest_key(RUN, "training", 20) and not fired:
            fired.append(
                collect_garbage(store, RUN, RetentionPolicy(keep_last=1, grace_seconds=3600), now=time.time() + 5)
            )
        return real_put(key, data)

    monkeypatch.setattr(store, "put_if_absent", put_if_absent)
    save(store, 20)
    assert fired and linked_shards(store, 20)
    raced = fired[0]
    assert isinstance(raced, GcPlan) and [r.step for r in raced.delete] == [0]
    assert set(raced.referenced) >= linked_shards(store, 20)  # held by the intent, not by a root yet
    arrays, _ = restore(store, 20)
    assert same(arrays, state_at(20, FROZEN))
    # Once the intent expires (two grace periods), the committed root's links protect the same shards.
    later = time.time() + 3 * 3600
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=1, grace_seconds=3600), now=later)
    assert plan.intents and not list(store.list(intents_prefix(RUN)))
    arrays, _ = restore(store, 20)
    assert same(arrays, state_at(20, FROZEN))


def test_a_save_whose_source_was_retired_writes_everything() -> None:
    """The writer remembers step 0, which GC has since retired (its manifest gone): nothing is
    referenced, even shards that are still there."""
    store = CountingStore()
    save(store, 0)
    save(store, 10, FULL)
    store.delete([manifest_key(RUN, "training", 0)])  # retired; its shards not collected yet
    before = store.shard_bytes
    save(store, 20)
    assert store.shard_bytes - before == FROZEN.nbytes + CHANGING_BYTES and not linked_shards(store, 20)


def test_a_step_committed_again_by_another_attempt_is_not_referenced(monkeypatch: pytest.MonkeyPatch) -> None:
    """The writer remembers attempt A of step 0; step 0 was retired and committed again by
    attempt B (a rollback re-training past it). A GC that listed the intents before the save at
    10 wrote its own deletes A's shards as orphans of B's step 0 just after that save's checks:
    the save must not link them (the manifest is there, but not A's)."""
    store = CountingStore()
    was = save(store, 0)
    first = durable_blocks(store, RUN, "training")
    assert first is not None
    store.delete([manifest_key(RUN, "training", 0)])  # retired ...
    again = save(store, 0, FULL)  # ... and committed again by another attempt: a full save
    assert again.created and again.manifest.writer.nonce != was.manifest.writer.nonce
    doomed = set(first.shard_bytes)
    fired: list[CommitResult] = []
    real_delete = store.delete

    def delete(keys: Iterable[str]) -> None:
        keys = list(keys)
        if not fired and doomed & set(keys):  # GC's orphan delete, its intents already listed
            fired.append(save(store, 10))
        real_delete(keys)

    monkeypatch.setattr(store, "delete", delete)
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=3, grace_seconds=3600), now=time.time() + 3 * 3600)
    assert fired and doomed <= set(plan.orphans) and not any(store.exists(k) for k in doomed)
    arrays, manifest = restore(store, 10)  # (before the fix: IntegrityError, a linked shard missing)
    assert same(arrays, state_at(10, FROZEN)) and manifest.fingerprint == full_fingerprint(10)
    assert not linked_shards(store, 10)


def test_without_its_intent_the_racing_save_would_be_torn(monkeypatch: pytest.MonkeyPatch) -> None:
    """The protocol's own fail-first: with intents switched off, the same race commits a
    checkpoint whose referenced shards GC has deleted."""
    monkeypatch.setattr("cairn.checkpoint.reuse.write_intents", lambda *a, **k: None)
    store = CountingStore()
    save(store, 0)
    save(store, 10, FULL)
    real_put = store.put_if_absent

    def put_if_absent(key: str, data: bytes) -> bool:
        if key == manifest_key(RUN, "training", 20):
            collect_garbage(store, RUN, RetentionPolicy(keep_last=1, grace_seconds=3600), now=time.time() + 5)
        return real_put(key, data)

    monkeypatch.setattr(store, "put_if_absent", put_if_absent)
    save(store, 20)
    with pytest.raises(E.IntegrityError, match="missing"):
        restore(store, 20)


def test_a_referenced_shard_deleted_before_the_save_is_rewritten() -> None:
    store = CountingStore()
    save(store, 0)
    victim = sorted(k for k in shard_objects(store))[0]
    store.delete([victim])
    before = store.shard_bytes
    save(store, 10)
    assert store.shard_bytes - before > CHANGING_BYTES  # the lost blocks were written again
    assert victim not in linked_shards(store, 10)
    arrays, _ = restore(store, 10)
    assert same(arrays, state_at(10, FROZEN))


def test_a_referenced_shard_deleted_while_the_save_writes_is_rewritten_not_torn() -> None:
    store = CountingStore()
    save(store, 0)
    victims = sorted(shard_objects(store))

    def delete_behind_the_back(key: str) -> None:
        if "/000000000010/" in key and key.endswith(".bin") and victims[0] in {o.key for o in store.list(RUN)}:
            store.delete([victims[0]])

    store.on_write = delete_behind_the_back
    before = store.shard_bytes
    save(store, 10)
    store.on_write = None
    assert store.shard_bytes - before > CHANGING_BYTES  # the lost shard's blocks, written after the rest
    assert victims[0] not in linked_shards(store, 10) and all(store.exists(k) for k in linked_shards(store, 10))
    arrays, _ = restore(store, 10)
    assert same(arrays, state_at(10, FROZEN))


def test_a_checkpoint_whose_index_points_outside_the_run_is_refused() -> None:
    store = CountingStore()
    save(store, 0)
    save(store, 10)
    for outside in (
        "other-run/training/000000000000/0123456789abcdef/rank000-0000.bin",  # another run
        "tune/journal/000000000000/0123456789abcdef/rank000-0000.bin",  # another kind
        "tune/training/000000000000/0123456789abcdef/rank000.index.json",  # not a shard
    ):
        copy = CountingStore(f"forged-{len(outside)}")
        for o in store.list(""):
            copy.write_object(o.key, [store.read(o.key, 1 << 30)])
        first = sorted(linked_shards(store, 10))[0]

        def forge(body: dict[str, Any], first: str = first, outside: str = outside) -> None:
            for s in body["linked"]:
                if s["key"] == first:
                    s["key"] = outside
            body["linked"].sort(key=lambda s: s["key"])
            for t in body["tensors"]:
                if t["shard"] == first:
                    t["shard"] = outside

        rewrite_rank_index(copy, CheckpointRef(copy.url, RUN, TRAINING, 10), 0, forge)
        rewrite_manifest(
            copy,
            CheckpointRef(copy.url, RUN, TRAINING, 10),
            lambda m, first=first, outside=outside: m["indexes"][0].update(
                linked=sorted(outside if k == first else k for k in m["indexes"][0]["linked"])
            ),
        )
        with pytest.raises(E.IntegrityError, match="outside this run's training checkpoints") as info:
            read_manifest(copy, CheckpointRef(copy.url, RUN, TRAINING, 10), expect_kind=TRAINING, options=FULL)
        assert "\n" not in str(info.value) and info.value.field == "indexes[0].linked"
    assert restore(store, 10)[0]  # the original is fine


def test_a_standalone_copy_needs_no_other_checkpoint() -> None:
    store = CountingStore()
    for step in (0, 10, 20):
        save(store, step)
    dest = MemoryStore("copy")
    result = copy_checkpoint(store, CheckpointRef(store.url, RUN, TRAINING, 20), dest, options=FULL)
    assert result.manifest.fingerprint == restore(store, 20)[1].fingerprint
    root = json.loads(dest.read(manifest_key(RUN, "training", 20), 1 << 30))
    assert all(not r.get("linked") for r in root["indexes"])
    assert {k.split("/")[2] for k in shard_objects(dest)} == {"000000000020"}
    arrays, _ = restore(dest, 20)
    assert same(arrays, state_at(20, FROZEN))


def test_a_retry_of_a_committed_step_converges_whatever_its_layout() -> None:
    """A worker without incremental saves committed step 10 (format v1); a retry with it on
    compares in the committed layout instead of reporting a conflict."""
    store = CountingStore()
    state = state_at(10, FROZEN)
    first = write_checkpoint(store, content(10), state, options=FULL)
    assert first.manifest.format_version == 1
    again = write_checkpoint(store, content(10), state, options=OPTIONS, block_bytes=BLOCK, incremental=True)
    assert not again.created and again.manifest.fingerprint == first.manifest.fingerprint
    other = dict(state, step=np.array([11], dtype=np.int64))
    with pytest.raises(E.CheckpointConflictError):
        write_checkpoint(store, content(10), other, options=OPTIONS, block_bytes=BLOCK, incremental=True)


def _race(loser_incremental: bool, winner_state: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch) -> Any:
    """Two attempts of step 10, one with incremental saves (v3), the other without (v1): the
    winner commits while the loser is about to; returns (store, winner, the loser's result)."""
    store = CountingStore()
    save(store, 0)  # something for the incremental attempt to reference

    def attempt(incremental: bool, state: dict[str, np.ndarray]) -> CommitResult:
        if incremental:
            return write_checkpoint(store, content(10), state, options=OPTIONS, block_bytes=BLOCK, incremental=True)
        return write_checkpoint(store, content(10), state, options=FULL)

    winners: list[CommitResult] = []
    real_put = store.put_if_absent
    raced: list[bool] = []

    def put_if_absent(key: str, data: bytes) -> bool:
        if key == manifest_key(RUN, "training", 10) and not raced:
            raced.append(True)
            winners.append(attempt(not loser_incremental, winner_state))
        return real_put(key, data)

    monkeypatch.setattr(store, "put_if_absent", put_if_absent)
    loser = attempt(loser_incremental, state_at(10, FROZEN))
    return store, winners[0], loser


@pytest.mark.parametrize("loser_incremental", [True, False])
def test_a_racing_commit_in_another_layout_converges(monkeypatch: pytest.MonkeyPatch, loser_incremental: bool) -> None:
    store, winner, loser = _race(loser_incremental, state_at(10, FROZEN), monkeypatch)
    assert winner.created and not loser.created and loser.manifest.fingerprint == winner.manifest.fingerprint
    assert winner.manifest.format_version == (1 if loser_incremental else 3)
    attempts = {o.key.split("/")[3] for o in store.list(f"{RUN}/training/000000000010/") if "/manifest" not in o.key}
    assert attempts == {winner.manifest.writer.nonce}  # the loser's own objects are gone
    arrays, _ = restore(store, 10)
    assert same(arrays, state_at(10, FROZEN))


@pytest.mark.parametrize("loser_incremental", [True, False])
def test_a_racing_commit_of_another_state_still_conflicts(
    monkeypatch: pytest.MonkeyPatch, loser_incremental: bool
) -> None:
    other = dict(state_at(10, FROZEN), step=np.array([11], dtype=np.int64))
    with pytest.raises(E.CheckpointConflictError, match="not deterministic"):
        _race(loser_incremental, other, monkeypatch)


def test_a_gang_rank_remembers_only_the_blocks_it_read() -> None:
    """The rank index covering this rank's blocks lists others too: only the blocks it read and
    verified are remembered (with the committed attempt's nonce)."""
    store = CountingStore()
    save(store, 0)
    forget_blocks(store, RUN, "training")
    ref0 = CheckpointRef(store.url, RUN, TRAINING, 0)
    root = read_manifest(store, ref0, expect_kind=TRAINING, options=FULL, expand_index=False)
    blocks = split_blocks(state_at(0, FROZEN), parts_of(state_at(0, FROZEN), BLOCK))
    targets = {name: np.empty_like(a) for name, a in blocks.items() if name.startswith("param/base")}
    assert 0 < len(targets) < len(blocks)
    read_blocks(SoloComm(), store, ref0, root, targets, value_check=None, options=OPTIONS)
    remembered = durable_blocks(store, RUN, "training")
    entries = read_manifest(store, ref0, expect_kind=TRAINING, options=FULL).tensors
    assert remembered is not None
    assert set(remembered.blocks) == {(t.checksum, t.dtype, t.length) for t in entries if t.name in targets}
    assert remembered.nonce == root.writer.nonce


def test_a_gang_rank_references_what_it_restored() -> None:
    """The coordinated save (one rank, ``SoloComm``) takes the same path: after a restore the
    rank references the blocks it read; after a save, those it committed."""
    store = CountingStore()
    save(store, 0)
    forget_blocks(store, RUN, "training")
    parts = parts_of(state_at(0, FROZEN), BLOCK)
    ref0 = CheckpointRef(store.url, RUN, TRAINING, 0)
    root = read_manifest(store, ref0, expect_kind=TRAINING, options=FULL, expand_index=False)
    blocks = split_blocks(state_at(0, FROZEN), parts)
    targets = {name: np.empty_like(a) for name, a in blocks.items()}
    read_blocks(SoloComm(), store, ref0, root, targets, value_check=None, options=OPTIONS)
    assert durable_blocks(store, RUN, "training") is not None
    for step in (10, 20):
        before = store.shard_bytes
        mine = split_blocks(state_at(step, FROZEN), parts)
        outcome = coordinated_save(SoloComm(), store, content(step), mine, parts, OPTIONS)
        assert outcome.created and store.shard_bytes - before == CHANGING_BYTES
        assert outcome.fingerprint == full_fingerprint(step)
        arrays, _ = restore(store, step)
        assert same(arrays, state_at(step, FROZEN))


def test_intents_are_flat_and_expire() -> None:
    store = MemoryStore()
    intents_module.write_intents(store, RUN, "0123456789abcdef", 0, [("training", 0, "fedcba9876543210")])
    keys = [o.key for o in store.list(intents_prefix(RUN))]
    assert len(keys) == 1 and keys[0].count("/") == 2
    live = intents_module.live_intents(store, RUN, 3600, time.time())
    assert live.protected == {f"{RUN}/training/000000000000/fedcba9876543210/"} and not live.expired
    assert intents_module.live_intents(store, RUN, 3600, time.time() + 3 * 3600).expired == keys


def test_an_intent_protects_for_two_grace_periods() -> None:
    """A pass that listed the run before a save committed needs the save's intent live when it
    lists intents: save time + pass time, each under the grace period, under two."""
    store = MemoryStore()
    intents_module.write_intents(store, RUN, "0123456789abcdef", 0, [("training", 0, "fedcba9876543210")])
    keys = [o.key for o in store.list(intents_prefix(RUN))]
    live = intents_module.live_intents(store, RUN, 3600, time.time() + 1.5 * 3600)
    assert live.protected and not live.expired
    assert intents_module.live_intents(store, RUN, 3600, time.time() + 2.5 * 3600).expired == keys
    save(store, 0)
    save(store, 10)
    policy = RetentionPolicy(keep_last=2, grace_seconds=3600)
    assert all(k not in collect_garbage(store, RUN, policy, now=time.time() + 1.5 * 3600).intents for k in keys)
    assert set(keys) <= set(collect_garbage(store, RUN, policy, now=time.time() + 2.5 * 3600).intents)
    assert not any(store.exists(k) for k in keys)


def test_write_rank_blocks_without_memory_is_a_full_write() -> None:
    store = CountingStore()
    forget_blocks(store, RUN, "training")
    blocks = split_blocks(state_at(0, FROZEN), parts_of(state_at(0, FROZEN), BLOCK))
    shards = write_rank_blocks(store, content(0), blocks, nonce="0123456789abcdef", options=OPTIONS)
    assert not shards.linked and store.shard_bytes == FROZEN.nbytes + CHANGING_BYTES


# -- a fine-tuning stage through the PyTorch adapter: init_from a finished run, the base frozen ----


class FrozenBaseOptions(TorchOptions):
    freeze: bool = False


FROZEN_BASE_BYTES = (32 * 256 + 256) * 4


class FrozenBase(TorchTrainer):
    """A base layer (8,448 parameters) and a head (514): stage 2 freezes the base."""

    Options = FrozenBaseOptions

    def build(self) -> TorchSetup:
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 32, generator=g)
        y = (x.sum(1) > 0).long()
        model = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Tanh(), torch.nn.Linear(256, 2))
        if self.options.freeze:
            model[0].requires_grad_(False)
        trainable = [p for p in model.parameters() if p.requires_grad]
        return TorchSetup(model=model, optimizer=torch.optim.AdamW(trainable, lr=1e-2), train=(x, y))


class CountingLocalStore(LocalStore):
    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.shard_bytes = 0

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        data = b"".join(bytes(memoryview(c).cast("B")) for c in chunks)
        super().write_object(key, [data], size=len(data))
        if key.endswith(".bin") and "/history/" not in key:
            self.shard_bytes += len(data)


def test_a_fine_tuning_stage_with_a_frozen_base_writes_only_what_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = CountingLocalStore(tmp_path / "store")
    factory = f"{__name__}:FrozenBase"
    body: dict[str, Any] = {"seed": 1, "batch_size": 8, "trainer": {"factory": factory, "options": {}}}
    base = TrainingSession.fresh("base", store, parse_config(body)).run(8)
    assert base is not None
    body["stage"] = "finetune"
    body["trainer"]["options"] = {"freeze": True}
    body["init_from"] = {"checkpoint": str(base.ref), "may_change": ["trainer"]}
    options = CheckpointOptions(incremental=True, block_bytes=1024)
    tune = TrainingSession.fresh("tune", store, parse_config(body), options=options)
    commits: list[tuple[CommitResult, int]] = []
    before = [store.shard_bytes]

    def committed(result: CommitResult) -> None:
        commits.append((result, store.shard_bytes - before[0]))
        before[0] = store.shard_bytes

    tune.run(40, checkpoint_every=10, on_checkpoint=committed)
    assert [r.ref.step for r, _ in commits] == [10, 20, 30, 40]
    previous: set[str] = set()
    for result, written in commits:
        manifest = read_manifest(store, result.ref, expect_kind=TRAINING, options=options)
        own = [t for t in manifest.tensors if t.shard.count("/") == 1]  # NONCE/rankRRR-NNNN.bin: its own
        linked = [t for t in manifest.tensors if t not in own]
        assert written == sum(t.length for t in own)  # the store saw exactly its own blocks
        if previous:  # after the first: only the changed blocks are written, the rest referenced
            assert all(t.checksum not in previous for t in own)
            assert all(t.checksum in previous for t in linked)
            frozen = [t for t in manifest.tensors if t.name.startswith("param/0.")]
            assert frozen and all(t in linked for t in frozen)
            assert written * 5 < manifest.total_bytes
        previous = {t.checksum for t in manifest.tensors}
    # Every checkpoint restores bit for bit, with the fingerprint of a full save of its state
    # (read at the run's block size: it sizes the bound on the blocks a checkpoint may list).
    reader = CheckpointOptions(block_bytes=1024)
    for result, _ in commits:
        state, manifest = load_training(store, result.ref, options=reader, trainer=tune.trainer)
        full = save_training(MemoryStore(f"full-{result.ref.step}"), "tune", state, options=options)
        assert full.manifest.fingerprint == manifest.fingerprint == result.manifest.fingerprint
    final, _ = load_training(store, commits[-1][0].ref, options=reader, trainer=tune.trainer)
    assert compare_states(final, tune.state) == []
    # GC keeps what the kept checkpoints reference; the CLI says what each wrote and references.
    collect_garbage(store, "tune", RetentionPolicy(keep_last=2, grace_seconds=3600), now=time.time() + 3 * 3600)
    last = str(commits[-1][0].ref)
    assert cli(["ckpt", "verify", last, "--config", str(_write(tmp_path / "c.json", body))]) == 0
    assert cli(["ckpt", "show", last]) == 0
    shown = capsys.readouterr().out
    assert "incremental  wrote " in shown and "(steps 10)" in shown
    assert cli(["ckpt", "show", last, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["written_bytes"] == commits[-1][1] and doc["referenced_bytes"] == doc["total_bytes"] - commits[-1][1]
    assert cli(["ckpt", "copy", last, str(tmp_path / "standalone"), "--json"]) == 0
    copied = json.loads(capsys.readouterr().out)
    assert copied["fingerprint"] == commits[-1][0].manifest.fingerprint
    config = str(_write(tmp_path / "c.json", body))
    assert cli(["ckpt", "export", last, str(tmp_path / "weights"), "--format", "safetensors", "--config", config]) == 0
    assert (tmp_path / "weights" / "weights-only.safetensors").stat().st_size > FROZEN_BASE_BYTES
    capsys.readouterr()
    shutil.rmtree(tmp_path / "store")  # the copy needs nothing of the source store
    ref = CheckpointRef.parse(copied["copy"])
    alone, _ = load_training(
        LocalStore(tmp_path / "standalone"), ref, options=CheckpointOptions(block_bytes=1024), trainer=tune.trainer
    )
    assert compare_states(alone, tune.state) == []


def test_ckpt_show_prints_the_incremental_line_only_when_something_is_referenced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = LocalStore(tmp_path / "store")
    plain = write_checkpoint(store, content(0), state_at(0, FROZEN), options=FULL, block_bytes=BLOCK)  # v3, full
    assert plain.manifest.format_version == 3
    assert cli(["ckpt", "show", str(plain.ref)]) == 0
    assert "incremental" not in capsys.readouterr().out
    assert cli(["ckpt", "show", str(plain.ref), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["written_bytes"] == doc["total_bytes"] and doc["referenced_bytes"] == 0
    write_checkpoint(store, content(5), state_at(5, FROZEN), options=OPTIONS, block_bytes=BLOCK, incremental=True)
    linked = write_checkpoint(
        store, content(10), state_at(10, FROZEN), options=OPTIONS, block_bytes=BLOCK, incremental=True
    )
    assert cli(["ckpt", "show", str(linked.ref)]) == 0
    assert "shard(s) of other checkpoints of the run (steps 5)" in capsys.readouterr().out


def _write(path: Path, body: dict[str, Any]) -> Path:
    path.write_text(json.dumps(body))
    return path


def test_a_gang_rank_saves_incrementally_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``CAIRN_INCREMENTAL=1`` reaches a gang rank (``CheckpointOptions.from_env``): the ZeRO
    engine's coordinated saves take the incremental path and keep the single process's bits."""
    monkeypatch.setenv("CAIRN_INCREMENTAL", "1")
    calls: list[int] = []

    def spy(*args: Any, **kw: Any) -> Any:
        calls.append(kw["rank"])
        return write_rank_blocks(*args, **kw)

    monkeypatch.setattr("cairn.distributed.checkpoint.write_rank_blocks", spy)
    config = dist_config()
    plain = TrainingSession.fresh("r", LocalStore(tmp_path / "plain"), config, options=CheckpointOptions())
    plain.run(12, checkpoint_every=4)
    job = GangJob(run_id="r", store=str(tmp_path / "zero"), config=config, target_step=8, checkpoint_every=4)
    run_rank(SoloComm(), job, tmp_path / "w")
    store = LocalStore(tmp_path / "zero")
    assert durable_blocks(store, "r", "training") is None  # another store object: nothing shared
    second = run_rank(SoloComm(), job.model_copy(update={"target_step": 12}), tmp_path / "w")
    assert plain.last_commit is not None and second.fingerprint == plain.last_commit.manifest.fingerprint
    assert len(calls) >= 3  # every periodic save of both segments
    monkeypatch.setenv("CAIRN_INCREMENTAL", "maybe")
    with pytest.raises(E.ConfigError, match="CAIRN_INCREMENTAL"):
        CheckpointOptions.from_env()
