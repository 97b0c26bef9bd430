"""A training history (loss, lr, evaluations) kept in run-level segments shared by checkpoints.

Each history key's values (float64) live in immutable, content-addressed segment objects under
the run (``layout.history_segment_key``: the key names the range and the BLAKE3 of its bytes,
so the same values always land under the same key and a retried write converges). A manifest
references them (``HistoryRef``): per key its length, the BLAKE3 of all its values (what the
fingerprint covers) and the segments that tile ``[0, length)``.

A key of length n is cut the same way whenever it is saved (``segment_ranges``): aligned chunks
of ``HISTORY_CHUNK`` entries, then aligned blocks of 1/16 and 1/256 of a chunk, then a tail of
fewer than 1/256 of a chunk. A block is written once, when it is complete; only the tail is
written by every save. So a save writes its new entries, a short tail, and the blocks that just
completed: each entry about three times over the run, not once per checkpoint. What is already
durable comes from the last checkpoint this process committed or restored for the (store, run)
(``remember``), while that checkpoint is still committed (retention uncommits a checkpoint before
it deletes what only that checkpoint refers to); a block is reused only if the values in memory
hash to its checksum. Anything uncertain is written.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from blake3 import blake3

from cairn.checkpoint.layout import HISTORY_NAME_PATTERN, history_segment_key, manifest_key
from cairn.checkpoint.manifest import CheckpointKind, HistoryRef, HistorySegment, HistorySeries
from cairn.checkpoint.options import DEFAULT_LIMITS, Limits
from cairn.checkpoint.tensors import CHECKSUM_PREFIX, byte_view, tensor_checksum
from cairn.checkpoint.training import history_name
from cairn.errors import IntegrityError, ManifestError, ObjectNotFoundError, SizeLimitError, TensorSpecError
from cairn.stores.base import Store

__all__ = [
    "ValueCheck",
    "HISTORY_CHUNK",
    "segment_ranges",
    "segment_key",
    "history_ref_keys",
    "check_history_ref",
    "write_history",
    "read_history",
    "verify_history",
    "remember",
    "durable_history",
]

HISTORY_CHUNK = 1 << 16
"""Entries per chunk (512 KiB of float64), a constant of the writer recorded in every ref."""
SPLIT = 16
"""Each level's blocks are 1/16 of the level above's: chunk, chunk/16, chunk/256."""
LEVELS = 3
MAX_BELOW_CHUNK = (LEVELS - 1) * (SPLIT - 1) + 1
"""Segments after the last chunk boundary: at most 15 of each smaller level and a tail."""
MAX_RUNS = 64
"""Runs per store whose last durable history this process remembers."""
ITEM = 8
_F8 = np.dtype("<f8")
ValueCheck = Callable[[str, np.ndarray], None]


def segment_ranges(length: int, chunk: int) -> list[tuple[int, int]]:
    """How a key of ``length`` entries is cut: the largest aligned blocks first, then the tail."""
    out: list[tuple[int, int]] = []
    pos = 0
    for level in range(LEVELS):
        size = chunk // SPLIT**level
        while pos + size <= length:
            out.append((pos, pos + size))
            pos += size
    if pos < length:
        out.append((pos, length))
    return out


def segment_key(run_id: str, name: str, segment: HistorySegment) -> str:
    """Where ``segment`` of history key ``name`` of ``run_id`` lives (derived, never read from a
    manifest: a forged ref cannot point a read anywhere else)."""
    return history_segment_key(run_id, name, segment.start, segment.end, segment.checksum[len(CHECKSUM_PREFIX) :])


def history_ref_keys(run_id: str, ref: HistoryRef) -> set[str]:
    """Every segment object ``ref`` needs (what retention must keep)."""
    return {segment_key(run_id, name, seg) for name, series in ref.series.items() for seg in series.segments}


# -- the process's memory of what is durable ----------------------------------------------------


@dataclass(frozen=True)
class _Durable:
    ref: HistoryRef
    manifest: str
    """The commit marker of the checkpoint that refers to ``ref``: while it exists, so do they."""


_durable: weakref.WeakKeyDictionary[Store, OrderedDict[str, _Durable]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def remember(store: Store, run_id: str, ref: HistoryRef | None, step: int) -> None:
    """``ref``'s segments are durable in ``store`` for ``run_id``: its training checkpoint at
    ``step``, which this process committed or read, refers to them; None forgets the run. Keyed
    by the store object itself, so two stores that share a URL (two in-memory stores) never lend
    each other segments."""
    with _lock:
        runs = _durable.setdefault(store, OrderedDict())
        runs.pop(run_id, None)
        if ref is not None:
            runs[run_id] = _Durable(ref, manifest_key(run_id, CheckpointKind.TRAINING, step))
        while len(runs) > MAX_RUNS:
            runs.popitem(last=False)


def durable_history(store: Store, run_id: str) -> HistoryRef | None:
    """The last history this process committed or restored for (store, run), if any."""
    with _lock:
        runs = _durable.get(store)
        entry = None if runs is None else runs.get(run_id)
    return None if entry is None else entry.ref


def _prior(store: Store, run_id: str) -> _Durable | None:
    with _lock:
        runs = _durable.get(store)
        return None if runs is None else runs.get(run_id)


@functools.lru_cache(maxsize=4)
def _pool(workers: int, pid: int) -> ThreadPoolExecutor:
    """Segment readers and writers, kept for the process (a forked child gets its own)."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cairn-history")


def _run_all(fns: Sequence[Callable[[], object]], workers: int) -> list[object]:
    """Run ``fns`` concurrently; every one finishes before the first failure is raised."""
    if len(fns) <= 1:
        return [fn() for fn in fns]
    pending = [_pool(max(1, workers), os.getpid()).submit(fn) for fn in fns]
    failures = [f.exception() for f in pending]
    for failure in failures:
        if failure is not None:
            raise failure
    return [f.result() for f in pending]


# -- the ref's shape, checked before anything is allocated ----------------------------------------


def check_history_ref(ref: HistoryRef, limits: Limits = DEFAULT_LIMITS) -> None:
    """The segments of every key tile ``[0, length)`` exactly, in order, no more of them than a
    writer makes, and all keys together within ``limits.max_total_bytes``."""
    if len(ref.series) > limits.max_tensors:
        raise SizeLimitError(field="history.series", expected=f"<= {limits.max_tensors} keys", found=len(ref.series))
    total = sum(s.length for s in ref.series.values()) * ITEM  # Python ints: cannot overflow
    if total > limits.max_total_bytes:
        raise SizeLimitError(field="history", expected=f"<= {limits.max_total_bytes} bytes", found=total)
    for name, series in ref.series.items():
        where = f"history.series[{name}]"
        most = series.length // ref.chunk + MAX_BELOW_CHUNK
        if len(series.segments) > most:
            raise SizeLimitError(field=f"{where}.segments", expected=f"<= {most}", found=len(series.segments))
        pos = 0
        for seg in series.segments:
            if seg.start != pos or seg.end <= seg.start:
                raise ManifestError(
                    "history segments must tile [0, length) in order, without gap or overlap",
                    field=f"{where}.segments[{seg.start}:{seg.end}]",
                    expected=f"a segment starting at {pos}",
                    found=[seg.start, seg.end],
                )
            pos = seg.end
        if pos != series.length:
            raise ManifestError(
                "history segments must tile [0, length)", field=f"{where}.length", expected=pos, found=series.length
            )


# -- save ------------------------------------------------------------------------------------------


def write_history(
    store: Store,
    run_id: str,
    history: Mapping[str, Sequence[float]],
    *,
    workers: int = 4,
    value_check: ValueCheck | None = None,
) -> HistoryRef:
    """Make every value of ``history`` durable as segments of ``run_id`` and return the ref a
    manifest commits; segments already durable (``durable_history``) are not written again.
    ``value_check(history/KEY, values)`` refuses a new segment before anything is written."""
    for name in history:
        if not HISTORY_NAME_PATTERN.match(name):
            raise TensorSpecError(field="history", expected=HISTORY_NAME_PATTERN.pattern, found=name[:80])
    chunk = HISTORY_CHUNK
    prior = _prior(store, run_id)
    if prior is not None and (prior.ref.chunk != chunk or not store.exists(prior.manifest)):
        prior = None  # another writer's constant, or its checkpoint is gone (collected, deleted)
    arrays = {name: np.fromiter(values, dtype=_F8, count=len(values)) for name, values in sorted(history.items())}
    series: dict[str, HistorySeries] = {}
    fresh: list[tuple[str, HistorySegment]] = []
    for name, arr in arrays.items():
        old = prior.ref.series.get(name) if prior is not None else None
        had = {(s.start, s.end): s.checksum for s in old.segments} if old is not None else {}
        segments = [
            HistorySegment(start=a, end=b, checksum=tensor_checksum(arr[a:b]))
            for a, b in segment_ranges(arr.size, chunk)
        ]
        for seg in segments:
            if had.get((seg.start, seg.end)) != seg.checksum:
                fresh.append((name, seg))  # new, or the values differ (a rollback, another lineage)
        series[name] = HistorySeries(length=arr.size, digest=tensor_checksum(arr), segments=segments)
    if value_check is not None:
        for name, seg in fresh:
            value_check(history_name(name), arrays[name][seg.start : seg.end])

    def put(name: str, seg: HistorySegment) -> None:
        view = byte_view(arrays[name][seg.start : seg.end])
        store.write_object(segment_key(run_id, name, seg), [view], size=len(view))

    _run_all([functools.partial(put, name, seg) for name, seg in fresh], workers)
    return HistoryRef(chunk=chunk, series=series)


# -- restore ---------------------------------------------------------------------------------------


def _fetch(store: Store, run_id: str, name: str, seg: HistorySegment, value_check: ValueCheck | None) -> np.ndarray:
    """One segment's values, checked: present, of its size, its checksum, its values."""
    where = f"history.series[{name}].segments[{seg.start}:{seg.end}]"
    key = segment_key(run_id, name, seg)
    want = (seg.end - seg.start) * ITEM
    try:
        raw = store.read(key, want)  # a larger object is refused by its size, unread
    except ObjectNotFoundError:
        raise IntegrityError("history segment listed in the manifest is missing", field=where, found=key) from None
    except SizeLimitError as exc:
        found = exc.found
        raise IntegrityError("history segment has the wrong size", field=where, expected=want, found=found) from None
    if len(raw) != want:
        raise IntegrityError("history segment has the wrong size", field=where, expected=want, found=len(raw))
    found = CHECKSUM_PREFIX + blake3(raw).hexdigest()
    if found != seg.checksum:
        raise IntegrityError(
            "history segment bytes do not match their checksum", field=where, expected=seg.checksum, found=found
        )
    arr = np.frombuffer(raw, dtype=_F8)
    if value_check is not None:
        value_check(history_name(name), arr)
    return arr


def _require_digest(name: str, series: HistorySeries, hasher: blake3) -> None:
    found = CHECKSUM_PREFIX + hasher.hexdigest()
    if found != series.digest:
        raise IntegrityError(
            "history values do not match their digest",
            field=f"history.series[{name}].digest",
            expected=series.digest,
            found=found,
        )


def read_history(
    store: Store,
    run_id: str,
    ref: HistoryRef,
    *,
    limits: Limits = DEFAULT_LIMITS,
    value_check: ValueCheck | None = None,
    workers: int = 4,
) -> dict[str, list[float]]:
    """Every key's values, read from its segments (concurrently), each checked against its
    checksum and (``value_check``) its values, every key against its digest. The ref is checked
    first (``check_history_ref``): nothing is allocated from what it claims, only from what is read."""
    check_history_ref(ref, limits)
    jobs = [(name, seg) for name, series in sorted(ref.series.items()) for seg in series.segments]
    fetches = [functools.partial(_fetch, store, run_id, name, seg, value_check) for name, seg in jobs]
    pieces = _run_all(fetches, workers)
    out: dict[str, list[float]] = {name: [] for name in ref.series}
    hashers = {name: blake3() for name in ref.series}
    for (name, _), piece in zip(jobs, pieces, strict=True):
        assert isinstance(piece, np.ndarray)
        hashers[name].update(byte_view(piece))
        out[name].extend(piece.tolist())
    for name, series in ref.series.items():
        _require_digest(name, series, hashers[name])
    return out


def verify_history(
    store: Store,
    run_id: str,
    ref: HistoryRef,
    *,
    limits: Limits = DEFAULT_LIMITS,
    value_check: ValueCheck | None = None,
) -> None:
    """Every check of ``read_history``, one segment in memory at a time (``cairn ckpt verify``)."""
    check_history_ref(ref, limits)
    for name, series in sorted(ref.series.items()):
        hasher = blake3()
        for seg in series.segments:
            hasher.update(byte_view(_fetch(store, run_id, name, seg, value_check)))
        _require_digest(name, series, hasher)
