"""The run's journal: intents, observations and decisions about external effects.

Its own object (checkpoint kind ``journal``, under ``RUN/journal/VERSION``), with its own
restore rule: append-only and never rolled back. Restoring a training checkpoint restores
training state only; it never replays, undoes or forgets a journal entry. Each append commits
a new version by create-if-absent (optimistic concurrency: a writer that loses re-reads and
retries), and an entry already present is not appended twice, so a retried activity leaves
one entry.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from cairn.checkpoint.commit import write_checkpoint
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.latest import latest_committed
from cairn.checkpoint.manifest import CheckpointKind
from cairn.checkpoint.reader import read_manifest
from cairn.errors import CheckpointConflictError, StorageError
from cairn.stores.base import Store

__all__ = ["JournalEntry", "Journal", "load_journal", "append_entry"]


class JournalEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["intent", "observation", "decision"]
    effect: str
    """reserve | publish | release | rollback | ..."""
    key: str | None = None
    """The idempotency key the effect was (or will be) sent with."""
    receipt: str | None = None
    """What came back: reservation id, registry entry, ..."""
    detail: dict[str, Any] = Field(default_factory=dict)

    def same_as(self, other: JournalEntry) -> bool:
        return (self.kind, self.effect, self.key, self.receipt) == (other.kind, other.effect, other.key, other.receipt)


class Journal(BaseModel):
    run_id: str
    version: int = 0
    entries: list[JournalEntry] = Field(default_factory=list)

    def pending_intents(self) -> list[JournalEntry]:
        """Intents with no observation for the same key: outcome unknown until reconciled."""
        observed = {e.key for e in self.entries if e.kind == "observation"}
        return [e for e in self.entries if e.kind == "intent" and e.key not in observed]

    def receipt_for(self, key: str) -> str | None:
        for e in self.entries:
            if e.kind == "observation" and e.key == key:
                return e.receipt
        return None


def load_journal(store: Store, run_id: str) -> Journal:
    """The latest committed version (an empty journal if none)."""
    ref = latest_committed(store, run_id, CheckpointKind.JOURNAL)
    if ref is None:
        return Journal(run_id=run_id)
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.JOURNAL)
    entries = [JournalEntry.model_validate(e) for e in manifest.meta.get("entries", [])]
    return Journal(run_id=run_id, version=ref.step, entries=entries)


def append_entry(store: Store, run_id: str, entry: JournalEntry, attempts: int = 20) -> Journal:
    """Append ``entry`` unless an identical one is already there; returns the journal after."""
    for _ in range(attempts):
        journal = load_journal(store, run_id)
        if any(e.same_as(entry) for e in journal.entries):
            return journal
        entries = [*journal.entries, entry]
        content = CheckpointContent(
            kind=CheckpointKind.JOURNAL,
            run_id=run_id,
            step=journal.version + 1,
            meta={"entries": [e.model_dump(mode="json") for e in entries]},
        )
        try:
            write_checkpoint(store, content, {})
        except CheckpointConflictError:
            continue  # another writer appended first: re-read and try again
        return Journal(run_id=run_id, version=journal.version + 1, entries=entries)
    raise StorageError(f"journal of {run_id}: could not append after {attempts} attempts (contention)")
