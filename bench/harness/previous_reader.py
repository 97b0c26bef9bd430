"""The read path as it was before restores overlapped reading with checking, kept to measure
the change in the same run.

``previous_reader()`` makes ``load_training`` use it: each tensor read whole, then hashed and
value-checked after the read (tensors concurrently, 4 at a time). Bench-only; never imported by
the library.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from blake3 import blake3

from cairn.checkpoint import reader
from cairn.checkpoint.manifest import Manifest, TensorEntry
from cairn.checkpoint.reader import ValueCheck, check_shards_present
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.tensors import CHECK_CHUNK, byte_view, require_checksum
from cairn.stores.base import Store


def read_tensors_before_fix(
    store: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    *,
    max_workers: int = 4,
    value_check: ValueCheck | None = None,
) -> dict[str, np.ndarray]:
    check_shards_present(store, ref, manifest)

    def load(entry: TensorEntry) -> tuple[str, np.ndarray]:
        arr = np.empty(entry.shape, dtype=np.dtype(entry.dtype))
        if entry.length:
            store.read_into(f"{ref.prefix}/{entry.shard}", entry.offset, byte_view(arr))
        flat = arr.reshape(-1)
        step = max(1, CHECK_CHUNK // max(1, arr.itemsize))
        h = blake3()
        for start in range(0, flat.size, step):
            chunk = flat[start : start + step]
            h.update(byte_view(chunk))
            if value_check is not None:
                value_check(entry.name, chunk)
        require_checksum(entry.name, entry.checksum, h)
        return entry.name, arr

    with ThreadPoolExecutor(max_workers=max(1, min(max_workers, len(manifest.tensors)))) as pool:
        return dict(pool.map(load, manifest.tensors))


@contextlib.contextmanager
def previous_reader() -> Iterator[None]:
    """``load_training`` reads (v1 checkpoints) through ``reader.read_tensors``: the old path there."""
    current = reader.read_tensors

    def before_fix(
        store: Store, ref: CheckpointRef, manifest: Manifest, *, only: object = None, **kw: object
    ) -> object:
        assert only is None, "the old read path reads whole checkpoints"
        return read_tensors_before_fix(store, ref, manifest, **kw)  # type: ignore[arg-type]

    reader.read_tensors = before_fix  # type: ignore[assignment]
    try:
        yield
    finally:
        reader.read_tensors = current  # type: ignore[assignment]
