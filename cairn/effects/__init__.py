"""External side effects, exactly once: idempotency keys, receipts, the journal, the client.

Restoring a training checkpoint repeats arithmetic but never undoes an effect that committed
elsewhere. So every effect carries a key derived from (workflow id, activity id) — stable
across retries and continue-as-new, never the attempt number or the run id — the service
deduplicates on it, and its receipt is recorded in the run's journal, an object separate from
training checkpoints with its own restore rule (append-only; never rolled back).

Modules: ``keys`` (idempotency keys), ``client`` (the reservation service's client),
``journal`` (intents, observations and decisions), ``registry`` (a checkpoint reference published
by conditional write).
"""

from cairn.effects.client import Reservation, ReservationClient
from cairn.effects.journal import Journal, JournalEntry, append_entry, load_journal
from cairn.effects.keys import effect_key
from cairn.effects.registry import PublishedModel, publish_model, published_entries

__all__ = [
    "Journal",
    "JournalEntry",
    "PublishedModel",
    "Reservation",
    "ReservationClient",
    "append_entry",
    "effect_key",
    "load_journal",
    "publish_model",
    "published_entries",
]
