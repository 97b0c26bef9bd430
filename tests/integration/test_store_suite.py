"""One suite, every store: local disk and a real SeaweedFS server over S3."""

from __future__ import annotations

import json
import threading
import tracemalloc
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointKind, CheckpointOptions, latest_committed, list_checkpoints
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage, pin, plan_gc
from cairn.config import TrainConfig
from cairn.session import TrainingSession
from cairn.stores.base import Store
from cairn.training import load_training, save_training
from cairn.training.async_save import AsyncCheckpointer
from tests.conftest import small_config

pytestmark = pytest.mark.integration
MiB = 1 << 20


def test_object_basics(any_store: Store) -> None:
    any_store.write_object("a/b/one.bin", [b"hello ", memoryview(b"world")])
    assert any_store.read("a/b/one.bin", 1 << 30) == b"hello world"
    assert any_store.size("a/b/one.bin") == 11
    out = bytearray(5)
    any_store.read_into("a/b/one.bin", 6, memoryview(out))
    assert bytes(out) == b"world"
    assert {o.key for o in any_store.list("a/")} == {"a/b/one.bin"}
    assert any_store.exists("a/b/one.bin") and not any_store.exists("a/b/two.bin")
    with pytest.raises(E.ObjectNotFoundError):
        any_store.read("a/b/two.bin", 1 << 30)
    any_store.delete(["a/b/one.bin", "a/b/missing.bin"])
    assert list(any_store.list("a/")) == []


def test_a_read_states_its_bound_and_an_object_over_it_is_refused_unread(any_store: Store) -> None:
    """Every store refuses an object larger than the reader's bound from its size (stat, the GET's
    Content-Length), before its bytes are read: 16 MiB planted, a 4 KiB bound, memory stays small."""
    any_store.write_object("big/latest.json", [b"\0" * (16 * MiB)], size=16 * MiB)
    any_store.write_object("big/exact.json", [b"x" * 4096], size=4096)
    assert any_store.read("big/exact.json", 4096) == b"x" * 4096  # exactly the bound: read
    tracemalloc.start()
    try:
        with pytest.raises(E.SizeLimitError) as info:
            any_store.read("big/latest.json", 4096)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MiB, f"peak {peak} bytes: the object was read"  # read whole, it would be 16 MiB
    assert info.value.field == "big/latest.json" and str(16 * MiB) in str(info.value)
    with pytest.raises(E.SizeLimitError):
        any_store.read("big/exact.json", 4095)


def test_large_object_streams_and_ranges(any_store: Store) -> None:
    data = np.random.default_rng(1).integers(0, 256, size=13 * MiB + 12345, dtype=np.uint8)
    view = memoryview(data)
    chunks = [view[i : i + 3 * MiB] for i in range(0, len(view), 3 * MiB)]
    any_store.write_object("big/obj.bin", chunks, size=data.nbytes)
    assert any_store.size("big/obj.bin") == data.nbytes
    whole = np.empty_like(data)
    any_store.read_into("big/obj.bin", 0, memoryview(whole))
    assert np.array_equal(whole, data)
    part = np.empty(6 * MiB, dtype=np.uint8)  # crosses part boundaries
    any_store.read_into("big/obj.bin", 4 * MiB + 7, memoryview(part))
    assert np.array_equal(part, data[4 * MiB + 7 : 10 * MiB + 7])


def test_put_if_absent(any_store: Store) -> None:
    assert any_store.put_if_absent("c/manifest.json", b"first") is True
    assert any_store.put_if_absent("c/manifest.json", b"second") is False
    assert any_store.read("c/manifest.json", 1 << 30) == b"first"


def test_training_round_trip_and_latest(any_store: Store, config: TrainConfig) -> None:
    session = TrainingSession.fresh("rt", any_store, config)
    session.run(12, checkpoint_every=5)
    assert [r.step for r in list_checkpoints(any_store, "rt")] == [5, 10, 12]
    ref = latest_committed(any_store, "rt")
    assert ref is not None and ref.step == 12
    state, _ = load_training(any_store, ref)
    assert compare_states(state, session.state) == []


class _Faulty:
    """A store whose named operations fail (e.g. the commit: the writer 'dies' after its shards)."""

    def __init__(self, inner: Store, failing: str) -> None:
        self.inner = inner
        self.failing = failing

    def __getattr__(self, name: str) -> Any:
        if name == self.failing:
            raise E.StorageError(f"injected: {name} fails")
        return getattr(self.inner, name)

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def save_target(self, run_id: str, nbytes: int) -> Any:
        return self  # saves go through the faults (the inner store would answer itself)


def test_torn_checkpoint_is_invisible_and_collected(any_store: Store, config: TrainConfig) -> None:
    session = TrainingSession.fresh("torn", any_store, config)
    session.run(4)
    session.run(3, checkpoint_at_end=False)
    with pytest.raises(E.StorageError):
        save_training(_Faulty(any_store, "put_if_absent"), "torn", session.state)  # type: ignore[arg-type]
    assert any(o.key.startswith("torn/training/000000000007/") for o in any_store.list("torn/"))
    ref = latest_committed(any_store, "torn")
    assert ref is not None and ref.step == 4  # the half-written step 7 does not exist for readers
    with pytest.raises(E.CheckpointNotFoundError):
        load_training(any_store, ref.__class__(ref.store_url, "torn", CheckpointKind.TRAINING, 7))
    # Within the grace period it may still be being written: kept.
    assert plan_gc(any_store, "torn", RetentionPolicy(grace_seconds=3600)).orphans == []
    plan = collect_garbage(any_store, "torn", RetentionPolicy(grace_seconds=0), now=None)
    assert plan.orphans and all(k.startswith("torn/training/000000000007/") for k in plan.orphans)
    assert not any(o.key.startswith("torn/training/000000000007/") for o in any_store.list("torn/"))
    assert latest_committed(any_store, "torn") == ref


def _fresh_store_like(store: Store) -> Store:
    """A second client on the same location, as a separate worker would have."""
    from cairn.stores import LocalStore
    from cairn.stores.s3 import S3Store

    if isinstance(store, S3Store):
        return S3Store(store.bucket, store.prefix, client=store.client)
    assert isinstance(store, LocalStore)
    return LocalStore(store.root)


def test_racing_identical_writers_commit_once(any_store: Store, config: TrainConfig) -> None:
    session = TrainingSession.fresh("race", any_store, config)
    session.run(6, checkpoint_at_end=False)
    barrier = threading.Barrier(6)

    def writer(_: int) -> Any:
        store = _fresh_store_like(any_store)
        barrier.wait()
        return save_training(store, "race", session.state)

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(writer, range(6)))
    assert sum(r.created for r in results) == 1
    assert len({r.manifest.fingerprint for r in results}) == 1
    manifests = [o for o in any_store.list("race/") if o.key.endswith("manifest.json")]
    assert len(manifests) == 1


def test_racing_different_writers_success_or_conflict(any_store: Store) -> None:
    """Stale writers with different content: exactly one manifest; everyone else conflicts."""
    states = []
    for lr in (0.01, 0.02, 0.03, 0.04, 0.05):
        s = TrainingSession.fresh("diverge", any_store, small_config(optimizer={"lr": lr}))
        s.run(3, checkpoint_at_end=False)
        states.append(s.state)
    barrier = threading.Barrier(len(states))

    def writer(state: Any) -> Any:
        store = _fresh_store_like(any_store)
        barrier.wait()
        try:
            return save_training(store, "diverge", state)
        except E.CheckpointConflictError as exc:
            return exc

    with ThreadPoolExecutor(len(states)) as pool:
        outcomes = list(pool.map(writer, states))
    winners = [o for o in outcomes if not isinstance(o, Exception)]
    conflicts = [o for o in outcomes if isinstance(o, E.CheckpointConflictError)]
    assert len(winners) == 1 and len(conflicts) == len(states) - 1
    manifests = [o for o in any_store.list("diverge/") if o.key.endswith("manifest.json")]
    assert len(manifests) == 1
    committed = json.loads(any_store.read(manifests[0].key, 1 << 30))
    assert committed["fingerprint"] == winners[0].manifest.fingerprint
    assert all(c.expected == committed["fingerprint"] for c in conflicts)
    # Losers removed their own shards; only the winner's remain. (Their history segments are
    # run-level and content-addressed — another checkpoint may share them — so retention
    # collects them once no kept checkpoint refers to them.)
    shards = {o.key.split("/")[3] for o in any_store.list("diverge/training/") if o.key.endswith(".bin")}
    assert shards == {winners[0].manifest.writer.nonce}


def test_async_save_snapshots_before_returning(any_store: Store, config: TrainConfig) -> None:
    session = TrainingSession.fresh("async", any_store, config)
    session.run(5, checkpoint_at_end=False)
    expected = session.state.copy()
    saver = AsyncCheckpointer(any_store, "async", options=CheckpointOptions.from_env())
    handle = saver.save_async(session.state)
    # The trainer mutates its arrays right after the call...
    for arr in [*session.state.params.values(), *session.state.m.values()]:
        arr[...] = 123.0
    session.state.history["loss"].append(9.9)
    result = handle.result(timeout=60)
    saver.close()
    state, _ = load_training(any_store, result.ref)
    # ...and what was saved is the state at the call.
    assert compare_states(state, expected) == []


def test_failed_async_save_is_reported_and_never_advances_latest(any_store: Store, config: TrainConfig) -> None:
    session = TrainingSession.fresh("afail", any_store, config)
    session.run(2)
    session.run(2, checkpoint_at_end=False)
    saver = AsyncCheckpointer(_Faulty(any_store, "write_object"), "afail", options=CheckpointOptions.from_env())  # type: ignore[arg-type]
    handle = saver.save_async(session.state)
    with pytest.raises(E.StorageError):
        handle.result(timeout=60)
    with pytest.raises(E.StorageError, match="background checkpoint save failed"):
        saver.save_async(session.state)
    saver.close()
    ref = latest_committed(any_store, "afail")
    assert ref is not None and ref.step == 2


def test_session_async_mode_matches_sync(any_store: Store, config: TrainConfig) -> None:
    a = TrainingSession.fresh("amode", any_store, config)
    a.run(20, checkpoint_every=4, async_save=True)
    b = TrainingSession.fresh("smode", any_store, config)
    b.run(20, checkpoint_every=4)
    assert [r.step for r in list_checkpoints(any_store, "amode")] == [4, 8, 12, 16, 20]
    ra, rb = latest_committed(any_store, "amode"), latest_committed(any_store, "smode")
    assert ra and rb
    sa, ma = load_training(any_store, ra)
    sb, mb = load_training(any_store, rb)
    assert ma.fingerprint == mb.fingerprint and compare_states(sa, sb) == []
    assert ma.lineage and mb.lineage and ma.lineage.parent == mb.lineage.parent


def test_retention_keeps_last_pinned_and_latest(any_store: Store, config: TrainConfig) -> None:
    session = TrainingSession.fresh("ret", any_store, config)
    session.run(20, checkpoint_every=2)
    refs = list_checkpoints(any_store, "ret")
    pin(any_store, refs[1], "best")  # step 4
    policy = RetentionPolicy(keep_last=3, keep_every=10, grace_seconds=0)
    dry = collect_garbage(any_store, "ret", policy, dry_run=True)
    assert len(list_checkpoints(any_store, "ret")) == 10  # dry run deleted nothing
    plan = collect_garbage(any_store, "ret", policy)
    assert [r.step for r in plan.keep] == [r.step for r in dry.keep] == [4, 10, 16, 18, 20]
    assert [r.step for r in list_checkpoints(any_store, "ret")] == [4, 10, 16, 18, 20]
    assert plan.deleted_bytes > 0
    # Latest is never deleted, whatever the policy.
    collect_garbage(any_store, "ret", RetentionPolicy(keep_last=1, grace_seconds=0))
    remaining = [r.step for r in list_checkpoints(any_store, "ret")]
    assert 20 in remaining and 4 in remaining
