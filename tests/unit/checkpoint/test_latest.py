"""``latest`` in constant time (``cairn.checkpoint.latest``): with the advisory pointer, finding
the latest committed checkpoint of a 10,000-checkpoint run takes O(1) store calls; a pointer
that is missing, corrupt, behind or ahead of the store (its checkpoint deleted) never changes
the answer, which these cases would catch in a pointer trusted blindly."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointContent, CheckpointKind, CheckpointRef, write_checkpoint
from cairn.checkpoint import latest_committed as package_latest
from cairn.checkpoint.committed import list_checkpoints
from cairn.checkpoint.latest import LatestPointer, advance_latest, latest_committed, latest_cursor, read_latest
from cairn.checkpoint.layout import checkpoint_prefix, latest_key, manifest_key, parse_checkpoint_key
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.retention import RetentionPolicy, collect_garbage
from cairn.stores import LocalStore, MemoryStore
from cairn.stores.base import Chunk, ObjectInfo, Store
from tests.conftest import stamped_manifest

RUN = "big"
TRAINING = CheckpointKind.TRAINING
MANY = 10_000


class CountingStore(Store):
    """Any store, counting the calls made to it and the objects its listings yield."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.url = inner.url
        self.calls: dict[str, int] = {}
        self.listed = 0

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    @property
    def total(self) -> int:
        return sum(self.calls.values())

    def reset(self) -> None:
        self.calls.clear()
        self.listed = 0

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        self._count("write_object")
        self.inner.write_object(key, chunks, size)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._count("put_if_absent")
        return self.inner.put_if_absent(key, data)

    def read(self, key: str, max_bytes: int) -> bytes:
        self._count("read")
        return self.inner.read(key, max_bytes)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self._count("read_into")
        self.inner.read_into(key, offset, out)

    def size(self, key: str) -> int:
        self._count("size")
        return self.inner.size(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        self._count("list")
        for info in self.inner.list(prefix, start_after=start_after):
            self.listed += 1
            yield info

    def delete(self, keys: Iterable[str]) -> None:
        self._count("delete")
        self.inner.delete(keys)


def _manifest(step: int) -> bytes:
    return stamped_manifest(RUN, TRAINING, step)


def _fill_memory(store: MemoryStore, steps: Iterable[int]) -> None:
    """The layout of committed checkpoints (a shard and a manifest each)."""
    for step in steps:
        store.write_object(f"{checkpoint_prefix(RUN, TRAINING, step)}/nonce/rank000-0000.bin", [b"\0" * 8])
        store.put_if_absent(manifest_key(RUN, TRAINING, step), _manifest(step))


def _fill_disk(root: Path, steps: Iterable[int]) -> None:
    """The same layout written straight to disk (no fsync per file: setup, not the store)."""
    for step in steps:
        folder = root / checkpoint_prefix(RUN, TRAINING, step)
        (folder / "nonce").mkdir(parents=True)
        (folder / "nonce" / "rank000-0000.bin").write_bytes(b"\0" * 8)
        (folder / "manifest.json").write_bytes(_manifest(step))


@pytest.fixture(scope="module")
def disk_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("latest") / "store"
    _fill_disk(root, range(1, MANY + 1))
    return root


def _ref(store: Store, step: int) -> CheckpointRef:
    return CheckpointRef(store.url, RUN, TRAINING, step)


def _set_pointer(store: Store, body: bytes) -> None:
    store.write_object(latest_key(RUN, TRAINING), [body])


def _pointer(step: int) -> bytes:
    return LatestPointer(step=step, fingerprint="f" * 64).to_json_bytes()


@pytest.mark.parametrize("kind", ["memory", "local"])
def test_latest_at_ten_thousand_checkpoints_takes_constant_store_calls(kind: str, disk_run: Path) -> None:
    inner: Store = LocalStore(disk_run)
    if kind == "memory":
        inner = memory = MemoryStore(f"latest-{kind}")
        _fill_memory(memory, range(1, MANY + 1))
    store = CountingStore(inner)
    store.inner.delete([latest_key(RUN, TRAINING)])
    assert latest_committed(store, RUN) == _ref(store, MANY)  # no pointer: the full listing
    assert store.listed >= 2 * MANY
    assert advance_latest(inner, _ref(inner, MANY), "f" * 64)
    store.reset()
    assert latest_committed(store, RUN) == _ref(store, MANY)
    assert store.calls == {"read": 2, "list": 1}  # pointer, its manifest (judged), what follows
    assert store.listed <= 1  # at most the pointer itself sorts after the last step
    store.reset()
    assert package_latest(store, RUN) == _ref(store, MANY)  # the package's entry point is the same
    assert store.total == 3


def blindly_trusted(store: Store, run_id: str) -> CheckpointRef | None:
    """What a pointer trusted without checks would answer: the cases below must refute it."""
    pointer = read_latest(store, run_id, TRAINING)
    return None if pointer is None else CheckpointRef(store.url, run_id, TRAINING, pointer.step)


Scenario = Callable[[MemoryStore], None]


def _missing(store: MemoryStore) -> None:
    store.delete([latest_key(RUN, TRAINING)])


def _behind(store: MemoryStore) -> None:
    _set_pointer(store, _pointer(40))  # racing writers left it behind


def _ahead(store: MemoryStore) -> None:
    _set_pointer(store, _pointer(500))  # its checkpoint was deleted (or never existed here)


def _deleted_latest(store: MemoryStore) -> None:
    """The pointed-at checkpoint is deleted (manifest first, as retention does): it dangles."""
    _set_pointer(store, _pointer(100))
    _fill_memory(store, [100])
    store.delete([manifest_key(RUN, TRAINING, 100)])


def _uncommitted_after(store: MemoryStore) -> None:
    """A newer save that never committed (shards, no manifest) sorts after the pointer."""
    _set_pointer(store, _pointer(99))
    store.write_object(f"{checkpoint_prefix(RUN, TRAINING, 120)}/n/rank000-0000.bin", [b"x"])


def _corrupt(body: bytes) -> Scenario:
    return lambda store: _set_pointer(store, body)


SCENARIOS: dict[str, tuple[Scenario, bool]] = {
    # name: (what happens to the pointer, whether a blind trust would get it wrong)
    "missing": (_missing, True),
    "behind": (_behind, True),
    "ahead": (_ahead, True),
    "deleted-latest": (_deleted_latest, True),
    "uncommitted-after": (_uncommitted_after, False),
    "not-json": (_corrupt(b"\xff{not json"), True),
    "not-an-object": (_corrupt(b"[99]"), True),
    "step-as-string": (_corrupt(b'{"step": "99", "fingerprint": "f"}'), True),
    "negative-step": (_corrupt(b'{"step": -1, "fingerprint": "f"}'), True),
    "boolean-step": (_corrupt(b'{"step": true, "fingerprint": "f"}'), True),
    "no-fingerprint": (_corrupt(b'{"step": 99}'), True),
    "too-large": (_corrupt(b'{"step": 99, "fingerprint": "' + b"f" * 10_000 + b'"}'), True),
    "empty": (_corrupt(b""), True),
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_a_pointer_never_changes_the_answer(name: str) -> None:
    store = MemoryStore(f"latest-{name}")
    _fill_memory(store, range(1, 100))  # committed: 1 ... 99
    scenario, refutes_blind_trust = SCENARIOS[name]
    scenario(store)
    assert latest_committed(store, RUN) == _ref(store, 99)
    assert [r.step for r in list_checkpoints(store, RUN)] == list(range(1, 100))  # the pointer is no checkpoint
    if refutes_blind_trust:
        assert blindly_trusted(store, RUN) != _ref(store, 99)


def test_a_pointer_behind_lists_only_what_follows_it() -> None:
    inner = MemoryStore("latest-behind")
    _fill_memory(inner, range(1, 1001))
    _set_pointer(inner, _pointer(990))
    store = CountingStore(inner)
    assert latest_committed(store, RUN) == _ref(store, 1000)
    # the pointer, its manifest, the listing of steps 991..1000 and the pointer, step 1000's manifest
    assert store.total == 4 and store.listed == 2 * 10 + 1


def test_the_latest_cursor_is_the_latest_with_the_manifest_that_judged_it() -> None:
    """``latest_cursor`` answers as ``latest_committed`` with the fingerprint, in the same store
    calls (the manifest the judgement read, not a second read); ``at_or_before``: a rollback's
    target, the highest committed step at or below it, a foreign object there passed over."""
    inner = MemoryStore("latest-cursor")
    _fill_memory(inner, range(1, 1001))
    _set_pointer(inner, _pointer(990))
    inner.write_object(manifest_key(RUN, TRAINING, 500), [b"not a manifest"])
    store = CountingStore(inner)
    options = CheckpointOptions()
    cursor = latest_cursor(store, RUN, options)
    assert cursor is not None and cursor.ref == _ref(store, 1000) and store.total == 4
    assert cursor.fingerprint == read_manifest(inner, cursor.ref, expect_kind=None, expand_index=False).fingerprint
    before = latest_cursor(store, RUN, options, at_or_before=500)
    assert before is not None and before.ref == _ref(store, 499)
    assert latest_cursor(store, RUN, options, at_or_before=0) is None
    assert latest_cursor(MemoryStore("latest-cursor-none"), RUN, options) is None


def test_no_checkpoint_at_all() -> None:
    store = MemoryStore("latest-none")
    assert latest_committed(store, RUN) is None
    _set_pointer(store, _pointer(7))  # a pointer alone is not a checkpoint
    assert latest_committed(store, RUN) is None
    assert latest_committed(store, RUN, CheckpointKind.JOURNAL) is None


def test_kinds_have_their_own_pointers() -> None:
    store = MemoryStore("latest-kinds")
    for kind, step in ((TRAINING, 30), (CheckpointKind.INFERENCE, 50)):
        result = write_checkpoint(store, CheckpointContent(kind=kind, run_id=RUN, step=step), {"w": np.ones(2)})
        advance_latest(store, result.ref, result.manifest.fingerprint)
    assert latest_committed(store, RUN) == _ref(store, 30)
    assert latest_committed(store, RUN, CheckpointKind.INFERENCE) == CheckpointRef(
        store.url, RUN, CheckpointKind.INFERENCE, 50
    )
    pointer = read_latest(store, RUN, CheckpointKind.INFERENCE)
    assert pointer is not None and pointer.step == 50


def test_the_pointer_only_moves_forward() -> None:
    store = MemoryStore("latest-forward")
    assert advance_latest(store, _ref(store, 10), "a")
    assert not advance_latest(store, _ref(store, 5), "b")  # an older commit finishing late
    assert not advance_latest(store, _ref(store, 10), "c")
    assert read_latest(store, RUN, TRAINING) == LatestPointer(step=10, fingerprint="a")
    assert advance_latest(store, _ref(store, 11), "d")
    assert read_latest(store, RUN, TRAINING) == LatestPointer(step=11, fingerprint="d")


class _FailingWrites(MemoryStore):
    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        raise E.StorageError("disk on fire")


def test_advancing_never_fails_a_commit() -> None:
    store = _FailingWrites("latest-failing")
    assert not advance_latest(store, _ref(store, 3), "a")  # left behind: the listing covers it
    assert read_latest(store, RUN, TRAINING) is None


def test_listing_and_retention_leave_the_pointer_alone() -> None:
    store = MemoryStore("latest-retention")
    for step in range(1, 7):
        result = write_checkpoint(store, CheckpointContent(kind=TRAINING, run_id=RUN, step=step), {"w": np.ones(2)})
        advance_latest(store, result.ref, result.manifest.fingerprint)
    assert parse_checkpoint_key(latest_key(RUN, TRAINING)) is None
    plan = collect_garbage(store, RUN, RetentionPolicy(keep_last=2, grace_seconds=0))
    assert latest_key(RUN, TRAINING) not in plan.orphans + plan.remove + plan.uncommit
    assert [r.step for r in plan.keep] == [5, 6]
    assert read_latest(store, RUN, TRAINING) is not None
    assert latest_committed(store, RUN) == _ref(store, 6)
    assert [r.step for r in list_checkpoints(store, RUN)] == [5, 6]


def test_retention_deleting_a_lagging_pointers_checkpoint_falls_back(tmp_path: Path) -> None:
    """A pointer left behind at step 2; retention keeps only the last two: it dangles, and the
    answer comes from the listing (on disk, where the step directory is gone)."""
    store = LocalStore(tmp_path / "store")
    for step in range(1, 7):
        write_checkpoint(store, CheckpointContent(kind=TRAINING, run_id=RUN, step=step), {"w": np.ones(2)})
    _set_pointer(store, _pointer(2))  # racing writers left it at step 2
    collect_garbage(store, RUN, RetentionPolicy(keep_last=2, grace_seconds=0))
    assert not os.path.exists(tmp_path / "store" / checkpoint_prefix(RUN, TRAINING, 2))
    pointer = read_latest(store, RUN, TRAINING)
    assert pointer is not None and pointer.step == 2
    assert latest_committed(store, RUN) == _ref(store, 6)
