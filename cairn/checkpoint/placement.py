"""Where a restore's bytes land and in which order they are read (``cairn.checkpoint.reader``).

Fresh arrays are placed so that their address agrees with their bytes' offset in the shard
modulo a page (``placed``): a local store then reads them straight from the disk
(``LocalStore.read_into``), and a large one is a private mapping of its own, in huge pages where
the system allows (half the page faults' cost). Small tensors stored back to back are read with
one request into one allocation (``slabs_of``). Reads are ordered so that every tensor's checks
end together (``schedule``).
"""

from __future__ import annotations

import heapq
import math
import mmap
from collections.abc import Callable
from typing import Any

import numpy as np

from cairn.checkpoint.manifest import TensorEntry
from cairn.checkpoint.tensors import dtype_from_tag

__all__ = ["Read", "UNALIGNED_RUN_BYTES", "placed", "fresh", "span_bytes", "slabs_of", "schedule"]

_PAGE = 4096
_MAPPED = 1 << 20
Read = tuple[Callable[[], None], list[tuple[str, int]], int]
"""One read of a restore: the call, the pieces ``(tensor, k)`` it fills, its bytes."""


def placed(nbytes: int, offset: int) -> np.ndarray:
    """``nbytes`` of fresh memory whose address agrees with ``offset`` modulo a page, so a local
    store reads it straight from the disk (``LocalStore.read_into``) and an element stored at a
    multiple of its size sits aligned. A large one is a private mapping of its own, in huge pages
    where the system allows: half the page faults' cost of the allocator's memory, and large
    requests to the disk. It is unmapped when the last array using it is gone."""
    if nbytes < _MAPPED:
        raw = np.empty(nbytes + _PAGE, dtype=np.uint8)
    else:
        memory = mmap.mmap(-1, nbytes + _PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        if hasattr(mmap, "MADV_HUGEPAGE"):
            memory.madvise(mmap.MADV_HUGEPAGE)
        raw = np.frombuffer(memory, dtype=np.uint8)
    skew = (offset - raw.ctypes.data) % _PAGE
    return raw[skew : skew + nbytes]


def fresh(shape: list[int], dtype: np.dtype[Any], offset: int | None) -> np.ndarray:
    """An empty array for a tensor stored raw at ``offset`` in its shard (None: encoded),
    ``placed`` when it is large and its offset holds whole elements."""
    nbytes = math.prod(shape) * dtype.itemsize
    if offset is None or nbytes < _MAPPED or offset % dtype.itemsize:
        return np.empty(shape, dtype=dtype)
    return placed(nbytes, offset).view(dtype).reshape(shape)


UNALIGNED_RUN_BYTES = 256 << 10
"""The most bytes a run holding a tensor stored at an odd offset (``_unaligned``) may span: such a
run is read into a transient buffer of its own and every tensor in it copied out (``slabs_of``),
so a restore holds at most one such buffer per reader beyond the state."""


def _unaligned(entry: TensorEntry) -> bool:
    """Whether a tensor is stored at an offset that is not a multiple of its element size (its
    place in a slab would be a misaligned array)."""
    return entry.offset % dtype_from_tag(entry.dtype).itemsize != 0


def span_bytes(run: list[TensorEntry]) -> int:
    """The bytes a run of tensors stored back to back spans in its shard."""
    return run[-1].offset + run[-1].length - run[0].offset


def slabs_of(entries: list[TensorEntry], piece_bytes: int) -> list[tuple[list[TensorEntry], np.ndarray | None]]:
    """Runs of two or more small raw tensors stored back to back in one shard, at most
    ``piece_bytes`` each, with the bytes that hold them (``placed``, laid out as in the shard):
    one read fills a run, so a checkpoint of many small tensors is read in large requests.

    A run holding a tensor stored at an odd offset (a float64 after seven float32s) spans at most
    ``UNALIGNED_RUN_BYTES`` and comes with None: the reader reads it into a transient buffer and
    copies every tensor of it into an aligned array of its own, so nothing keeps the buffer."""
    runs: list[list[TensorEntry]] = []
    odd: list[bool] = []  # per run: holds an unaligned tensor
    for e in sorted(entries, key=lambda e: (e.shard, e.offset)):
        if e.encoding is not None or not 0 < e.length < piece_bytes:
            continue
        skewed = _unaligned(e)
        if skewed and e.length >= UNALIGNED_RUN_BYTES:
            continue
        if runs:
            run = runs[-1]
            span = e.offset + e.length - run[0].offset
            limit = UNALIGNED_RUN_BYTES if odd[-1] or skewed else piece_bytes
            if run[-1].shard == e.shard and run[-1].offset + run[-1].length == e.offset and span <= limit:
                run.append(e)
                odd[-1] = odd[-1] or skewed
                continue
        runs.append([e])
        odd.append(skewed)
    return [
        (run, None if skewed else placed(span_bytes(run), run[0].offset))
        for run, skewed in zip(runs, odd, strict=True)
        if len(run) > 1
    ]


def schedule(units: list[list[Read]]) -> list[Read]:
    """Every unit's reads, in order, the next read always from the unit with the most bytes
    left to read: the checks of every tensor end together (a large tensor's reads are spread
    over the restore, equal ones interleave), so little checking is left when the reads end."""
    left = [(-sum(r[2] for r in unit), i, 0) for i, unit in enumerate(units) if unit]
    heapq.heapify(left)
    order: list[Read] = []
    while left:
        remaining, i, k = heapq.heappop(left)
        order.append(units[i][k])
        if k + 1 < len(units[i]):
            heapq.heappush(left, (remaining + units[i][k][2], i, k + 1))
    return order
