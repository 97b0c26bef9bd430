"""Intents: a save's notice, written before it references another checkpoint's shards.

An incremental save (``cairn.checkpoint.reuse``) writes one empty object per attempt whose
shards it is about to reference (``layout.intent_key``: the saving attempt, its rank, and the
referenced ``RUN/KIND/STEP/NONCE/``) *before* it checks that the referenced checkpoint is still
committed. Retention lists the intents *after* it has uncommitted the checkpoints it retires,
and keeps every shard under an attempt a live intent (younger than ``INTENT_GRACES`` grace
periods) names. Write-then-check on one side, uncommit-then-list on the other: a save that saw
its source committed is seen by the collector, and a collector that did not see the save has
already uncommitted the source, which the save then sees. The keys alone carry the protocol (no
intent is read); intents are never deleted by their writer, only by retention once expired (a
run without retention keeps them until a ``cairn ckpt gc``).

Why two grace periods: a GC pass that listed the run's objects before a save committed (so it
did not see the save's root links) relies on the save's intent, written when the save began,
being live when the pass lists intents — up to a save's time plus a pass's time after it was
written. Each is assumed to be under the grace period (as for orphans), so the sum is under
two.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from cairn.checkpoint.layout import intent_key, intents_prefix, parse_intent_key
from cairn.stores.base import Store

__all__ = ["INTENT_GRACES", "LiveIntents", "write_intents", "live_intents", "intent_expired"]

INTENT_GRACES = 2
"""An intent protects its attempts for this many grace periods (see the module)."""


def intent_expired(mtime: float, grace_seconds: float, now: float) -> bool:
    """An intent written at ``mtime`` no longer protects anything (its save committed or died)."""
    return now - mtime > INTENT_GRACES * grace_seconds


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
    """Intent keys past ``INTENT_GRACES`` grace periods (their saves committed, so their roots
    now say what they reference, or died): deleted."""


def live_intents(store: Store, run_id: str, grace_seconds: float, now: float) -> LiveIntents:
    """One listing of the run's intents, split into the live ones' protection and the expired."""
    out = LiveIntents()
    for info in store.list(intents_prefix(run_id)):
        parsed = parse_intent_key(info.key)
        if parsed is None:
            continue  # not an intent (no writer makes one): neither protects nor is collected
        if intent_expired(info.mtime, grace_seconds, now):
            out.expired.append(info.key)
        else:
            out.protected.add(parsed[1])
    return out
