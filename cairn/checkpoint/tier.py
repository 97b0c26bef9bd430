"""A node-local tier in front of the durable store: commit locally, upload in the background.

``NodeTier`` owns one directory (local disk or tmpfs) and its byte bound, for every durable
store the process trains into: ``DIR/<hash of the store URL>/`` holds that store's local
checkpoints under the durable store's own keys, ``.tier/durable.json`` names the store and
``.tier/uploaded/RUN/KIND/STEP`` marks a checkpoint whose durable commit exists. A lock on
``DIR/.lock`` keeps one process per directory. ``TieredStore`` is the ``Store`` a training
session writes through: its writes and reads go to the local copy; committing a training
manifest there (create-if-absent, as everywhere) queues the checkpoint on the process's
``Uploader`` (``cairn.checkpoint.upload``: objects first, the manifest last). Ownership, store
identity and the journal never pass through it; the subdirectory is keyed by the opened store's
normal-form ``url`` and tied to its identity (read, never created): when the store at the URL
has another, its local copies are discarded. Opening a store's tier finds local commits
without a marker and uploads them (a crashed worker's). A lost upload conflict drops the run's
later local commits and fails its next flush, restore or commit. The bound: before a save,
uploaded checkpoints are evicted oldest first, never one not yet uploaded: without room the save
goes to the durable store (``save_target``). Restores: ``cairn.runs.tier_restore``, the README.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import itertools
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from cairn.checkpoint.layout import MANIFEST_NAME, checkpoint_prefix, manifest_key, parse_checkpoint_key
from cairn.checkpoint.manifest import CheckpointKind
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.upload import LocalCommit, TierStats, Uploader, checkpoint_objects, upload_checkpoint
from cairn.checkpoint.upload import require_durable as _require_durable
from cairn.errors import (
    CairnError,
    CheckpointConflictError,
    CheckpointError,
    ConfigError,
    InvalidObjectError,
    ObjectNotFoundError,
    StorageError,
)
from cairn.faults import maybe_crash
from cairn.stores import open_store
from cairn.stores.base import Chunk, ObjectInfo, Store
from cairn.stores.identity import store_identity
from cairn.stores.local import LocalStore
from cairn.stores.objects import read_record

__all__ = ["NodeTier", "TieredStore", "TierStats", "LocalCommit"]

log = logging.getLogger("cairn.tier")

STATE = ".tier/"
UPLOADED = f"{STATE}uploaded/"
DURABLE_NAME = f"{STATE}durable.json"
_PERMANENT = (CheckpointError, InvalidObjectError, ObjectNotFoundError)
"""Upload failures that the same local bytes meet again: the local copy is discarded."""


class NodeTier:
    """The node-local tier directory ``root``, bounded to ``capacity`` bytes."""

    def __init__(self, root: str | Path, capacity: int, uploader: Uploader | None = None) -> None:
        if capacity <= 0:
            raise ConfigError("--local-tier-bytes", expected="> 0", found=capacity)
        self.root = Path(root).expanduser().resolve()
        self.capacity = capacity
        self.uploader = uploader or Uploader()
        self.stats = TierStats()
        self.lock = threading.RLock()
        self._stores: dict[str, TieredStore] = {}
        self._aliases: dict[str, str] = {}
        """A store URL as given -> the opened store's (normal-form) ``url``, which keys the rest."""
        self._reserved: dict[tuple[str, str], int] = {}
        self._seq = itertools.count()
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock_fd = os.open(self.root / ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise ConfigError(  # noqa: B904 - the message says what to fix, not the errno
                "--local-tier", expected="a directory no other process uses", found=str(self.root)
            )

    def close(self) -> None:
        """Release the directory (its uploads stop being served by this object)."""
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

    def tiered(self, durable_url: str, durable: Store | None = None) -> TieredStore:
        """The tier of the durable store at ``durable_url`` (``durable``: that store, already
        open; else opened here), its pending uploads queued on first use in this process."""
        with self.lock:
            url = durable.url if durable is not None else self._aliases.get(durable_url)
            found = None if url is None else self._stores.get(url)
            if found is None:
                store = durable or open_store(durable_url)  # its url, normal form, keys the tier
                url = self._aliases[durable_url] = store.url
                found = self._stores.get(url)
                if found is None:
                    sub = self.root / hashlib.sha256(url.encode()).hexdigest()[:16]
                    found = self._stores[url] = TieredStore(self, LocalStore(sub), store)
                    found.recover()
                elif durable is None:
                    with contextlib.suppress(CairnError):
                        store.close()  # opened here only to learn its url
        found.check_identity()
        return found

    def resume(self) -> list[TieredStore]:
        """Open the tier of every durable store this directory holds checkpoints for (at worker
        start): their checkpoints not yet uploaded are queued."""
        opened = []
        for sub in sorted(p for p in self.root.iterdir() if (p / DURABLE_NAME).is_file()):
            try:
                url = read_record(LocalStore(sub), DURABLE_NAME, what="local tier record")["url"]
                opened.append(self.tiered(url))
            except (OSError, ValueError, KeyError, TypeError, CairnError) as exc:
                log.warning("local tier %s: cannot resume its uploads: %s", sub, exc)
        return opened

    # -- the bound -----------------------------------------------------------------------
    def used_bytes(self) -> int:
        with self.lock:
            return sum(s.used_bytes for s in self._stores.values()) + sum(self._reserved.values())

    def pending(self) -> tuple[int, int]:
        """(checkpoints, bytes) committed locally and not uploaded yet, over every store."""
        with self.lock:
            commits = [c for s in self._stores.values() for c in s.commits.values() if not c.uploaded]
            return len(commits), sum(_own(c) for c in commits)

    def make_room(self, owner: TieredStore, run_id: str, nbytes: int) -> bool:
        """Reserve ``nbytes`` for the next save of ``run_id``, evicting uploaded checkpoints
        oldest first; False when the checkpoints not uploaded yet leave no room."""
        with self.lock:
            self._reserved.pop((owner.url, run_id), None)
            while self.used_bytes() + nbytes > self.capacity:
                uploaded = [(c.seq, s, c.ref) for s in self._stores.values() for c in s.commits.values() if c.uploaded]
                if not uploaded:
                    return False
                _, store, ref = min(uploaded, key=lambda u: u[0])
                store.drop(ref, evicted=True)
            self._reserved[(owner.url, run_id)] = nbytes
            return True

    def release(self, owner: TieredStore, run_id: str) -> None:
        with self.lock:
            self._reserved.pop((owner.url, run_id), None)

    def next_seq(self) -> int:
        return next(self._seq)

    def flush_all(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every queued upload; True if none is left."""
        deadline = time.monotonic() + timeout
        with self.lock:
            commits = [c for s in self._stores.values() for c in s.commits.values() if not c.uploaded]
        return all(c.done.wait(max(0.0, deadline - time.monotonic())) for c in commits)


def _key(ref: CheckpointRef) -> tuple[str, str, int]:
    return ref.run_id, ref.kind.value, ref.step


def _own(commit: LocalCommit) -> int:
    """The bytes of a commit's own objects (under its prefix, its manifest included)."""
    prefix = checkpoint_prefix(*_key(commit.ref)) + "/"
    return sum(n for k, n in commit.needed.items() if k.startswith(prefix))


class TieredStore(Store):
    """The local tier of one durable store, as the ``Store`` a training session writes to."""

    def __init__(self, node: NodeTier, local: LocalStore, durable: Store) -> None:
        self.node, self.local, self.durable = node, local, durable
        self.url = durable.url
        self.read_piece_bytes = local.read_piece_bytes
        self.commits: dict[tuple[str, str, int], LocalCommit] = {}
        self._refs: dict[str, int] = {}
        self._sizes: dict[str, int] = {}
        self.used_bytes = 0
        self.identity: str | None = None
        """The durable store's identity its local copies belong to (``.tier/durable.json``)."""
        self.conflicts: dict[str, CheckpointConflictError] = {}
        """Runs whose upload lost a conflict: their later local commits are dropped, and their
        next flush, restore or commit through the tier raises."""

    # -- the Store interface: the local copy ------------------------------------------------
    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        self.local.write_object(key, chunks, size)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        found = parse_checkpoint_key(key)
        training = found is not None and found.is_manifest and found.kind == CheckpointKind.TRAINING.value
        if found is not None and training:
            self.require_no_conflict(found.run_id)
        created = self.local.put_if_absent(key, data)
        if found is not None and training:
            ref = CheckpointRef(self.url, found.run_id, CheckpointKind.TRAINING, found.step)
            self.node.release(self, found.run_id)
            if self._register(ref, uploaded=False, strict=created) is not None:
                maybe_crash("tier-before-upload", step=found.step)
                self.node.uploader.submit(self, ref)
        return created

    def read(self, key: str, max_bytes: int) -> bytes:
        return self.local.read(key, max_bytes)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self.local.read_into(key, offset, out)

    def size(self, key: str) -> int:
        return self.local.size(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        return (o for o in self.local.list(prefix, start_after) if not o.key.startswith(STATE))

    def delete(self, keys: Iterable[str]) -> None:
        self.local.delete(keys)

    def close(self) -> None:
        """Nothing: the tier lives as long as its process (the uploads go on)."""

    def save_target(self, run_id: str, nbytes: int) -> Store:
        if self.node.make_room(self, run_id, nbytes):
            return self
        self.node.stats.fallbacks += 1
        count, pending = self.node.pending()
        log.warning("local tier %s full (%d checkpoint(s), %d bytes not uploaded yet, bound %d): the checkpoint "
                    "of %s is written to the durable store %s synchronously",
                    self.node.root, count, pending, self.node.capacity, run_id, self.durable.url)  # fmt: skip
        return self.durable

    # -- local commits ---------------------------------------------------------------------
    def _register(self, ref: CheckpointRef, *, uploaded: bool, strict: bool = False) -> LocalCommit | None:
        """Record a local commit (its manifest read back: what it needs); None when already
        known or unreadable (then discarded; ``strict``: a manifest just created, raises)."""
        with self.node.lock:
            if _key(ref) in self.commits:
                return None
        local_ref = CheckpointRef(self.local.url, ref.run_id, ref.kind, ref.step)
        try:
            manifest = read_manifest(self.local, local_ref, expect_kind=None)
            needed = {k: o.size for k, o in checkpoint_objects(manifest).items()}
            mkey = manifest_key(*_key(ref))
            needed[mkey] = self.local.size(mkey)
        except (CheckpointError, StorageError, InvalidObjectError) as exc:
            self._delete_prefix(ref, f"its manifest cannot be read ({exc})")
            if strict:
                raise
            return None
        with self.node.lock:
            if _key(ref) in self.commits:
                return None
            commit = LocalCommit(ref, manifest.fingerprint, needed, self.node.next_seq(), uploaded=uploaded)
            if uploaded:
                commit.done.set()
            self.commits[_key(ref)] = commit
            for k, n in needed.items():
                self._refs[k] = self._refs.get(k, 0) + 1
                if self._refs[k] == 1:
                    self._sizes[k] = n
                    self.used_bytes += n
            return commit

    def drop(self, ref: CheckpointRef, *, evicted: bool = False, why: str = "") -> None:
        """Delete a local commit's objects (those no other local commit needs) and marker."""
        with self.node.lock:
            commit = self.commits.pop(_key(ref), None)
            if commit is None:
                return
            doomed = []
            for k in commit.needed:
                self._refs[k] -= 1
                if self._refs[k] == 0:
                    del self._refs[k]
                    self.used_bytes -= self._sizes.pop(k)
                    doomed.append(k)
            if evicted:
                self.node.stats.evictions += 1
            else:
                self.node.stats.discarded += 1
        if not commit.uploaded and not evicted:
            commit.error = commit.error or StorageError(f"the local copy of {ref} was discarded: {why}")
        commit.done.set()
        manifest = manifest_key(*_key(ref))
        with contextlib.suppress(CairnError):
            self.local.delete([manifest])  # first: what is left is never taken for a commit
            self.local.delete([k for k in doomed if k != manifest] + [_marker(ref)])
        if evicted:
            log.info("local tier: evicted %s (uploaded)", ref)
        else:
            log.warning("local tier: discarded the local copy of %s: %s", ref, why)

    def discard(self, ref: CheckpointRef, why: str) -> None:
        """The local copy of ``ref`` failed verification: delete it (fail-closed)."""
        if _key(ref) in self.commits:
            self.drop(ref, why=why)
        else:
            self._delete_prefix(ref, why)

    def _delete_prefix(self, ref: CheckpointRef, why: str) -> None:
        with contextlib.suppress(CairnError):
            keys = [o.key for o in self.local.list(checkpoint_prefix(*_key(ref)) + "/")]
            self.local.delete(sorted(keys, key=lambda k: not k.endswith(MANIFEST_NAME)) + [_marker(ref)])
        log.warning("local tier: discarded the local copy of %s: %s", ref, why)

    def newest(self, run_id: str) -> LocalCommit | None:
        """The run's newest training checkpoint committed in the local tier."""
        with self.node.lock:
            mine = [c for c in self.commits.values() if c.ref.run_id == run_id]
        return max(mine, key=lambda c: c.ref.step, default=None)

    # -- uploads ---------------------------------------------------------------------------
    def upload(self, ref: CheckpointRef, concurrency: int) -> int | None:
        """One try at uploading ``ref`` (the uploader's thread): None when done with it
        (uploaded, or discarded after a permanent failure), else the attempts so far."""
        commit = self.commits.get(_key(ref))
        if commit is None or commit.uploaded:
            return None
        started = time.perf_counter()
        try:
            if not self.check_identity() or self.commits.get(_key(ref)) is not commit:
                return None  # another store now: its local copies were discarded
            if ref.run_id in self.conflicts:
                self.drop(ref, why="its run lost an upload conflict")
                return None
            outcome = upload_checkpoint(self.local, self.durable, ref, concurrency=concurrency)
        except CheckpointConflictError as exc:
            self.node.stats.upload_failures += 1
            log.error("local tier: upload of %s lost a conflict: %s; the run's later local commits dropped", ref, exc)
            self.conflicts[ref.run_id] = exc
            with self.node.lock:
                doomed = [c for c in self.commits.values() if c.ref.run_id == ref.run_id and c.ref.step >= ref.step]
            for later in doomed:  # descended from the losing state: flush raises the conflict
                self.drop(later.ref, why="its run lost an upload conflict")
            return None
        except _PERMANENT as exc:
            self.node.stats.upload_failures += 1
            log.error("local tier: upload of %s failed: %s: %s; local copy discarded", ref, type(exc).__name__, exc)
            commit.error = exc
            self.drop(ref, why=f"upload failed: {type(exc).__name__}")
            return None
        except CairnError as exc:
            self.node.stats.upload_failures += 1
            commit.attempts += 1
            log.warning("local tier: upload of %s failed (attempt %d, retried): %s", ref, commit.attempts, exc)
            return commit.attempts
        seconds = time.perf_counter() - started
        with contextlib.suppress(CairnError):
            self.local.write_object(_marker(ref), [outcome.fingerprint.encode()])
        with self.node.lock:
            commit.uploaded = True
            self.node.stats.uploaded_checkpoints += 1
            self.node.stats.uploaded_bytes += outcome.sent_bytes
            self.node.stats.upload_seconds += seconds
        commit.done.set()
        log.info("local tier: uploaded %s (%d bytes sent, %.3f s%s)", ref, outcome.sent_bytes, seconds,
                 "" if outcome.created else "; identical commit already durable")  # fmt: skip
        return None

    def require_no_conflict(self, run_id: str) -> None:
        if run_id in self.conflicts:
            raise CheckpointConflictError(f"run {run_id} lost an upload conflict: {self.conflicts[run_id]}")

    def flush(self, run_id: str, step: int | None = None, fingerprint: str | None = None, retries: int = 3) -> None:
        """Wait until the run's local commits (up to ``step``) are uploaded, then require the
        durable commit at ``step`` (with ``fingerprint``: ``require_durable``). Raises
        ``CheckpointConflictError`` for a run that lost an upload conflict, ``StorageError``
        when ``step`` is not durable (its upload failed for good) or after ``retries``
        failed tries while waiting (the uploads go on)."""
        self.require_no_conflict(run_id)
        with self.node.lock:
            mine = [c for c in self.commits.values() if c.ref.run_id == run_id and not c.uploaded]
        waiting = [c for c in mine if step is None or c.ref.step <= step]
        for commit in sorted(waiting, key=lambda c: c.ref.step):
            start = commit.attempts
            while not commit.done.wait(0.1):
                if commit.attempts - start >= retries:
                    raise StorageError(f"the upload of {commit.ref} failed {commit.attempts} time(s); still retrying")
            self.require_no_conflict(run_id)
            if commit.error is not None and commit.ref.step == step:
                raise StorageError(f"{commit.ref} is not durable: {commit.error}")
        if step is not None:
            ref = CheckpointRef(self.url, run_id, CheckpointKind.TRAINING, step)
            _require_durable(self.durable, ref, fingerprint, "its upload failed or its local copy was discarded")

    def check_identity(self) -> bool:
        """True when the durable store is still the one the local copies belong to; else (wiped
        and recreated, or another store at the URL) discard them all and adopt the new identity."""
        found = store_identity(self.durable, create=False)
        if found == self.identity:
            return True
        log.warning("local tier: the store %s has identity %s, its local copies were made for %s: discarding them",
                    self.url, found, self.identity)  # fmt: skip
        for commit in list(self.commits.values()):
            self.drop(commit.ref, why=f"the durable store's identity is now {found}")
        self.conflicts.clear()
        with contextlib.suppress(CairnError):  # every local object, manifests first
            keys = [o.key for o in self.local.list() if o.key != DURABLE_NAME]
            self.local.delete(sorted(keys, key=lambda k: not k.endswith(MANIFEST_NAME)))
        self.identity = found
        self._record()
        return False

    def _record(self) -> None:
        body = json.dumps({"url": self.durable.url, "store_id": self.identity}).encode()
        self.local.write_object(DURABLE_NAME, [body], size=len(body))

    def recover(self) -> None:
        """On opening: record this directory's local commits, delete what no commit needs
        (a crashed save's leftovers), and queue the commits not uploaded yet."""
        try:
            self.identity = read_record(self.local, DURABLE_NAME, what="local tier record").get("store_id")
        except ObjectNotFoundError:
            self.identity = store_identity(self.durable, create=False)  # new: made for this store
        except (CairnError, ValueError, AttributeError):
            self.identity = None  # unreadable, or written before identities were recorded
        if self.check_identity():
            self._record()
        objects = {o.key: o for o in self.local.list()}
        manifests = []
        for key in sorted(objects):
            found = parse_checkpoint_key(key)
            if found is not None and found.is_manifest and found.kind == CheckpointKind.TRAINING.value:
                manifests.append(CheckpointRef(self.url, found.run_id, CheckpointKind.TRAINING, found.step))
        manifests.sort(key=lambda r: objects[manifest_key(*_key(r))].mtime)
        queued = [r for r in manifests if self._register(r, uploaded=_marker(r) in objects)]
        with self.node.lock:
            needed = set(self._refs)
        stray = [k for k in objects if k not in needed and not k.startswith(STATE) and not k.endswith("latest.json")]
        with contextlib.suppress(CairnError):
            self.local.delete(stray)
        for ref in queued:
            if not self.commits[_key(ref)].uploaded:
                log.info("local tier: %s was committed locally and not uploaded: uploading it", ref)
                self.node.uploader.submit(self, ref)


def _marker(ref: CheckpointRef) -> str:
    return f"{UPLOADED}{ref.run_id}/{ref.kind.value}/{ref.step:012d}"
