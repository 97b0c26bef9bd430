"""A tracker sink's durable progress: its cursor, a numbered log in the run's store.

``RUN/trackers/SINK/SEQ.json`` (``cairn.stores.numbered``: create-if-absent, so of two writers
racing for one number exactly one wins). Each entry is the whole cursor: ``confirmed``, the step
through which the sink holds every committed point of the run (written after the sink confirmed
them), and ``pending``, the range an export announced before it wrote to the sink and has not
confirmed (a worker killed in between leaves it; the next export asks the sink how far it got).
``confirmed`` never moves back, whoever writes. Only the last ``KEEP`` entries are kept.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from cairn.checkpoint.layout import trackers_prefix
from cairn.errors import InvalidObjectError, StorageError
from cairn.stores.base import Store
from cairn.stores.numbered import NumberedLog
from cairn.stores.objects import read_record

__all__ = ["TrackerCursor", "sink_id", "cursor_prefix", "read_cursor", "write_cursor", "KEEP"]

KEEP = 3
"""Cursor entries kept per sink (older ones are deleted after each append)."""
ATTEMPTS = 20


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
    at: str = ""
    version: int = Field(default=-1, exclude=True)
    """The log entry this cursor was read from (-1: none yet)."""

    @property
    def known(self) -> bool:
        """Some export wrote this cursor before (else the sink is asked what it holds)."""
        return self.version >= 0


def _log(store: Store, run_id: str, sink: str) -> NumberedLog:
    return NumberedLog(store, cursor_prefix(run_id, sink))


def read_cursor(store: Store, run_id: str, sink: str, kind: str, destination: dict[str, str]) -> TrackerCursor:
    """The sink's latest cursor (one at step 0, ``known`` False, when it has none)."""
    entries = _log(store, run_id, sink).entries()
    if not entries:
        return TrackerCursor(sink=sink, kind=kind, destination=destination)
    seq, key = entries[-1]
    body = read_record(store, key, what="tracker cursor")
    try:
        cursor = TrackerCursor.model_validate(body)
    except ValidationError as exc:
        raise InvalidObjectError("tracker cursor does not match its schema", field=key, found=str(exc)[:200]) from None
    return cursor.model_copy(update={"version": seq})


def write_cursor(
    store: Store, run_id: str, cursor: TrackerCursor, *, confirmed: int, pending: tuple[int, int] | None
) -> TrackerCursor:
    """Append the next cursor: ``confirmed`` never below any cursor already written (a writer
    that loses a race re-reads and merges); older entries past ``KEEP`` are deleted."""
    log = _log(store, run_id, cursor.sink)
    for _ in range(ATTEMPTS):
        entries = log.entries()
        last = read_cursor(store, run_id, cursor.sink, cursor.kind, cursor.destination) if entries else cursor
        step = max(confirmed, last.confirmed)
        keep = pending if pending is not None and pending[1] > step else None
        now = datetime.now(UTC).isoformat(timespec="milliseconds")
        new = cursor.model_copy(update={"confirmed": step, "pending": keep, "at": now})
        seq = log.try_append(entries, new.model_dump_json().encode())
        if seq is not None:
            store.delete(key for _, key in entries[: max(0, len(entries) + 1 - KEEP)])
            return new.model_copy(update={"version": seq})
    raise StorageError(f"tracker cursor {cursor.sink}: lost {ATTEMPTS} races in a row", field=log.prefix)
