"""Intents: a save's notice, written before it references another checkpoint's shards.

An incremental save (``cairn.checkpoint.reuse``) writes one empty object per attempt whose
shards it is about to reference (``layout.intent_key``: the saving attempt, its rank, and the
referenced ``RUN/KIND/STEP/NONCE/``) *before* it checks that the referenced checkpoint is still
committed. Retention lists the intents *after* it has uncommitted the checkpoints it retires,
and keeps every shard under an attempt a live intent (younger than the grace period) names.
Write-then-check on one side, uncommit-then-list on the other: a save that saw its source
committed is seen by the collector, and a collector that did not see the save has already
uncommitted the source, which the save then sees. The keys alone carry the protocol (no
intent is read); intents are never deleted by their writer, only by retention once expired.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from cairn.checkpoint.layout import intent_key, intents_prefix, parse_intent_key
from cairn.stores.base import Store

__all__ = ["LiveIntents", "write_intents", "live_intents"]


def write_intents(store: Store, run_id: str, save: str, rank: int, attempts: Iterable[tuple[str, int, str]]) -> None:
    """Announce that attempt ``save`` (rank ``rank``) references shards of these attempts
    (kind, step, nonce): one empty object each, written before the save checks them."""
    for kind, step, nonce in sorted(set(attempts)):
        store.write_object(intent_key(run_id, save, rank, kind, step, nonce), [b""], size=0)


@dataclass
class LiveIntents:
    protected: set[str] = field(default_factory=set)
    """Attempt prefixes (``RUN/KIND/STEP/NONCE/``) a live intent names: nothing under them is deleted."""
    expired: list[str] = field(default_factory=list)
    """Intent keys past the grace period (their saves committed, so their roots now say what
    they reference, or died): deleted."""


def live_intents(store: Store, run_id: str, grace_seconds: float, now: float) -> LiveIntents:
    """One listing of the run's intents, split into the live ones' protection and the expired."""
    out = LiveIntents()
    for info in store.list(intents_prefix(run_id)):
        parsed = parse_intent_key(info.key)
        if parsed is None:
            continue  # not an intent (no writer makes one): neither protects nor is collected
        if now - info.mtime > grace_seconds:
            out.expired.append(info.key)
        else:
            out.protected.add(parsed[1])
    return out
