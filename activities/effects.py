"""Effect activities: reserve capacity, publish the model, release capacity, record decisions.

One rule for every effect: the key is ``effect_key(workflow_id, activity_id)``; the intent is
journaled before the call, the receipt after. A retry that finds a pending intent (the outcome
was never observed — e.g. the worker died after the service committed) asks the service what
happened under that key instead of assuming the effect did not happen.
"""

from __future__ import annotations

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities import metrics as m
from activities.edge import Heartbeater, activity_errors, heartbeat_interval, open_run_store
from activities.inputs import DecisionInput, EffectInput, EffectReceipt
from activities.log_context import run_context
from cairn import faults
from cairn.effects import (
    JournalEntry,
    PublishedModel,
    ReservationClient,
    append_entry,
    effect_key,
    load_journal,
    publish_model,
)
from cairn.stores import open_store

__all__ = ["reserve_capacity", "publish_checkpoint", "release_capacity", "record_decision", "EFFECT_ACTIVITIES"]


def _outcome(receipt: EffectReceipt) -> EffectReceipt:
    outcome = "reconciled" if receipt.reconciled else "replayed" if receipt.replayed else "performed"
    m.EFFECTS.labels(receipt.effect, outcome).inc()
    return receipt


def _key() -> str:
    info = activity.info()
    return effect_key(info.workflow_id, info.activity_id)


def _begin(inp: EffectInput, effect: str, key: str, detail: dict[str, object]) -> tuple[str | None, bool]:
    """Journal the intent. Returns (receipt already observed, intent was pending)."""
    store, run_id = open_run_store(inp.store, inp.store_id), inp.run_id
    journal = load_journal(store, run_id)
    receipt = journal.receipt_for(key)
    if receipt is not None:
        return receipt, False
    pending = any(e.key == key for e in journal.pending_intents())
    if not pending:
        append_entry(store, run_id, JournalEntry(kind="intent", effect=effect, key=key, detail=detail))
    return None, pending


def _observe(store_url: str, run_id: str, effect: str, key: str, receipt: str, **detail: object) -> None:
    append_entry(
        open_store(store_url),
        run_id,
        JournalEntry(kind="observation", effect=effect, key=key, receipt=receipt, detail=dict(detail)),
    )


@activity.defn(name="reserve_capacity")
def reserve_capacity(inp: EffectInput) -> EffectReceipt:
    key = _key()
    spec = inp.effects
    with run_context(inp.run_id), activity_errors(), Heartbeater(heartbeat_interval(), phase="effect"):
        known, pending = _begin(inp, "reserve", key, {"resource": spec.resource, "units": spec.units})
        if known is not None:
            return _outcome(EffectReceipt(effect="reserve", key=key, receipt=known, replayed=True))
        client = ReservationClient(spec.service_url)
        if pending:
            outcome = client.lookup(key)  # ask, never assume it did not happen
            if outcome is not None:
                receipt = outcome["response"]["reservation_id"]
                _observe(inp.store, inp.run_id, "reserve", key, receipt, reconciled=True)
                return _outcome(EffectReceipt(effect="reserve", key=key, receipt=receipt, reconciled=True))
        reservation = client.reserve(key, spec.resource, spec.units, run_id=inp.run_id)
        faults.maybe_crash("after-effect-before-complete", tag="reserve")
        _observe(inp.store, inp.run_id, "reserve", key, reservation.reservation_id, replayed=reservation.replayed)
        return _outcome(
            EffectReceipt(effect="reserve", key=key, receipt=reservation.reservation_id, replayed=reservation.replayed)
        )


@activity.defn(name="publish_checkpoint")
def publish_checkpoint(inp: EffectInput) -> EffectReceipt:
    key = _key()
    with run_context(inp.run_id), activity_errors(), Heartbeater(heartbeat_interval(), phase="effect"):
        if inp.checkpoint is None or inp.fingerprint is None:
            raise ApplicationError("publish needs the final checkpoint and fingerprint", non_retryable=True)
        known, _pending = _begin(inp, "publish", key, {"checkpoint": inp.checkpoint})
        if known is not None:
            return _outcome(EffectReceipt(effect="publish", key=key, receipt=known, replayed=True))
        # The registry write is itself keyed and conditional: re-sending is the reconciliation.
        registry = open_store(inp.effects.registry or inp.store)
        entry = PublishedModel(run_id=inp.run_id, checkpoint=inp.checkpoint, fingerprint=inp.fingerprint, key=key)
        path, created = publish_model(registry, entry)
        faults.maybe_crash("after-effect-before-complete", tag="publish")
        _observe(inp.store, inp.run_id, "publish", key, path, created=created)
        return _outcome(EffectReceipt(effect="publish", key=key, receipt=path, replayed=not created))


@activity.defn(name="release_capacity")
def release_capacity(inp: EffectInput) -> EffectReceipt:
    key = _key()
    with run_context(inp.run_id), activity_errors(), Heartbeater(heartbeat_interval(), phase="effect"):
        if inp.reservation_id is None:
            raise ApplicationError("release needs the reservation id", non_retryable=True)
        known, _pending = _begin(inp, "release", key, {"reservation": inp.reservation_id, "reason": inp.reason})
        if known is not None:
            return _outcome(EffectReceipt(effect="release", key=key, receipt=known, replayed=True))
        released = ReservationClient(inp.effects.service_url).release(key, inp.reservation_id)
        faults.maybe_crash("after-effect-before-complete", tag="release")
        receipt = f"{released.reservation_id} {released.status}"
        _observe(inp.store, inp.run_id, "release", key, receipt, reason=inp.reason)
        return _outcome(EffectReceipt(effect="release", key=key, receipt=receipt, replayed=released.replayed))


@activity.defn(name="record_decision")
def record_decision(inp: DecisionInput) -> int:
    """Journal a workflow decision (e.g. a rollback and what it does not undo)."""
    with run_context(inp.run_id), activity_errors(), Heartbeater(heartbeat_interval(), phase="effect"):
        entry = JournalEntry(kind="decision", effect=inp.decision, key=_key(), detail=dict(inp.detail))
        return append_entry(open_run_store(inp.store, inp.store_id), inp.run_id, entry).version


EFFECT_ACTIVITIES = [reserve_capacity, publish_checkpoint, release_capacity, record_decision]
