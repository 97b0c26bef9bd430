"""The node-local tier: local commits, background uploads (objects first, manifest last),
resumable and verified uploads, and the byte bound."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterable
from pathlib import Path

import pytest

from cairn.checkpoint.committed import list_checkpoints
from cairn.checkpoint.latest import latest_committed, read_latest
from cairn.checkpoint.layout import MANIFEST_NAME, manifest_key
from cairn.checkpoint.manifest import CheckpointKind
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.tier import NodeTier, TieredStore
from cairn.checkpoint.upload import CheckpointRef, Uploader, Uploads, require_durable, upload_checkpoint
from cairn.errors import CairnError, CheckpointConflictError, IntegrityError, StorageError
from cairn.session import TrainingSession
from cairn.stores.base import Chunk, ObjectInfo, Store
from cairn.stores.identity import store_identity
from cairn.stores.local import LocalStore
from cairn.training.manager import load_training
from tests.conftest import small_config

RUN = "tiered"


class HeldUploader(Uploader):
    """Queues uploads and runs them only when the test says (``drain``): no thread."""

    def __init__(self) -> None:
        super().__init__(concurrency=2)
        self.queued: list[tuple[Uploads, CheckpointRef]] = []

    def submit(self, tiered: Uploads, ref: CheckpointRef) -> None:
        self.queued.append((tiered, ref))

    def drain(self, tries: int = 5) -> None:
        while self.queued:
            tiered, ref = self.queued[0]
            for _ in range(tries):
                if tiered.upload(ref, self.concurrency) is None:
                    break
            self.queued.pop(0)


class RecordingStore(Store):
    """A durable store that records every write, in order, and fails the writes ``fail_at``
    names (their 1-based position among write_object calls)."""

    def __init__(self, inner: Store, fail_at: Iterable[int] = ()) -> None:
        self.inner, self.url = inner, inner.url
        self.calls: list[tuple[str, str]] = []
        self.fail_at = set(fail_at)
        self.writes = 0

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        self.writes += 1
        if self.writes in self.fail_at:
            raise StorageError(f"injected failure writing {key}")
        self.inner.write_object(key, chunks, size)
        self.calls.append(("write", key))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self.calls.append(("commit", key))
        return self.inner.put_if_absent(key, data)

    def read(self, key: str, max_bytes: int) -> bytes:
        return self.inner.read(key, max_bytes)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self.inner.read_into(key, offset, out)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterable[ObjectInfo]:  # type: ignore[override]
        return self.inner.list(prefix, start_after)

    def delete(self, keys: Iterable[str]) -> None:
        self.inner.delete(keys)


def _tier(tmp_path: Path, durable: Store, capacity: int = 1 << 30, name: str = "tier") -> tuple[NodeTier, TieredStore]:
    node = NodeTier(tmp_path / name, capacity, HeldUploader())
    return node, node.tiered(durable.url, durable)


def _uploader(node: NodeTier) -> HeldUploader:
    assert isinstance(node.uploader, HeldUploader)
    return node.uploader


def test_commit_is_local_until_uploaded_then_durable_manifest_last(tmp_path: Path) -> None:
    durable = RecordingStore(LocalStore(tmp_path / "durable"))
    node, tiered = _tier(tmp_path, durable)
    session = TrainingSession.fresh(RUN, tiered, small_config())
    session.run(10, checkpoint_every=5)
    assert durable.calls == []  # the trainer's path touched the local tier only
    assert [r.step for r in list_checkpoints(tiered, RUN)] == [5, 10]
    assert node.pending()[0] == 2
    _uploader(node).drain()
    assert [r.step for r in list_checkpoints(durable, RUN)] == [5, 10]
    for step in (5, 10):
        mine = [i for i, (_, k) in enumerate(durable.calls) if f"/{step:012d}/" in k]
        commit = durable.calls.index(("commit", manifest_key(RUN, "training", step)))
        assert commit == max(mine), durable.calls  # every object of the checkpoint before its manifest
    pointer = read_latest(durable, RUN, CheckpointKind.TRAINING)
    assert pointer is not None and pointer.step == 10
    state, manifest = load_training(durable, CheckpointRef(durable.url, RUN, CheckpointKind.TRAINING, 10))
    assert session.last_commit is not None and manifest.fingerprint == session.last_commit.manifest.fingerprint
    assert node.pending() == (0, 0) and node.stats.uploaded_checkpoints == 2


def test_failed_upload_leaves_no_torn_checkpoint_and_a_retry_completes_it(tmp_path: Path) -> None:
    durable = RecordingStore(LocalStore(tmp_path / "durable"), fail_at=[2])
    node, tiered = _tier(tmp_path, durable)
    TrainingSession.fresh(RUN, tiered, small_config()).run(5, checkpoint_every=5)
    (tiered_ref, _) = (_uploader(node).queued[0][1], None)
    assert tiered.upload(tiered_ref, 1) == 1  # failed mid-upload: retried later
    assert durable.writes >= 2 and latest_committed(durable, RUN) is None  # objects, but no commit
    _uploader(node).drain()
    assert latest_committed(durable, RUN) is not None and node.stats.upload_failures == 1


def test_a_crashed_workers_local_commits_are_uploaded_by_the_next_one(tmp_path: Path) -> None:
    durable = LocalStore(tmp_path / "durable")
    node, tiered = _tier(tmp_path, durable)
    session = TrainingSession.fresh(RUN, tiered, small_config())
    session.run(10, checkpoint_every=5)
    (tiered.local.root / "stray.tmp").write_bytes(b"x")  # a crashed save's leftover
    node.close()  # the process died: nothing was uploaded
    assert latest_committed(durable, RUN) is None
    again = NodeTier(tmp_path / "tier", 1 << 30, HeldUploader())
    assert [t.url for t in again.resume()] == [durable.url]
    assert not (tiered.local.root / "stray.tmp").exists()
    _uploader(again).drain()
    assert [r.step for r in list_checkpoints(durable, RUN)] == [5, 10]
    again.close()
    third = NodeTier(tmp_path / "tier", 1 << 30, HeldUploader())
    third.resume()
    assert _uploader(third).queued == [] and third.pending() == (0, 0)  # uploaded markers: nothing again


def test_one_process_per_tier_directory(tmp_path: Path) -> None:
    NodeTier(tmp_path / "tier", 1 << 20)
    with pytest.raises(Exception, match="no other process"):
        NodeTier(tmp_path / "tier", 1 << 20)


def test_identical_durable_commit_is_success_and_a_different_one_discards_the_local_copy(tmp_path: Path) -> None:
    durable = LocalStore(tmp_path / "durable")
    TrainingSession.fresh(RUN, durable, small_config()).run(5, checkpoint_every=5)  # another host, same bits
    node, tiered = _tier(tmp_path, durable)
    TrainingSession.fresh(RUN, tiered, small_config()).run(5, checkpoint_every=5)
    _uploader(node).drain()
    assert node.stats.uploaded_checkpoints == 1 and node.stats.discarded == 0
    other = RUN + "-b"
    TrainingSession.fresh(other, durable, small_config(seed=99)).run(5, checkpoint_every=5)
    TrainingSession.fresh(other, tiered, small_config()).run(5, checkpoint_every=5)
    _uploader(node).drain()
    assert node.stats.discarded == 1 and tiered.newest(other) is None
    assert [o.key for o in tiered.local.list(f"{other}/training/")] == [f"{other}/training/latest.json"]


def test_a_flipped_byte_is_never_uploaded(tmp_path: Path) -> None:
    durable = LocalStore(tmp_path / "durable")
    node, tiered = _tier(tmp_path, durable)
    TrainingSession.fresh(RUN, tiered, small_config()).run(5, checkpoint_every=5)
    shard = next(o for o in tiered.local.list(f"{RUN}/training/") if o.key.endswith(".bin"))
    path = tiered.local.root / shard.key
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(raw)
    _uploader(node).drain()
    assert latest_committed(durable, RUN) is None  # no commit from corrupt bytes
    assert node.stats.discarded == 1 and tiered.newest(RUN) is None


def test_the_bound_evicts_uploaded_checkpoints_only_then_falls_back_to_the_durable_store(tmp_path: Path) -> None:
    durable = LocalStore(tmp_path / "durable")
    probe_node, probe = _tier(tmp_path, durable, name="probe")
    TrainingSession.fresh("probe", probe, small_config()).run(5, checkpoint_every=5)
    one = probe.used_bytes
    probe_node.close()
    node, tiered = _tier(tmp_path, durable, capacity=2 * one + one // 4)  # two checkpoints (the manifest dominates)
    session = TrainingSession.fresh(RUN, tiered, small_config())
    session.run(10, checkpoint_every=5)  # steps 5 and 10 local, not uploaded
    assert node.pending()[0] == 2
    session.run(5, checkpoint_every=5)  # step 15: no room, and nothing may be evicted
    assert node.stats.fallbacks == 1 and node.stats.evictions == 0
    assert latest_committed(durable, RUN) == CheckpointRef(durable.url, RUN, CheckpointKind.TRAINING, 15)
    assert [r.step for r in list_checkpoints(tiered, RUN)] == [5, 10]
    _uploader(node).drain()
    session.run(5, checkpoint_every=5)  # step 20: the oldest uploaded one (5) makes room
    assert node.stats.evictions == 1 and node.stats.fallbacks == 1
    assert [r.step for r in list_checkpoints(tiered, RUN)] == [10, 20]
    assert not any(o.key.endswith(f"{5:012d}/{MANIFEST_NAME}") for o in tiered.local.list())
    assert node.used_bytes() <= node.capacity


def test_flush_waits_for_the_upload_and_reports_a_discarded_checkpoint(tmp_path: Path) -> None:
    durable = LocalStore(tmp_path / "durable")
    node = NodeTier(tmp_path / "tier", 1 << 30)  # the real uploader thread
    tiered = node.tiered(durable.url, durable)
    session = TrainingSession.fresh(RUN, tiered, small_config())
    session.run(10, checkpoint_every=5)
    tiered.flush(RUN, 10)
    assert latest_committed(durable, RUN) == CheckpointRef(durable.url, RUN, CheckpointKind.TRAINING, 10)
    assert node.flush_all(5.0)


def _flip_a_byte(tiered: TieredStore, step: int) -> None:
    shard = next(o for o in tiered.local.list(f"{RUN}/training/{step:012d}/") if o.key.endswith(".bin"))
    path = tiered.local.root / shard.key
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    path.write_bytes(raw)


def test_flush_of_a_step_whose_upload_failed_for_good_raises(tmp_path: Path) -> None:
    """Fail-first: the discarded commit left ``commits``, so flush waited on nothing and
    returned normally while the durable latest was step 5."""
    durable = LocalStore(tmp_path / "durable")
    node, tiered = _tier(tmp_path, durable)
    session = TrainingSession.fresh(RUN, tiered, small_config())
    session.run(10, checkpoint_every=5)
    _flip_a_byte(tiered, 10)
    _uploader(node).drain()
    assert node.stats.discarded == 1
    with pytest.raises(StorageError, match="not durable"):
        tiered.flush(RUN, 10)
    tiered.flush(RUN, 5)  # what is durable passes


def test_a_local_manifest_that_cannot_be_read_back_fails_its_commit(tmp_path: Path) -> None:
    durable = LocalStore(tmp_path / "durable")
    _, tiered = _tier(tmp_path, durable)
    with pytest.raises(CairnError):
        tiered.put_if_absent(manifest_key(RUN, "training", 5), b"{not a manifest")
    assert tiered.newest(RUN) is None


def test_a_lost_conflict_drops_the_runs_later_local_commits_and_fails_the_run(tmp_path: Path) -> None:
    """Fail-first: only step 10 was discarded; 15 (descended from our losing 10) was uploaded."""
    durable = LocalStore(tmp_path / "durable")
    TrainingSession.fresh(RUN, durable, small_config(seed=99)).run(10, checkpoint_every=10)  # the other writer
    theirs = latest_committed(durable, RUN)
    node, tiered = _tier(tmp_path, durable)
    session = TrainingSession.fresh(RUN, tiered, small_config())
    session.run(15, checkpoint_every=5)
    _uploader(node).drain()
    assert [r.step for r in list_checkpoints(durable, RUN)] == [5, 10]
    assert latest_committed(durable, RUN) == theirs
    assert [c.ref.step for c in tiered.commits.values()] == [5]
    with pytest.raises(CheckpointConflictError):
        tiered.flush(RUN, 15)
    with pytest.raises(CheckpointConflictError):
        session.run(5, checkpoint_every=5)  # the run's next commit through the tier
    _uploader(node).drain()
    assert [r.step for r in list_checkpoints(durable, RUN)] == [5, 10]


def test_local_copies_of_another_store_identity_are_discarded_not_uploaded(tmp_path: Path) -> None:
    """Fail-first: the store was wiped and recreated at the same URL; the old tier's pending
    commits were uploaded into the new store."""
    durable = LocalStore(tmp_path / "durable")
    store_identity(durable, create=True)
    node, tiered = _tier(tmp_path, durable)
    TrainingSession.fresh(RUN, tiered, small_config()).run(10, checkpoint_every=5)
    node.close()
    shutil.rmtree(tmp_path / "durable")
    store_identity(durable, create=True)  # recreated: another identity
    again = NodeTier(tmp_path / "tier", 1 << 30, HeldUploader())
    [reopened] = again.resume()
    _uploader(again).drain()
    assert list_checkpoints(durable, RUN) == [] and reopened.newest(RUN) is None
    assert again.pending() == (0, 0)


def test_a_store_url_not_in_normal_form_resumes_its_pending_uploads(tmp_path: Path) -> None:
    """Fail-first: the subdirectory was hashed from the raw URL, durable.json held the
    normalised one, so the next process looked in another subdirectory."""
    durable = LocalStore(tmp_path / "durable")
    node = NodeTier(tmp_path / "tier", 1 << 30, HeldUploader())
    tiered = node.tiered(f"file://{tmp_path / 'durable'}/")
    assert tiered is node.tiered(durable.url)
    TrainingSession.fresh(RUN, tiered, small_config()).run(10, checkpoint_every=5)
    node.close()
    again = NodeTier(tmp_path / "tier", 1 << 30, HeldUploader())
    again.resume()
    _uploader(again).drain()
    assert [r.step for r in list_checkpoints(durable, RUN)] == [5, 10]


class SecondReadChanged(LocalStore):
    """A local tier whose manifest changes after its first read (an editor, a bit flip, a racing
    writer): the upload must send the bytes it verified, never a second read."""

    def __init__(self, root: Path, key: str) -> None:
        super().__init__(root)
        self.key, self.reads = key, 0

    def read(self, key: str, max_bytes: int) -> bytes:
        raw = super().read(key, max_bytes)
        if key != self.key:
            return raw
        self.reads += 1
        return raw if self.reads == 1 else raw.replace(b'"cursor":', b'"cursor": ', 1).replace(b"10", b"11", 1)


def test_the_upload_sends_the_manifest_bytes_it_verified(tmp_path: Path) -> None:
    local = LocalStore(tmp_path / "local")
    TrainingSession.fresh(RUN, local, small_config()).run(10)
    key = manifest_key(RUN, CheckpointKind.TRAINING, 10)
    verified = local.read(key, 1 << 20)
    changing = SecondReadChanged(tmp_path / "local", key)
    durable = LocalStore(tmp_path / "durable")
    ref = CheckpointRef(durable.url, RUN, CheckpointKind.TRAINING, 10)
    upload_checkpoint(changing, durable, ref)
    assert durable.read(key, 1 << 20) == verified
    read_manifest(durable, ref, expect_kind=None)  # every reader accepts what was committed durably
    require_durable(durable, ref, read_manifest(durable, ref, expect_kind=None).fingerprint)


def test_the_durable_check_refuses_a_commit_with_the_right_fingerprint_field_but_other_bytes(tmp_path: Path) -> None:
    """A durable manifest whose fingerprint field is the expected one, with another cursor: readers
    refuse it (the fingerprint covers the cursor), so it is not durable state."""
    durable = LocalStore(tmp_path / "durable")
    result = TrainingSession.fresh(RUN, durable, small_config()).run(10)
    assert result is not None
    key = manifest_key(RUN, CheckpointKind.TRAINING, 10)
    body = json.loads(durable.read(key, 1 << 20))
    body["cursor"] += 1
    (durable.root / key).write_bytes(json.dumps(body).encode())
    with pytest.raises(IntegrityError, match="fingerprint"):
        require_durable(durable, result.ref, result.manifest.fingerprint)


def test_a_tier_record_written_before_store_identities_still_opens(tmp_path: Path) -> None:
    """``.tier/durable.json`` of an older release names the store only (no ``store_id``): the tier
    opens, adopts the store's identity and resumes its uploads, as before the bounded reader."""
    durable = LocalStore(tmp_path / "durable")
    node, tiered = _tier(tmp_path, durable)
    TrainingSession.fresh(RUN, tiered, small_config()).run(5)
    (tiered.local.root / ".tier" / "durable.json").write_text(json.dumps({"url": durable.url}))
    node.close()
    again = NodeTier(tmp_path / "tier", 1 << 30, HeldUploader())
    assert [t.url for t in again.resume()] == [durable.url]
    _uploader(again).drain()
    assert [r.step for r in list_checkpoints(durable, RUN)] == [5]
