"""The latest committed checkpoint of a run, found without listing the run.

A pointer ``RUN/KIND/latest.json`` (``{"step", "fingerprint"}``) names a committed step. It is
advisory: written after the commit, only forward (``advance_latest``), never trusted alone.
``latest_committed`` reads it (bounded: ``MAX_POINTER_BYTES``), checks that the checkpoint it
names is committed by the one rule (``cairn.checkpoint.committed``: the manifest there reads,
matches its place, is signed when a key is configured), then lists only the keys that sort
after that step (``Store.list(start_after=...)``) and judges those from the highest down: a few
store calls however many checkpoints the run holds, and a foreign object at a higher step is
passed over, never taken for the latest. Racing writers can leave the pointer behind (the
listing after it finds the newer steps); retention or a manual delete can leave it naming a
checkpoint that no longer exists. A missing, unreadable, malformed or dangling pointer, or one
naming a foreign object, falls back to the full listing, so the answer never depends on it.
``latest_cursor`` is the same answer with the manifest that judged it: a run's last durable
cursor and its fingerprint, for every caller that needs both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import NamedTuple

from cairn.checkpoint.committed import Verdict, highest_verdict, judge, judge_each, manifest_candidates
from cairn.checkpoint.layout import STEP_DIGITS, latest_key, steps_after
from cairn.checkpoint.manifest import CheckpointKind, Manifest
from cairn.checkpoint.options import CheckpointOptions, resolve_options
from cairn.checkpoint.ref import CheckpointRef
from cairn.errors import CairnError, InvalidObjectError, StorageError
from cairn.stores.base import Store
from cairn.stores.objects import MAX_POINTER_BYTES, read_json_object

__all__ = ["LatestPointer", "read_latest", "advance_latest", "latest_committed", "LatestCursor", "latest_cursor"]

_MAX_STEP = 10**STEP_DIGITS - 1


@dataclass(frozen=True)
class LatestPointer:
    step: int
    fingerprint: str

    def to_json_bytes(self) -> bytes:
        return json.dumps({"step": self.step, "fingerprint": self.fingerprint}, sort_keys=True).encode()


def read_latest(store: Store, run_id: str, kind: CheckpointKind) -> LatestPointer | None:
    """The pointer of ``(run_id, kind)`` as stored, or None when it is missing or not a pointer
    (unreadable, too large — refused by its size, unread —, malformed): unverified, it says
    nothing about the store."""
    try:
        data = read_json_object(store, latest_key(run_id, kind), max_bytes=MAX_POINTER_BYTES, what="latest pointer")
    except CairnError:
        return None  # ObjectNotFoundError included: no pointer yet
    step, fingerprint = data.get("step"), data.get("fingerprint")
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


def latest_committed(
    store: Store,
    run_id: str,
    kind: CheckpointKind = CheckpointKind.TRAINING,
    options: CheckpointOptions | None = None,
) -> CheckpointRef | None:
    """The highest committed step of this run and kind: the last durable cursor.

    With a pointer naming a committed checkpoint: that step, or a higher committed one listed
    after it. Otherwise the whole ``RUN/KIND/`` listing. Committed means what
    ``cairn.checkpoint.committed`` says (``options``: whose signer applies; a caller at an edge
    may pass none and get the configured ones)."""
    verdict = _latest(store, run_id, kind, resolve_options(options))
    return None if verdict is None else verdict.ref


class LatestCursor(NamedTuple):
    """A run's latest committed checkpoint (its last durable cursor) and that checkpoint's
    fingerprint, with the root manifest the commit rule judged it by (its config, lineage)."""

    ref: CheckpointRef
    fingerprint: str
    manifest: Manifest


def latest_cursor(
    store: Store,
    run_id: str,
    options: CheckpointOptions,
    *,
    kind: CheckpointKind = CheckpointKind.TRAINING,
    at_or_before: int | None = None,
) -> LatestCursor | None:
    """``latest_committed`` with its manifest (read once, by the judgement itself); with
    ``at_or_before``, the highest committed step at or before it (a rollback's target)."""
    if at_or_before is None:
        verdict = _latest(store, run_id, kind, options)
    else:
        refs, _ = manifest_candidates(store, run_id, kind)
        below = reversed([r for r in refs if r.step <= at_or_before])
        verdict = next((v for v in judge_each(store, below, options) if v.committed), None)
    if verdict is None or verdict.manifest is None:
        return None
    return LatestCursor(verdict.ref, verdict.manifest.fingerprint, verdict.manifest)


def _latest(store: Store, run_id: str, kind: CheckpointKind, options: CheckpointOptions) -> Verdict | None:
    """The verdict on the latest committed checkpoint (see ``latest_committed``)."""
    pointer = read_latest(store, run_id, kind)
    if pointer is not None:
        at = CheckpointRef(store.url, run_id, kind, pointer.step)
        verdict = judge(store, at, options)
        if verdict is not None and verdict.committed:
            after = highest_verdict(store, run_id, kind, options, start_after=steps_after(run_id, kind, pointer.step))
            return after or verdict
    return highest_verdict(store, run_id, kind, options)
