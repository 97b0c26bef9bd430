"""The latest committed checkpoint of a run, found without listing the run.

A pointer ``RUN/KIND/latest.json`` (``{"step", "fingerprint"}``) names a committed step. It is
advisory: written after the commit, only forward (``advance_latest``), never trusted alone.
``latest_committed`` reads it, checks that the manifest it names exists (the commit marker),
then lists only the keys that sort after that step (``Store.list(start_after=...)``): a few
store calls however many checkpoints the run holds. Racing writers can leave it behind (the
listing after it finds the newer steps); retention or a manual delete can leave it naming a
checkpoint that no longer exists (its manifest is missing). A missing, unreadable, malformed or
dangling pointer falls back to the full listing, so the answer never depends on the pointer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from cairn.checkpoint.layout import STEP_DIGITS, latest_key, manifest_key, parse_checkpoint_key, steps_after
from cairn.checkpoint.manifest import CheckpointKind
from cairn.checkpoint.ref import CheckpointRef
from cairn.errors import CairnError, InvalidObjectError, ManifestError, ObjectNotFoundError, StorageError
from cairn.jsonio import JsonLimits, parse_json
from cairn.stores.base import Store

__all__ = ["LatestPointer", "read_latest", "advance_latest", "latest_committed"]

_MAX_POINTER_BYTES = 4096
_MAX_STEP = 10**STEP_DIGITS - 1


@dataclass(frozen=True)
class LatestPointer:
    step: int
    fingerprint: str

    def to_json_bytes(self) -> bytes:
        return json.dumps({"step": self.step, "fingerprint": self.fingerprint}, sort_keys=True).encode()


def read_latest(store: Store, run_id: str, kind: CheckpointKind) -> LatestPointer | None:
    """The pointer of ``(run_id, kind)`` as stored, or None when it is missing or not a pointer
    (unreadable, too large, malformed): unverified, it says nothing about the store."""
    key = latest_key(run_id, kind)
    try:
        raw = store.read(key)
    except (StorageError, InvalidObjectError):
        return None  # ObjectNotFoundError included: no pointer yet
    if len(raw) > _MAX_POINTER_BYTES:
        return None
    try:
        data = parse_json(raw, where=key, error=ManifestError, limits=JsonLimits(max_bytes=_MAX_POINTER_BYTES))
    except CairnError:
        return None
    step, fingerprint = (data.get("step"), data.get("fingerprint")) if isinstance(data, dict) else (None, None)
    if type(step) is not int or not 0 <= step <= _MAX_STEP or not isinstance(fingerprint, str):
        return None
    return LatestPointer(step=step, fingerprint=fingerprint)


def advance_latest(store: Store, ref: CheckpointRef, fingerprint: str) -> bool:
    """After ``ref`` is committed: point ``latest`` at it unless the pointer already names a
    higher or equal step; True if written. Advisory, so it never fails a commit: a store error
    leaves the pointer where it was (behind, never ahead) and returns False. Two writers may
    race (read, then write): the pointer can then be left behind, which costs a longer listing."""
    current = read_latest(store, ref.run_id, ref.kind)
    if current is not None and current.step >= ref.step:
        return False
    body = LatestPointer(step=ref.step, fingerprint=fingerprint).to_json_bytes()
    try:
        store.write_object(latest_key(ref.run_id, ref.kind), [body], size=len(body))
    except (StorageError, InvalidObjectError):
        return False
    return True


def _highest_manifest(store: Store, run_id: str, kind: CheckpointKind, start_after: str | None) -> int | None:
    """The highest step of ``(run_id, kind)`` with a manifest among the keys listed."""
    best: int | None = None
    for info in store.list(f"{run_id}/{kind.value}/", start_after=start_after):
        key = parse_checkpoint_key(info.key)
        if key is not None and key.is_manifest and key.run_id == run_id and key.kind == kind.value:
            best = key.step if best is None else max(best, key.step)
    return best


def latest_committed(store: Store, run_id: str, kind: CheckpointKind = CheckpointKind.TRAINING) -> CheckpointRef | None:
    """The highest committed step of this run and kind: the last durable cursor.

    With a pointer whose manifest exists: that step, or a higher committed one listed after it
    (three store calls and a listing of what follows). Otherwise the whole ``RUN/KIND/`` listing.
    """
    pointer = read_latest(store, run_id, kind)
    step: int | None = None
    if pointer is not None and _committed(store, run_id, kind, pointer.step):
        after = _highest_manifest(store, run_id, kind, steps_after(run_id, kind, pointer.step))
        step = pointer.step if after is None else max(after, pointer.step)
    else:
        step = _highest_manifest(store, run_id, kind, None)
    return None if step is None else CheckpointRef(store.url, run_id, kind, step)


def _committed(store: Store, run_id: str, kind: CheckpointKind, step: int) -> bool:
    """Whether the manifest of ``step`` exists (one HEAD or stat: the manifest is not read)."""
    try:
        store.size(manifest_key(run_id, kind, step))
    except ObjectNotFoundError:
        return False
    except InvalidObjectError:
        return False  # not a manifest this store wrote: let the full listing decide
    return True
