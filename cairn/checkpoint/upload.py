"""Copying one committed checkpoint from a node-local tier to the durable store, verified.

``checkpoint_objects`` names every object a committed manifest needs besides itself (its
shards, linked shards of other checkpoints, rank indexes, history segments), each with the
checksums its bytes must match. ``upload_checkpoint`` streams each object the durable store
does not hold yet from the local store in ``PIECE`` pieces (memory: one piece per object in
flight, plus the store's own multipart buffers), hashing on the way; an object whose bytes do
not match raises ``IntegrityError`` before its last piece is handed over, so the durable write
never completes. Only then is the manifest committed there by ``put_if_absent`` (the durable
store never holds a torn checkpoint), and the durable latest pointer advanced. Idempotent: an
object already durable at its size is not sent again, and an identical durable commit is
success; a different one is ``CheckpointConflictError``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Protocol

from blake3 import blake3

from cairn import faults
from cairn.checkpoint.codec import frame_spans
from cairn.checkpoint.history import segment_key
from cairn.checkpoint.index import expand
from cairn.checkpoint.latest import advance_latest
from cairn.checkpoint.layout import checkpoint_prefix, manifest_key, shard_object_key
from cairn.checkpoint.manifest import Manifest
from cairn.checkpoint.options import resolve_options
from cairn.checkpoint.reader import manifest_bytes, read_manifest, verify_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.tensors import CHECKSUM_PREFIX
from cairn.errors import (
    CheckpointConflictError,
    CheckpointError,
    CheckpointNotFoundError,
    IntegrityError,
    ObjectNotFoundError,
    StorageError,
)
from cairn.stores.base import Store

__all__ = [
    "PIECE",
    "NeededObject",
    "checkpoint_objects",
    "UploadOutcome",
    "upload_checkpoint",
    "require_durable",
    "Uploads",
    "Uploader",
    "TierStats",
    "LocalCommit",
]

PIECE = 8 << 20
"""Bytes read from the local tier per call while an object streams to the durable store."""
_ITEM = 8  # history values are float64


@dataclass
class NeededObject:
    key: str
    size: int
    ranges: list[tuple[int, int, str]] = field(default_factory=list)
    """(offset, length, checksum) ranges of the object whose bytes are checked on the way."""


def checkpoint_objects(manifest: Manifest) -> dict[str, NeededObject]:
    """Every object ``manifest`` (read with its rank indexes: ``read_manifest``) needs besides
    itself, by store key."""
    run, kind, step = manifest.run_id, manifest.kind.value, manifest.step
    indexed = manifest.indexes is not None
    out: dict[str, NeededObject] = {}
    for shard in manifest.shards:
        key = shard_object_key(run, kind, step, shard.key, indexed=indexed)
        out[key] = NeededObject(key, shard.bytes)
    for t in manifest.tensors:
        key = shard_object_key(run, kind, step, t.shard, indexed=indexed)
        if key in out and t.encoding is not None:  # stored frames: each checked as stored
            out[key].ranges += [
                (t.offset + a, b - a, f.checksum)
                for (_, _, a, b), f in zip(frame_spans(t), t.encoding.frames, strict=True)
            ]
        elif key in out and t.length:
            out[key].ranges.append((t.offset, t.length, t.checksum))
    for index in manifest.indexes or []:
        key = f"{checkpoint_prefix(run, kind, step)}/{index.key}"
        out[key] = NeededObject(key, index.bytes, [(0, index.bytes, index.checksum)])
    if manifest.history is not None:
        for name, series in manifest.history.series.items():
            for seg in series.segments:
                key = segment_key(run, name, seg)
                size = (seg.end - seg.start) * _ITEM
                out[key] = NeededObject(key, size, [(0, size, seg.checksum)])
    return out


def _verified_pieces(local: Store, obj: NeededObject) -> Iterator[memoryview]:
    """``obj``'s bytes from ``local`` piece by piece, each checked range hashed as it passes;
    the last piece is yielded only once every range matched."""
    ranges = sorted(obj.ranges)
    hashers = [blake3() for _ in ranges]
    pos, held = 0, None
    while pos < obj.size:
        piece = memoryview(bytearray(min(PIECE, obj.size - pos)))
        local.read_into(obj.key, pos, piece)
        end = pos + len(piece)
        for (offset, length, _), hasher in zip(ranges, hashers, strict=True):
            lo, hi = max(offset, pos), min(offset + length, end)
            if lo < hi:
                hasher.update(piece[lo - pos : hi - pos])
        if held is not None:
            yield held
        held, pos = piece, end
    for (offset, _, checksum), hasher in zip(ranges, hashers, strict=True):
        found = CHECKSUM_PREFIX + hasher.hexdigest()
        if found != checksum:
            raise IntegrityError(
                f"local tier: {obj.key}: bytes at offset {offset} do not match their checksum",
                field=obj.key,
                expected=checksum,
                found=found,
            )
    if held is not None:
        yield held


def _durable_size(store: Store, key: str) -> int | None:
    try:
        return store.size(key)
    except ObjectNotFoundError:
        return None


@dataclass(frozen=True)
class UploadOutcome:
    created: bool
    """False: an identical checkpoint was already committed in the durable store."""
    sent_bytes: int
    fingerprint: str


def upload_checkpoint(local: Store, durable: Store, ref: CheckpointRef, *, concurrency: int = 4) -> UploadOutcome:
    """Copy the checkpoint ``ref`` (its key; the store is ``local``) to ``durable``: every
    object first (checked), then the manifest by create-if-absent, then the durable latest
    pointer. Raises ``IntegrityError`` (a local object does not match its checksum, or a bad
    manifest), ``ObjectNotFoundError`` (a local object is missing), ``CheckpointConflictError``
    (the durable store committed other content under the key), ``StorageError``."""
    local_ref = CheckpointRef(local.url, ref.run_id, ref.kind, ref.step)
    options = resolve_options(None)
    raw = manifest_bytes(local, local_ref, options.limits)  # read once: these bytes are checked, then sent
    manifest = verify_manifest(raw, local_ref, expect_kind=None, options=options)
    if manifest.indexes is not None:
        manifest = expand(local, local_ref, manifest, workers=2 * options.max_workers)
    needed = checkpoint_objects(manifest)
    missing = [o for o in needed.values() if _durable_size(durable, o.key) != o.size]
    own = f"{checkpoint_prefix(ref.run_id, ref.kind.value, ref.step)}/"

    def send(obj: NeededObject) -> int:
        durable.write_object(obj.key, _verified_pieces(local, obj), size=obj.size)
        return obj.size

    with ThreadPoolExecutor(max_workers=max(1, concurrency), thread_name_prefix="cairn-tier-upload") as pool:
        sent = sum(pool.map(send, missing))
    faults.maybe_crash("tier-mid-upload", step=ref.step)
    key = manifest_key(ref.run_id, ref.kind, ref.step)
    durable_ref = CheckpointRef(durable.url, ref.run_id, ref.kind, ref.step)
    created = durable.put_if_absent(key, raw)
    if not created and manifest_bytes(durable, durable_ref, options.limits) != raw:
        # Another attempt's commit (or a damaged one): it must check out as any read does, and hold
        # this very content; a commit every reader would refuse is never taken for ours.
        try:
            existing = read_manifest(durable, durable_ref, expect_kind=None, options=options, expand_index=False)
        except CheckpointNotFoundError:
            raise
        except CheckpointError as exc:  # not a commit at all: the local copy is not at fault
            raise CheckpointConflictError(
                f"{durable.url}/{key} holds an object Cairn did not commit ({exc.type_name}: {exc})", field="manifest"
            ) from exc
        if existing.fingerprint != manifest.fingerprint:
            _drop_unreferenced(durable, ref, own, needed)
            raise CheckpointConflictError(
                f"{durable.url}/{key} holds another checkpoint than the local tier's",
                field="fingerprint",
                expected=manifest.fingerprint,
                found=existing.fingerprint,
            )
    if not created:
        _drop_unreferenced(durable, ref, own, needed)
    advance_latest(durable, durable_ref, manifest.fingerprint)
    return UploadOutcome(created=created, sent_bytes=sent, fingerprint=manifest.fingerprint)


def require_durable(durable: Store, ref: CheckpointRef, fingerprint: str | None, why: str = "") -> None:
    """Require the durable commit of ``ref`` (with ``fingerprint``, when given), checked as every
    reader checks it (location, signature, layout, fingerprint: a commit they would refuse is
    not durable state): missing is a retryable ``StorageError`` (a retry restores what is
    durable), a refused manifest its ``CheckpointError``, other content ``CheckpointConflictError``."""
    durable_ref = CheckpointRef(durable.url, ref.run_id, ref.kind, ref.step)
    try:
        found = read_manifest(durable, durable_ref, expect_kind=None, expand_index=False)
    except CheckpointNotFoundError:
        raise StorageError(f"{durable_ref} is not durable{': ' + why if why else ''}") from None
    if fingerprint is not None and found.fingerprint != fingerprint:
        raise CheckpointConflictError(
            f"{durable_ref} holds another checkpoint than this segment committed",
            field="fingerprint",
            expected=fingerprint,
            found=found.fingerprint,
        )


def _drop_unreferenced(durable: Store, ref: CheckpointRef, own: str, ours: dict[str, NeededObject]) -> None:
    """After losing the commit: delete the objects of this checkpoint's prefix that this upload
    may have sent and the committed manifest does not reference (a losing writer's shards)."""
    durable_ref = CheckpointRef(durable.url, ref.run_id, ref.kind, ref.step)
    try:
        kept = set(checkpoint_objects(read_manifest(durable, durable_ref, expect_kind=None)))
    except Exception:  # noqa: BLE001 - unknown: keep everything (retention collects orphans)
        return
    durable.delete([k for k in ours if k.startswith(own) and k not in kept])


@dataclass
class TierStats:
    """What the tier did, for the worker's metrics (plain counters; read under no lock)."""

    uploaded_checkpoints: int = 0
    uploaded_bytes: int = 0
    upload_failures: int = 0
    upload_seconds: float = 0.0
    fallbacks: int = 0
    evictions: int = 0
    discarded: int = 0


@dataclass
class LocalCommit:
    """A checkpoint committed in the local tier."""

    ref: CheckpointRef
    fingerprint: str
    needed: dict[str, int]
    """Every local object it needs, its manifest included, with sizes."""
    seq: int
    uploaded: bool = False
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    attempts: int = 0


class Uploads(Protocol):
    """What the uploader drives: one try at one checkpoint (``cairn.checkpoint.tier``)."""

    def upload(self, ref: CheckpointRef, concurrency: int) -> int | None: ...


class Uploader:
    """The process's background uploader: one thread, checkpoints in commit order, each sent
    with ``concurrency`` objects in flight; a transient failure is retried after a backoff."""

    def __init__(self, concurrency: int = 4) -> None:
        self.concurrency = concurrency
        self._queue: deque[tuple[Uploads, CheckpointRef]] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def submit(self, tiered: Uploads, ref: CheckpointRef) -> None:
        with self._cond:
            self._queue.append((tiered, ref))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="cairn-tier-uploader", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue:
                    self._cond.wait()
                tiered, ref = self._queue[0]
            try:
                attempts = tiered.upload(ref, self.concurrency)
            except Exception:  # noqa: BLE001 - the thread serves every run: never let it die
                logging.getLogger("cairn.tier").exception("local tier: upload of %s failed", ref)
                attempts = 1
            with self._cond:
                if attempts is None:  # done (uploaded, discarded, gone)
                    self._queue.popleft()
                    continue
            time.sleep(min(30.0, 0.25 * 2 ** min(attempts, 7)))  # retried at the head: order kept
