"""A tracker sink's durable progress: its cursor, a numbered log in the run's store.

``RUN/trackers/SINK/SEQ.json`` (``cairn.stores.numbered``: create-if-absent, so of two writers
racing for one number exactly one wins). Each entry is the whole cursor: ``confirmed``, the step
through which the sink holds every committed point of the run (written after the sink confirmed
them); ``pending``, the range an export announced before it wrote to the sink and has not
confirmed (a worker killed in between leaves it; the next export asks the sink how far it got);
``owner`` and ``lease_until``, the export that holds the sink and until when
(``cairn.trackers.lease``; entries written before the lease read as held by none).

An entry is appended only right after the entry its writer read (``append_cursor``), so
``confirmed`` never moves back, whoever writes. Only the last ``KEEP`` entries are kept.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError

from cairn.checkpoint.layout import trackers_prefix
from cairn.errors import InvalidObjectError, ObjectNotFoundError, StorageError
from cairn.stores.base import Store
from cairn.stores.numbered import NumberedLog
from cairn.stores.objects import read_record

__all__ = ["TrackerCursor", "sink_id", "cursor_prefix", "read_cursor", "append_cursor", "KEEP"]

KEEP = 3
"""Cursor entries kept per sink (older ones are deleted after each append)."""
READS = 5
"""Tries at reading the latest entry (another writer may delete it between listing and reading)."""


def sink_id(kind: str, destination: dict[str, str]) -> str:
    """A sink's stable name: its kind and a digest of where it writes, so another destination
    (another log dir, tracking server, project) gets its own cursor and is fed from step 0."""
    digest = hashlib.sha256(json.dumps(destination, sort_keys=True).encode()).hexdigest()[:16]
    return f"{kind}-{digest}"


def cursor_prefix(run_id: str, sink: str) -> str:
    return trackers_prefix(run_id, sink)


class TrackerCursor(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    sink: str
    kind: str
    destination: dict[str, str] = Field(default_factory=dict)
    confirmed: int = Field(default=0, ge=0)
    """Every committed point of steps up to this one is in the sink."""
    pending: tuple[int, int] | None = None
    """(after, through): an export announced it would write these steps and did not confirm."""
    owner: str = ""
    """The export that holds the sink (a fresh token per export; empty: none holds it)."""
    lease_until: AwareDatetime | None = None
    """When the owner's claim expires unless renewed (its own clock)."""
    at: str = ""
    version: int = Field(default=-1, exclude=True)
    """The log entry this cursor was read from (-1: none yet)."""

    @property
    def known(self) -> bool:
        """Some export wrote this cursor before (else the sink is asked what it holds)."""
        return self.version >= 0

    def lease_left(self, now: datetime) -> float:
        """Seconds the owner's claim still holds at ``now`` (0: expired, released or never claimed)."""
        if not self.owner or self.lease_until is None:
            return 0.0
        return max(0.0, (self.lease_until - now).total_seconds())


def _log(store: Store, run_id: str, sink: str) -> NumberedLog:
    return NumberedLog(store, cursor_prefix(run_id, sink))


def read_cursor(store: Store, run_id: str, sink: str, kind: str, destination: dict[str, str]) -> TrackerCursor:
    """The sink's latest cursor (one at step 0, ``known`` False, when it has none)."""
    log = _log(store, run_id, sink)
    for _ in range(READS):
        entries = log.entries()
        if not entries:
            return TrackerCursor(sink=sink, kind=kind, destination=destination)
        seq, key = entries[-1]
        try:
            body = read_record(store, key, what="tracker cursor")
        except ObjectNotFoundError:  # deleted behind a newer entry: list again
            continue
        try:
            cursor = TrackerCursor.model_validate(body)
        except ValidationError as exc:
            raise InvalidObjectError(
                "tracker cursor does not match its schema", field=key, found=str(exc)[:200]
            ) from None
        return cursor.model_copy(update={"version": seq})
    raise StorageError(f"tracker cursor {sink}: its latest entry vanished {READS} times in a row", field=log.prefix)


def append_cursor(store: Store, run_id: str, after: TrackerCursor, **fields: Any) -> TrackerCursor | None:
    """Append the entry that follows ``after`` (the latest entry its writer read): ``after`` with
    ``fields``, ``confirmed`` never below ``after``'s. None when another writer appended first
    (read again and decide again). Entries past ``KEEP`` are deleted."""
    log = _log(store, run_id, after.sink)
    entries = log.entries()
    if (entries[-1][0] if entries else -1) != after.version:
        return None
    now = datetime.now(UTC).isoformat(timespec="milliseconds")
    new = after.model_copy(update={**fields, "at": now})
    new = new.model_copy(update={"confirmed": max(new.confirmed, after.confirmed)})
    seq = log.try_append(entries, new.model_dump_json().encode())
    if seq is None or log.entries()[-1][0] != seq:  # lost the race, or took a number deleted behind a newer one
        return None
    store.delete(key for _, key in entries[: max(0, len(entries) + 1 - KEEP)])
    return new.model_copy(update={"version": seq})
