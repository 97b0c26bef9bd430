"""Whether a save compresses (``checkpoint.compression``): ``off``, ``zstd`` (always) or ``auto``.

``auto`` compresses only where it makes saves faster: where the codec (``cairn.checkpoint.codec``)
turns logical bytes into stored bytes faster than the store takes them, and the state shrinks
enough to pay for it. It decides from two figures measured in this process:

- the store's bandwidth: the bytes of every save's shards over the seconds the store took to
  take them (a raw save: the write; a compressed one: the write minus the time spent encoding
  while the store waited), per store, weighted by bytes; objects under 1 MiB are not counted
  (their time is latency, not bandwidth), so a run of tiny checkpoints stays raw;
- the codec's throughput and ratio: one frame of each of the save's largest tensors, at most
  ``SAMPLE_BYTES``, encoded once per store and dtype mix (a few milliseconds) and again every
  ``RESAMPLE_SAVES`` saves.

The first save to a store is raw (its bandwidth is not known yet) and measures it. Each
decision, with both figures, is kept as ``CompressionChoice`` (``last_choice``) for the run's
summary. With compression, a save takes ``max(S / codec, S / (ratio x store))`` (encoding
overlaps the writes) instead of ``S / store``: ``auto`` compresses when that is at least
``MARGIN`` shorter, so a machine whose disk outruns the codec never pays for it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
from blake3 import blake3
from pydantic import BaseModel, ConfigDict

from cairn.checkpoint.codec import FRAME_BYTES, encode_frame, warm_up
from cairn.checkpoint.options import COMPRESSION_MODES
from cairn.checkpoint.tensors import byte_view

__all__ = [
    "MARGIN",
    "CompressionChoice",
    "decide",
    "record_write",
    "last_choice",
    "forget_measurements",
]

MARGIN = 0.9
"""``auto`` compresses when the estimated compressed save takes at most this share of a raw one."""
SAMPLE_BYTES = 8 << 20
RESAMPLE_SAVES = 50
MIN_ENCODED_BYTES = 64 << 10
"""Smaller tensors are stored raw in a compressed save: a frame's headers would outweigh their gain."""
_MIN_OBJECT_BYTES = 1 << 20
_MIN_MEASURED_BYTES = 4 << 20
"""Writes that add up to less than this say more about latency than bandwidth: not yet measured."""


class CompressionChoice(BaseModel):
    """One save's decision, and what it was made from (MB/s of logical bytes; None: not
    measured). A run's summary reports its latest (``RunSummary.compression``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: Literal["off", "zstd", "auto"]
    compress: bool
    store_mb_s: float | None
    codec_mb_s: float | None
    ratio: float | None
    why: str


@dataclass
class _Store:
    bytes: float = 0.0
    seconds: float = 0.0
    codec: dict[tuple[str, ...], tuple[float, float, int]] = field(default_factory=dict)
    """dtype mix -> (codec MB/s, ratio, saves since sampled)."""
    compressed_since_raw: int = 0
    """Compressed saves since the last raw one (which is what measures the store)."""


_lock = threading.Lock()
_stores: dict[str, _Store] = {}
_last: dict[str, CompressionChoice] = {}


def record_write(store_url: str, nbytes: int, seconds: float) -> None:
    """A raw save wrote ``nbytes`` of shards to the store in ``seconds`` of wall time (all its
    shards, however many went at once)."""
    if seconds <= 0 or nbytes < _MIN_OBJECT_BYTES:  # a small save's time is mostly latency
        return
    with _lock:
        s = _stores.setdefault(store_url, _Store())
        decay = 0.5 if s.bytes > 64 * _MIN_MEASURED_BYTES else 1.0  # recent saves count most
        s.bytes, s.seconds = s.bytes * decay + nbytes, s.seconds * decay + seconds


def last_choice(store_url: str) -> CompressionChoice | None:
    """The latest decision made for saves to ``store_url`` in this process."""
    with _lock:
        return _last.get(store_url)


def forget_measurements() -> None:
    """Forget every store's bandwidth, codec sample and decision (tests; a process that moved)."""
    with _lock:
        _stores.clear()
        _last.clear()


def _sample(arrays: Mapping[str, np.ndarray]) -> tuple[float, float]:
    """(codec MB/s, ratio) of a save's CPU work per byte — the encoding, and the BLAKE3 of the
    stored and of the logical bytes — on one frame of each of up to ``SAMPLE_BYTES // FRAME_BYTES``
    arrays spread over the state (its tensors, or the blocks of all its tensors)."""
    warm_up()
    large = [arrays[name] for name in sorted(arrays) if arrays[name].nbytes >= MIN_ENCODED_BYTES]
    count = max(1, SAMPLE_BYTES // FRAME_BYTES)
    picked = large[:: max(1, len(large) // count)][:count]
    logical = stored = 0
    seconds = 0.0
    for arr in picked:
        view = byte_view(arr)[: min(FRAME_BYTES, arr.nbytes // arr.itemsize * arr.itemsize)]
        started = time.perf_counter()
        blake3(view)
        data, _ = encode_frame(view, arr.itemsize)  # hashes the stored bytes too
        seconds += time.perf_counter() - started
        logical, stored = logical + len(view), stored + len(data)
    if logical == 0 or seconds <= 0:
        return 0.0, 1.0
    return logical / seconds / 1e6, logical / max(1, stored)


def decide(mode: str, store_url: str, arrays: Mapping[str, np.ndarray]) -> CompressionChoice:
    """Whether this save (of ``arrays`` to ``store_url``) compresses, under ``mode``."""
    assert mode in COMPRESSION_MODES, mode
    if mode == "off" or mode == "zstd":
        choice = CompressionChoice(
            mode=mode,  # type: ignore[arg-type]  # checked above
            compress=mode == "zstd",
            store_mb_s=None,
            codec_mb_s=None,
            ratio=None,
            why=f"checkpoint.compression: {mode}",
        )
    else:
        choice = _auto(store_url, arrays)
    with _lock:
        _last[store_url] = choice
    return choice


def _auto(store_url: str, arrays: Mapping[str, np.ndarray]) -> CompressionChoice:
    mix = tuple(sorted({str(a.dtype) for a in arrays.values()}))
    with _lock:
        s = _stores.setdefault(store_url, _Store())
        measured = s.bytes >= _MIN_MEASURED_BYTES
        store_mb_s = s.bytes / s.seconds / 1e6 if measured and s.seconds > 0 else None
        cached = s.codec.get(mix)
    if cached is None or cached[2] >= RESAMPLE_SAVES:
        codec_mb_s, ratio = _sample(arrays)
        with _lock:
            s.codec[mix] = (codec_mb_s, ratio, 0)
    else:
        codec_mb_s, ratio, saves = cached
        with _lock:
            s.codec[mix] = (codec_mb_s, ratio, saves + 1)
    if store_mb_s is None:
        why = "the store's bandwidth is not measured yet (this save measures it)"
        return CompressionChoice(
            mode="auto", compress=False, store_mb_s=None, codec_mb_s=codec_mb_s, ratio=ratio, why=why
        )
    raw = 1 / store_mb_s
    compressed = max(1 / codec_mb_s if codec_mb_s > 0 else float("inf"), 1 / (ratio * store_mb_s))
    pays = compressed <= MARGIN * raw
    why = (
        f"estimated save {compressed / raw:.2f}x a raw one: store {store_mb_s:.0f} MB/s, "
        f"codec {codec_mb_s:.0f} MB/s at {ratio:.2f}x"
    )
    with _lock:
        probe = pays and s.compressed_since_raw >= RESAMPLE_SAVES
        s.compressed_since_raw = 0 if not pays or probe else s.compressed_since_raw + 1
    if probe:  # the store is measured by raw saves only: one now and then keeps its figure fresh
        pays, why = False, f"a raw save after {RESAMPLE_SAVES} compressed ones re-measures the store ({why})"
    return CompressionChoice(
        mode="auto", compress=pays, store_mb_s=store_mb_s, codec_mb_s=codec_mb_s, ratio=ratio, why=why
    )
