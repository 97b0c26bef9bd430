"""History segments (``cairn.checkpoint.history``): a save writes only what is new since the last
checkpoint, a checkpoint restores bit-exactly with its full history, forged or damaged refs are
refused before anything is allocated, retention keeps what kept checkpoints need, and
checkpoints written before segments (history as tensors) still restore."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import history as H
from cairn.checkpoint import write_checkpoint
from cairn.checkpoint.committed import list_checkpoints
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.layout import history_prefix, manifest_key, parse_checkpoint_key
from cairn.checkpoint.manifest import HistoryRef, HistorySegment, HistorySeries
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage
from cairn.checkpoint.training import training_content, training_tensors
from cairn.session import TrainingSession
from cairn.state import TrainState
from cairn.stores import LocalStore, MemoryStore
from cairn.stores.base import Chunk
from cairn.trainers.base import Trainer, check_finite
from cairn.trainers.loading import load_trainer
from cairn.training.manager import load_training, save_training
from tests.conftest import refused_within_bounds, rewrite_manifest, small_config

RUN = "hist"


class CountingStore(MemoryStore):
    """The in-memory double, counting the bytes written under each key (no patching)."""

    def __init__(self, name: str = "counting") -> None:
        super().__init__(name)
        self.written: dict[str, int] = {}

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        data = [bytes(memoryview(c).cast("B")) for c in chunks]
        self.written[key] = self.written.get(key, 0) + sum(len(d) for d in data)
        super().write_object(key, data, size)

    def history_bytes(self, run_id: str = RUN) -> int:
        return sum(n for k, n in self.written.items() if k.startswith(history_prefix(run_id)))


def base_state() -> tuple[TrainState, Trainer]:
    config = small_config()
    return TrainingSession.fresh(RUN, MemoryStore("base"), config).state, load_trainer(config)


def state_at(base: TrainState, step: int, history: dict[str, np.ndarray]) -> TrainState:
    """``base``'s arrays as a valid state at ``step`` with ``step`` history entries per key."""
    return dataclasses.replace(
        base,
        step=step,
        cursor=step * base.config.batch_size,
        history={k: v[:step].tolist() for k, v in history.items()},
    )


def random_history(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"loss": rng.standard_normal(n) * 10.0 ** rng.integers(-300, 300, n), "lr": rng.random(n)}


def committed(store: MemoryStore, ref: HistoryRef, step: int) -> None:
    """As a commit at ``step`` leaves it: a commit marker, and the process remembers ``ref``."""
    store.put_if_absent(manifest_key(RUN, "training", step), b"{}")
    H.remember(store, RUN, ref, step)


def bits(values: list[float]) -> bytes:
    return np.asarray(values, dtype="<f8").tobytes()


def test_the_save_at_a_million_steps_writes_only_the_thousand_new_entries() -> None:
    base, trainer = base_state()
    history = random_history(1_000_000)
    store = CountingStore()
    save_training(store, RUN, state_at(base, 999_000, history))
    first = store.history_bytes()
    assert first == 2 * 999_000 * 8  # a process that knew no segment yet writes them all, once
    store.written.clear()
    state = state_at(base, 1_000_000, history)
    result = save_training(store, RUN, state)
    # Per key: the block of 4,096 that completed at 999,424, two blocks of 256 and a tail of 64 —
    # the 1,000 new entries and what completed with them, never the 999,000 before.
    assert store.history_bytes() == 2 * (4096 + 2 * 256 + 64) * 8
    assert store.history_bytes() <= 2 * (1_000 + H.HISTORY_CHUNK // 16 + H.HISTORY_CHUNK // 256) * 8
    shards = sum(n for k, n in store.written.items() if k.startswith(result.ref.prefix + "/"))
    assert shards == result.manifest.total_bytes  # the state's tensors, no history among them
    assert result.manifest.history is not None
    for series in result.manifest.history.series.values():
        assert [(s.start, s.end) for s in series.segments] == H.segment_ranges(1_000_000, H.HISTORY_CHUNK)
        assert len(series.segments) == 15 + 4 + 2 + 1

    restored, _ = load_training(store, result.ref, trainer=trainer)
    assert compare_states(restored, state) == []
    for key in ("loss", "lr"):
        assert bits(restored.history[key]) == history[key].tobytes()
    # The full-history reference: the same state written as before, history as tensors.
    old_store = MemoryStore("legacy")
    legacy = write_checkpoint(old_store, training_content(RUN, state), training_tensors(state))
    assert legacy.manifest.history is None and legacy.manifest.fingerprint == result.manifest.fingerprint
    reference, _ = load_training(old_store, legacy.ref, trainer=trainer)
    assert compare_states(restored, reference) == []
    assert all(bits(restored.history[k]) == bits(reference.history[k]) for k in ("loss", "lr"))


def test_old_checkpoints_with_history_tensors_restore_and_the_next_save_writes_segments() -> None:
    base, trainer = base_state()
    history = random_history(300, seed=1)
    store = CountingStore()
    state = state_at(base, 300, history)
    old = write_checkpoint(store, training_content(RUN, state), training_tensors(state))
    assert old.manifest.history is None and any(t.name == "history/loss" for t in old.manifest.tensors)
    session = TrainingSession(RUN, store, base.copy(), trainer)
    session.restore(old.ref)
    assert compare_states(session.state, state) == [] and bits(session.state.history["loss"]) == bits(
        state.history["loss"]
    )
    store.written.clear()
    session.state = state_at(base, 301, random_history(301, seed=1))
    new = session.checkpoint()
    assert new.manifest.history is not None and store.history_bytes() == 2 * 301 * 8
    restored, _ = load_training(store, new.ref, trainer=trainer)
    assert compare_states(restored, session.state) == []


def test_blocks_are_written_once_when_complete_and_only_the_tail_every_save(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(H, "HISTORY_CHUNK", 1024)  # levels of 1024, 64 and 4 entries
    values = random_history(6000, seed=2)["loss"]
    store = CountingStore()
    written = 0
    for n in range(0, 6001, 100):
        store.written.clear()
        ref = H.write_history(store, RUN, {"loss": values[:n].tolist()})
        committed(store, ref, n)
        segments = ref.series["loss"].segments
        assert [(s.start, s.end) for s in segments] == H.segment_ranges(n, 1024)
        assert len(segments) <= n // 1024 + H.MAX_BELOW_CHUNK
        new = store.history_bytes() // 8
        assert new <= 100 + 4 + (1024 if n % 1024 < 100 else 0) + (64 if n % 64 < 100 else 0)
        written += new
    assert written <= 3 * 6000 + 61 * 4  # each entry about once per level, plus every save's short tail
    back = H.read_history(store, RUN, ref)
    assert bits(back["loss"]) == values.tobytes()


def test_a_rollback_rewrites_the_blocks_whose_values_changed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(H, "HISTORY_CHUNK", 1024)
    values = random_history(5000, seed=3)["loss"]
    store = CountingStore()
    committed(store, H.write_history(store, RUN, {"loss": values[:4000].tolist()}), 4000)
    other = values.copy()
    other[1500] = 1.5  # another lineage from entry 1500 on
    store.written.clear()
    ref = H.write_history(store, RUN, {"loss": other.tolist()})
    rewritten = {
        (s.start, s.end) for s in ref.series["loss"].segments if H.segment_key(RUN, "loss", s) in store.written
    }
    assert (1024, 2048) in rewritten and (0, 1024) not in rewritten and (2048, 3072) not in rewritten
    assert bits(H.read_history(store, RUN, ref)["loss"]) == other.tobytes()


def test_blocks_of_a_checkpoint_that_is_gone_are_written_again() -> None:
    values = random_history(900, seed=4)["loss"]
    store = CountingStore()
    first = H.write_history(store, RUN, {"loss": values[:500].tolist()})
    committed(store, first, 500)
    store.delete([manifest_key(RUN, "training", 500)])  # collected (uncommitted first), or deleted by hand
    store.delete([H.segment_key(RUN, "loss", s) for s in first.series["loss"].segments])
    store.written.clear()
    ref = H.write_history(store, RUN, {"loss": values.tolist()})
    assert store.history_bytes() == 900 * 8
    assert bits(H.read_history(store, RUN, ref)["loss"]) == values.tobytes()


def test_two_stores_with_one_url_never_lend_each_other_segments() -> None:
    values = random_history(100, seed=5)["loss"].tolist()
    one, two = CountingStore("same"), CountingStore("same")
    ref = H.write_history(one, RUN, {"loss": values})
    committed(one, ref, 100)
    two.put_if_absent(manifest_key(RUN, "training", 100), b"{}")
    ref = H.write_history(two, RUN, {"loss": values})
    assert two.history_bytes() == 100 * 8 and H.read_history(two, RUN, ref)["loss"] == values


def test_segment_keys_are_never_taken_for_checkpoints() -> None:
    base, _ = base_state()
    store = MemoryStore()
    result = save_training(store, RUN, state_at(base, 10, random_history(10)))
    keys = [o.key for o in store.list(history_prefix(RUN))]
    assert keys and all(parse_checkpoint_key(k) is None for k in keys)
    assert list_checkpoints(store, RUN) == [result.ref]


def test_a_new_segment_is_value_checked_before_anything_is_written() -> None:
    store = CountingStore()
    with pytest.raises(E.NonFiniteError):
        H.write_history(store, RUN, {"loss": [1.0, float("nan")]}, value_check=check_finite)
    assert store.history_bytes() == 0


# -- damaged and forged refs -----------------------------------------------------------------------


def trained(tmp_path: Path, steps: int = 50) -> tuple[TrainingSession, CheckpointRef]:
    session = TrainingSession.fresh(RUN, LocalStore(tmp_path / "s"), small_config())
    result = session.run(steps)
    assert result is not None and result.manifest.history is not None
    return session, result.ref


def test_a_corrupted_or_missing_segment_is_refused_and_the_run_is_untouched(tmp_path: Path) -> None:
    session, ref = trained(tmp_path)
    store = session.store
    assert isinstance(store, LocalStore)
    before = session.state.copy()
    seg = next(o.key for o in store.list(history_prefix(RUN)) if "/loss/" in o.key)
    path = store.root / seg
    data = bytearray(path.read_bytes())
    data[3] ^= 0x01
    path.chmod(0o644)
    path.write_bytes(bytes(data))
    with pytest.raises(E.IntegrityError) as info:
        session.restore(ref)
    assert info.value.field is not None and info.value.field.startswith("history.series[loss].segments[")
    assert compare_states(session.state, before) == []
    path.unlink()
    with pytest.raises(E.IntegrityError) as info:
        session.restore(ref)
    assert "missing" in str(info.value) and compare_states(session.state, before) == []


def test_verify_checks_every_segment_one_at_a_time(tmp_path: Path) -> None:
    session, ref = trained(tmp_path)
    manifest = read_manifest(session.store, ref, expect_kind=None)
    assert manifest.history is not None
    H.verify_history(session.store, RUN, manifest.history, value_check=check_finite)
    seg = next(o.key for o in session.store.list(history_prefix(RUN)) if "/lr/" in o.key)
    session.store.delete([seg])
    with pytest.raises(E.IntegrityError):
        H.verify_history(session.store, RUN, manifest.history)


def _forge(mutate: Any) -> Any:
    def edit(body: dict[str, Any]) -> None:
        mutate(body["history"]["series"]["loss"])

    return edit


@pytest.mark.parametrize(
    ("case", "mutate", "error"),
    [
        ("gap", lambda s: s["segments"][-1].update(start=s["segments"][-1]["start"] + 1), E.ManifestError),
        ("overlap", lambda s: s["segments"].append({**s["segments"][-1]}), E.ManifestError),
        ("empty", lambda s: s["segments"][-1].update(start=s["segments"][-1]["end"]), E.ManifestError),
        ("short", lambda s: s.update(length=s["length"] - 1), E.InvariantError),
        ("huge", lambda s: s.update(length=10**15), E.InvariantError),
    ],
)
def test_a_forged_ref_is_refused_before_anything_is_allocated(
    tmp_path: Path, case: str, mutate: Any, error: type[E.CairnError]
) -> None:
    session, ref = trained(tmp_path)
    rewrite_manifest(session.store, ref, _forge(mutate))  # re-fingerprinted: the ref's own checks fire
    before = session.state.copy()
    exc = refused_within_bounds(lambda: session.restore(ref), error)
    assert "history" in str(exc.field), case
    assert compare_states(session.state, before) == []


def test_a_ref_claiming_ten_to_the_fifteen_entries_is_refused_by_its_size_alone() -> None:
    seg = HistorySegment(start=0, end=10**15, checksum="blake3:" + "0" * 64)
    ref = HistoryRef(chunk=1 << 16, series={"loss": HistorySeries(length=10**15, digest=seg.checksum, segments=[seg])})
    refused_within_bounds(lambda: H.read_history(MemoryStore(), RUN, ref), E.SizeLimitError)
    many = [HistorySegment(start=i, end=i + 1, checksum=seg.checksum) for i in range(100)]
    ref = HistoryRef(chunk=1 << 16, series={"loss": HistorySeries(length=100, digest=seg.checksum, segments=many)})
    refused_within_bounds(lambda: H.read_history(MemoryStore(), RUN, ref), E.SizeLimitError)


# -- retention --------------------------------------------------------------------------------------


class CrashingStore(MemoryStore):
    """Deletes ``allowed`` keys, then fails (a GC process killed mid-way)."""

    def __init__(self, allowed: int) -> None:
        super().__init__("crashing")
        self.allowed = allowed

    def delete(self, keys: Iterable[str]) -> None:
        for key in list(keys):
            if self.allowed <= 0:
                raise E.StorageError("killed mid-GC")
            self.allowed -= 1
            super().delete([key])


def saved_run(store: MemoryStore, monkeypatch: pytest.MonkeyPatch) -> tuple[list[TrainState], list[CheckpointRef]]:
    monkeypatch.setattr(H, "HISTORY_CHUNK", 1024)
    base, _ = base_state()
    history = random_history(4000, seed=6)
    states = [state_at(base, n, history) for n in (900, 1500, 2100, 2600, 3300, 4000)]
    return states, [save_training(store, RUN, s).ref for s in states]


def test_gc_keeps_referenced_segments_and_deletes_unreferenced_old_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    states, refs = saved_run(store, monkeypatch)
    stray = H.write_history(store, RUN, {"loss": [1.0, 2.0, 3.0]})  # an in-flight save's fresh segments
    segments = {o.key for o in store.list(history_prefix(RUN))}
    policy = RetentionPolicy(keep_last=2, grace_seconds=3600)
    young = collect_garbage(store, RUN, policy)  # everything is younger than the grace period
    assert young.segments == [] and {o.key for o in store.list(history_prefix(RUN))} == segments
    plan = collect_garbage(store, RUN, policy, now=time.time() + 7200)
    left = {o.key for o in store.list(history_prefix(RUN))}
    needed = set().union(*(H.history_ref_keys(RUN, s) for s in _refs(store, refs[-2:])))
    assert needed <= left and plan.segments and not (set(plan.segments) & needed)
    assert H.history_ref_keys(RUN, stray).isdisjoint(left)  # unreferenced and past the grace period
    for ref, state in zip(refs[-2:], states[-2:], strict=True):
        restored, _ = load_training(store, ref, trainer=load_trainer(state.config))
        assert compare_states(restored, state) == []


def _refs(store: MemoryStore, refs: list[CheckpointRef]) -> list[HistoryRef]:
    out = []
    for ref in refs:
        body = json.loads(store.read(f"{ref.prefix}/manifest.json", 1 << 30))
        out.append(HistoryRef.model_validate(body["history"]))
    return out


@pytest.mark.parametrize("allowed", [0, 1, 3, 6, 10, 20])
def test_a_gc_killed_midway_never_takes_what_a_kept_checkpoint_needs(
    monkeypatch: pytest.MonkeyPatch, allowed: int
) -> None:
    store = CrashingStore(allowed=10**9)
    states, refs = saved_run(store, monkeypatch)
    store.allowed = allowed
    later = time.time() + 7200
    policy = RetentionPolicy(keep_last=2, grace_seconds=3600)
    with contextlib.suppress(E.StorageError):
        collect_garbage(store, RUN, policy, now=later)
    for ref, state in zip(refs[-2:], states[-2:], strict=True):  # the kept ones restore, whatever was deleted
        restored, _ = load_training(store, ref, trainer=load_trainer(state.config))
        assert compare_states(restored, state) == []
    store.allowed = 10**9
    collect_garbage(store, RUN, policy, now=later)  # the rerun finishes the job
    left = {o.key for o in store.list(history_prefix(RUN))}
    assert left == set().union(*(H.history_ref_keys(RUN, r) for r in _refs(store, refs[-2:])))


def test_a_save_after_its_restored_checkpoint_was_collected_is_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    states, refs = saved_run(store, monkeypatch)
    trainer = load_trainer(states[0].config)
    load_training(store, refs[0], trainer=trainer)  # a rollback: this process now builds on step 900
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=2, grace_seconds=3600), now=time.time() + 7200)
    assert refs[0] in plan.delete and plan.segments  # the blocks only step 900 referred to are gone
    base, _ = base_state()
    again = state_at(base, 1000, random_history(4000, seed=6))
    result = save_training(store, RUN, again)
    restored, _ = load_training(store, result.ref, trainer=trainer)
    assert compare_states(restored, again) == []


def test_gc_deletes_no_segment_while_a_kept_manifest_is_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    store = MemoryStore()
    _, refs = saved_run(store, monkeypatch)
    store.corrupt(f"{refs[-1].prefix}/manifest.json", b"{not json")
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=2, grace_seconds=0), now=time.time() + 10)
    assert plan.segments == []
