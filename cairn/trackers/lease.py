"""Who may write to a tracker sink now: a lease on the sink's cursor log, with fencing.

An export claims the sink before it asks or writes (``SinkLease.acquire``): it appends a cursor
entry naming itself (``owner``, a fresh token per export) and ``lease_until`` (now + the lease).
Before each sink write and before it confirms, it reads the log again (``check``, ``confirm``)
and goes on only while its own entry is still the latest and its lease has at least ``margin``
left, renewing the lease by appending the next entry; otherwise it stops without writing:
``EffectUnavailableError`` (retryable), "superseded". While the sink works the lease is renewed
from a background thread (``renewing``), so a slow write keeps it and a frozen process loses it.
An export that finds another's unexpired claim waits, polling the log, at most ``wait``, until
the claim is released or expires; the cursor it then claims says whether to ask the sink.

The lease is the activity's heartbeat timeout (``LeaseTerms.for_heartbeat_timeout``): a frozen
attempt's claim runs out when the server gives the attempt up, and the attempt, thawed, finds
it gone. Clocks: ``lease_until`` is written on one machine's clock and read on another's, so the
exporters' clocks must agree within ``margin`` (a quarter of the lease). A sink call already
under way when its process froze still lands (``docs/how-to/trackers.md``).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from cairn.errors import CairnError, EffectUnavailableError
from cairn.stores.base import Store
from cairn.trackers.cursor import TrackerCursor, append_cursor, cursor_prefix, read_cursor

__all__ = ["LEASE_SECONDS", "LeaseTerms", "SinkLease"]

LEASE_SECONDS = 10.0
"""The lease when no heartbeat timeout says otherwise: a run's default heartbeat timeout."""


@dataclass(frozen=True)
class LeaseTerms:
    """How long a claim holds a sink, and what follows from it."""

    seconds: float = LEASE_SECONDS

    @classmethod
    def for_heartbeat_timeout(cls, timeout: float | None) -> LeaseTerms:
        """The lease of an activity with this heartbeat timeout: the same span."""
        return cls(LEASE_SECONDS if timeout is None else timeout)

    @property
    def margin(self) -> float:
        """The least lease a claim must have left to write (and the clock skew it tolerates)."""
        return self.seconds / 4

    @property
    def renew_every(self) -> float:
        return self.seconds / 4

    @property
    def wait(self) -> float:
        """How long an export waits for another's claim: long enough for a dead holder's to run out."""
        return self.seconds + self.margin

    @property
    def poll(self) -> float:
        return min(0.5, self.seconds / 20)


def _now() -> datetime:
    return datetime.now(UTC)


class SinkLease:
    """One export's claim on a sink: ``acquire``, then ``check`` before each write (``renewing``
    around each sink call), then ``confirm``; ``release`` when it stops short.

    ``stop`` (None, or why this export must stop: its activity was cancelled or superseded) is
    asked before claiming, while waiting and before each write; ``progress`` hears ``waiting``."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        cursor: TrackerCursor,
        terms: LeaseTerms,
        *,
        stop: Callable[[], str | None] | None = None,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.store, self.run_id, self.terms = store, run_id, terms
        self.cursor = cursor
        """This export's latest entry once acquired (else the latest entry it read)."""
        self.token = uuid.uuid4().hex
        self.waited = 0.0
        self._stop, self._progress = stop, progress
        self._lock = threading.Lock()

    @property
    def field(self) -> str:
        return cursor_prefix(self.run_id, self.cursor.sink)

    def _latest(self) -> TrackerCursor:
        c = self.cursor
        return read_cursor(self.store, self.run_id, c.sink, c.kind, c.destination)

    def _stop_if_asked(self) -> None:
        why = self._stop() if self._stop is not None else None
        if why is not None:
            raise EffectUnavailableError(f"{why}: this export stopped before writing", field=self.field)

    def acquire(self, needed: Callable[[TrackerCursor], bool]) -> TrackerCursor | None:
        """Claim the sink, waiting (at most ``terms.wait``) while another export's unexpired
        claim holds it. The cursor as it stood when claimed (its ``pending`` and ``known`` say
        whether to ask the sink what it holds), or None, unclaimed, once ``needed`` says the
        cursor asks nothing of this export (``cursor`` is then the one it read)."""
        started = time.monotonic()
        while True:
            self._stop_if_asked()
            found = self._latest()
            if not needed(found):
                self.cursor = found
                return None
            left = found.lease_left(_now()) if found.owner != self.token else 0.0
            if left > 0:
                self.waited = time.monotonic() - started
                if self.waited >= self.terms.wait:
                    raise EffectUnavailableError(
                        f"another export holds this tracker (waited {self.waited:.1f} s)",
                        field=self.field,
                        expected="its claim released or expired",
                        found=f"owner {found.owner[:8]} until {found.lease_until}",
                    )
                if self._progress is not None:
                    self._progress("waiting")
                time.sleep(min(self.terms.poll, left))
                continue
            claimed = append_cursor(self.store, self.run_id, found, owner=self.token, lease_until=self._until())
            if claimed is not None:
                self.cursor = claimed
                return found

    def _until(self) -> datetime:
        return _now() + timedelta(seconds=self.terms.seconds)

    def _hold(self, **fields: Any) -> TrackerCursor:
        """Fenced append: this export's entry must be the latest with ``margin`` left; the next
        entry renews the lease (with ``fields``)."""
        with self._lock:
            mine = self.cursor
        latest = self._latest()
        left = latest.lease_left(_now())
        if latest.version != mine.version or latest.owner != self.token or left < self.terms.margin:
            raise self._superseded(mine, latest, left)
        held = append_cursor(self.store, self.run_id, latest, **{"lease_until": self._until(), **fields})
        if held is None:
            raise self._superseded(mine, self._latest(), left)
        with self._lock:
            self.cursor = held
        return held

    def _superseded(self, mine: TrackerCursor, latest: TrackerCursor, left: float) -> EffectUnavailableError:
        who = "this export" if latest.owner == self.token else f"export {latest.owner[:8]}" if latest.owner else "none"
        return EffectUnavailableError(
            "superseded: this export no longer holds the tracker and stopped before writing",
            field=self.field,
            expected=f"entry {mine.version} by this export, the latest, with {self.terms.margin:.1f} s of lease left",
            found=f"entry {latest.version} held by {who}, {left:.1f} s left",
        )

    def check(self, **fields: Any) -> None:
        """Before a sink write: go on only while this export holds the sink (see ``_hold``) and
        ``stop`` says nothing; renews the lease, recording ``fields`` (e.g. ``pending``)."""
        self._stop_if_asked()
        self._hold(**fields)

    @contextmanager
    def renewing(self) -> Iterator[None]:
        """Keep the lease while the sink works (a background thread renews it every
        ``terms.renew_every``; it stops once the lease is lost, and the next ``check`` says so)."""
        done = threading.Event()

        def renew() -> None:
            while not done.wait(self.terms.renew_every):
                try:
                    self._hold()
                except EffectUnavailableError:
                    return
                except CairnError:  # the store hiccupped: try again; the lease still runs
                    continue

        thread = threading.Thread(target=renew, name="cairn-tracker-lease", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def confirm(self, step: int) -> TrackerCursor:
        """The sink holds every point through ``step``: record it and release the sink (fenced like
        ``check``; a pending range past ``step`` stays for the next export to ask about)."""
        pending = self.cursor.pending
        keep = pending if pending is not None and pending[1] > step else None
        return self._hold(confirmed=step, pending=keep, owner="", lease_until=None)

    def release(self) -> None:
        """Give the sink up without confirming (a pending range stays: the next export asks the
        sink); nothing when another export holds it now, or the store cannot be written (the
        lease runs out)."""
        try:
            latest = self._latest()
            if latest.version == self.cursor.version and latest.owner == self.token:
                append_cursor(self.store, self.run_id, latest, owner="", lease_until=None)
        except CairnError:
            return
