"""One export at a time writes to a sink: two exporters at once (a zombie attempt and its retry,
``cairn trackers`` beside the workflow's export) leave each step in the sink exactly once.

Each exporter runs on its own thread against an in-memory sink; a frozen exporter is one blocked
on an event (inside its write, or just before it), woken by the test once the other has moved."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

import pytest

from cairn.errors import EffectUnavailableError
from cairn.stores import MemoryStore
from cairn.stores.numbered import numbered_key
from cairn.trackers import CommittedHistory, ExportReport, PointBatch, export_committed, read_cursor, sink_id
from cairn.trackers.cursor import cursor_prefix
from tests.unit.trackers.conftest import SHORT_LEASE, CutShort, Killed, first_steps

RUN = "leased"
STEPS = 10
TIMEOUT = 30.0
"""The longest a test waits for a condition (a thread reaching a point, an export ending)."""
LONG_LEASE = 5.0
"""A lease no test outlives: the holder keeps the sink while the test drives the other export."""


def history(step: int = STEPS) -> CommittedHistory:
    return CommittedHistory(RUN, step, "ckpt", 0.0, {"loss": [1.0 / s for s in range(1, step + 1)], "lr": [0.1] * step})


class MemorySink:
    """A tracker in memory: every (metric, step) it was given, duplicates kept."""

    kind = "memory"

    def __init__(self) -> None:
        self.rows: list[tuple[str, int]] = []
        self._lock = threading.Lock()

    def destination(self) -> dict[str, str]:
        return {"name": "memory"}

    def held(self, run_id: str, names: Sequence[str]) -> Mapping[str, int]:
        with self._lock:
            return {n: max((s for k, s in self.rows if k == n), default=0) for n in names}

    def write(self, batch: PointBatch) -> None:
        with self._lock:
            self.rows.extend((name, p.step) for p in batch.points for name in p.values)

    def once_through(self, step: int) -> bool:
        counts = Counter(self.rows)
        return counts == Counter((n, s) for n in ("loss", "lr") for s in range(1, step + 1))


@dataclasses.dataclass
class FrozenInWrite:
    """``inner`` whose ``write`` stops (``entered``) until the test lets it go (``thaw``)."""

    inner: MemorySink
    entered: threading.Event = dataclasses.field(default_factory=threading.Event)
    thaw: threading.Event = dataclasses.field(default_factory=threading.Event)

    @property
    def kind(self) -> str:
        return self.inner.kind

    def destination(self) -> dict[str, str]:
        return self.inner.destination()

    def held(self, run_id: str, names: Sequence[str]) -> Mapping[str, int]:
        return self.inner.held(run_id, names)

    def write(self, batch: PointBatch) -> None:
        self.entered.set()
        assert self.thaw.wait(TIMEOUT)
        self.inner.write(batch)


def _on(phase: str, event: threading.Event, then: threading.Event | None = None) -> Callable[[str], None]:
    """A progress callback that sets ``event`` at ``phase`` (and then waits for ``then``: frozen there)."""

    def progress(seen: str) -> None:
        if seen == phase:
            event.set()
            if then is not None:
                assert then.wait(TIMEOUT)

    return progress


def _until(condition: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.01)


def _cursor(store: MemoryStore, sink: MemorySink) -> Any:
    return read_cursor(store, RUN, sink_id(sink.kind, sink.destination()), sink.kind, {})


def _export(store: MemoryStore, sink: Any, lease: float = SHORT_LEASE, **kwargs: Any) -> ExportReport:
    return export_committed(store, RUN, sink, history=history(), lease_seconds=lease, **kwargs)


def test_a_second_exporter_waits_for_the_first_writing_one_and_each_step_is_there_once() -> None:
    store, sink = MemoryStore("lease"), MemorySink()
    first = FrozenInWrite(sink)
    waiting = threading.Event()
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(_export, store, first, LONG_LEASE)
        assert first.entered.wait(TIMEOUT)  # the first holds the sink, frozen inside its write
        b = pool.submit(_export, store, sink, LONG_LEASE, progress=_on("waiting", waiting))
        _until(lambda: waiting.is_set() or b.done())
        first.thaw.set()  # the first wakes up and finishes its write
        one, two = a.result(TIMEOUT), b.result(TIMEOUT)
    assert sink.once_through(STEPS), sorted(Counter(sink.rows).items())
    assert (one.points, one.confirmed, two.points, two.confirmed) == (20, STEPS, 0, STEPS)
    assert two.waited > 0 and "after waiting" in two.line()
    assert _cursor(store, sink).owner == ""  # released


def test_a_zombie_whose_lease_ran_out_writes_nothing() -> None:
    store, sink = MemoryStore("lease"), MemorySink()
    frozen, thaw = threading.Event(), threading.Event()
    with ThreadPoolExecutor(1) as pool:
        zombie = pool.submit(_export, store, sink, progress=_on("held", frozen, then=thaw))
        assert frozen.wait(TIMEOUT)  # claimed, asked the sink, frozen before announcing and writing
        successor = _export(store, sink)  # waits for the zombie's claim to run out, then takes over
        thaw.set()
        with pytest.raises(EffectUnavailableError, match="superseded") as stopped:
            zombie.result(TIMEOUT)
    assert (successor.points, successor.confirmed) == (20, STEPS) and successor.waited > 0
    assert sink.once_through(STEPS), sorted(Counter(sink.rows).items())
    assert "\n" not in str(stopped.value) and "expected entry" in str(stopped.value)
    assert _cursor(store, sink).confirmed == STEPS


def test_a_zombie_whose_lease_ran_out_writes_nothing_even_when_no_one_took_over() -> None:
    store, sink = MemoryStore("lease"), MemorySink()
    frozen, thaw = threading.Event(), threading.Event()
    with ThreadPoolExecutor(1) as pool:
        zombie = pool.submit(_export, store, sink, progress=_on("held", frozen, then=thaw))
        assert frozen.wait(TIMEOUT)
        _until(lambda: _cursor(store, sink).lease_left(datetime.now(UTC)) == 0)  # its claim ran out
        thaw.set()
        with pytest.raises(EffectUnavailableError, match="superseded"):
            zombie.result(TIMEOUT)
    assert sink.rows == []
    after = _export(store, sink)  # the zombie released its claim on the way out: no wait
    assert (after.waited, after.points) == (0.0, 20) and sink.once_through(STEPS)


def test_a_crashed_exporters_claim_runs_out_and_the_next_export_asks_the_sink() -> None:
    store, sink = MemoryStore("lease"), MemorySink()
    with pytest.raises(Killed):  # steps 1..4 in the sink, then the worker died holding the sink
        _export(store, CutShort(sink, first_steps(4)))
    left = _cursor(store, sink)
    assert (left.pending, bool(left.owner), left.lease_until is not None) == ((0, STEPS), True, True)
    retried = _export(store, sink)
    assert (retried.reconciled, retried.points, retried.confirmed) == (True, 12, STEPS)
    assert retried.waited > 0
    assert sink.once_through(STEPS)


def test_a_live_claim_is_renewed_and_an_export_gives_up_waiting_for_it_retryably() -> None:
    memory, sink = MemoryStore("lease"), MemorySink()
    holder = FrozenInWrite(sink)
    with ThreadPoolExecutor(1) as pool:
        a = pool.submit(_export, memory, holder, 4 * SHORT_LEASE)
        assert holder.entered.wait(TIMEOUT)
        claimed = _cursor(memory, sink)
        _until(lambda: _cursor(memory, sink).version > claimed.version)  # renewed while the sink works
        with pytest.raises(EffectUnavailableError, match="another export holds this tracker"):
            _export(memory, sink)  # waits at most its own lease and a margin
        assert sink.rows == []
        holder.thaw.set()
        assert a.result(TIMEOUT).points == 20
    assert sink.once_through(STEPS)


def test_an_export_told_to_stop_writes_nothing_and_releases_the_sink() -> None:
    store, sink = MemoryStore("lease"), MemorySink()
    asked = threading.Event()
    with pytest.raises(EffectUnavailableError, match="cancelled: this export stopped before writing"):
        _export(store, sink, progress=_on("held", asked), stop=lambda: "cancelled" if asked.is_set() else None)
    assert sink.rows == []
    released = _cursor(store, sink)
    assert (released.owner, released.confirmed, released.pending) == ("", 0, None)
    after = _export(store, sink)
    assert (after.waited, after.points, after.confirmed) == (0.0, 20, STEPS)
    assert sink.once_through(STEPS)


def test_cursor_entries_written_before_the_lease_still_read() -> None:
    store, sink = MemoryStore("lease"), MemorySink()
    name = sink_id(sink.kind, sink.destination())
    old = {"sink": name, "kind": "memory", "destination": {"name": "memory"}, "confirmed": 4, "pending": [4, 7]}
    old["at"] = "2025-01-01T00:00:00.000+00:00"  # every field an entry had before the lease
    assert store.put_if_absent(numbered_key(cursor_prefix(RUN, name), 0), json.dumps(old).encode())
    cursor = _cursor(store, sink)
    assert (cursor.confirmed, cursor.pending, cursor.owner, cursor.lease_until, cursor.version) == (
        4,
        (4, 7),
        "",
        None,
        0,
    )
    sink.write(PointBatch(RUN, history().points(after=0)[:5], 0.0))  # an old export got through step 5
    report = _export(store, sink)  # not held by anyone: no wait; pending: the sink is asked
    assert (report.waited, report.reconciled, report.points, report.confirmed) == (0.0, True, 10, STEPS)
    assert sink.once_through(STEPS)
