"""The canonical reduction: microbatch gradients summed in one fixed binary-tree order.

Floating-point addition is not associative, so a data-parallel sum whose order follows the
ranks (a ring all-reduce, a rank-order fold) changes its bits with the world size. Here the
order follows the *microbatch index* instead: for M microbatches (a power of two) the sum is
the complete binary tree ``((g0+g1)+(g2+g3))+((g4+g5)+(g6+g7))``. A rank that holds a
contiguous, aligned block of M/W microbatches computes exactly one subtree of it; the W
subtree sums are then combined by the top of the same tree. So every W dividing M gives the
same bits as one process summing all M (``tree_sum``), and the result does not depend on
which rank computed which subtree.

``summing_in("rank-order")`` (and a gang job's ``reduction``) switches to a left-to-right
fold, in each rank and then across ranks in rank order — what a naive implementation does — so
a test can show that the exactness claim fails without the tree.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

import numpy as np

__all__ = [
    "ReductionOrder",
    "SliceReducer",
    "combine",
    "reduction_order",
    "summing_in",
    "tree_sum",
    "tree_sum_rows",
]

ReductionOrder = Literal["tree", "rank-order"]
T = TypeVar("T", np.ndarray, float)
_rank_order = False


def reduction_order() -> ReductionOrder:
    """The order sums follow in this process now (``tree`` unless ``summing_in`` says otherwise)."""
    return "rank-order" if _rank_order else "tree"


@contextmanager
def summing_in(order: ReductionOrder) -> Iterator[None]:
    """Sum in ``order`` for the duration (this process only; a gang's ranks follow their job)."""
    global _rank_order
    before = _rank_order
    _rank_order = order == "rank-order"
    try:
        yield
    finally:
        _rank_order = before


def _fold(items: Sequence[T]) -> T:
    total = items[0]
    for item in items[1:]:
        total = total + item
    return total


def tree_sum(items: Sequence[T]) -> T:
    """The complete binary tree sum of ``items`` (a power-of-two count), left to right.

    A new object is returned; no input is modified."""
    n = len(items)
    if n == 0 or n & (n - 1):
        raise ValueError(f"tree_sum needs a power-of-two number of items, found {n}")
    if _rank_order:
        return _fold(items) + 0  # (+0: a new object even for one item)
    level = list(items)
    if n == 1:
        return level[0] + 0
    while len(level) > 1:
        level = [level[i] + level[i + 1] for i in range(0, len(level), 2)]
    return level[0]


def combine(partials: Sequence[T]) -> T:
    """Combine the W subtree sums of W ranks (in rank order = microbatch order): the top of
    the tree, identical to ``tree_sum`` over all microbatches."""
    return tree_sum(partials)


def tree_sum_rows(rows: np.ndarray) -> np.ndarray:
    """``tree_sum`` of the rows of a 2-D array, in place (no new memory): level by level, row
    2i+1 is added into row 2i. Returns row 0, bit-equal to ``tree_sum(list(rows))``."""
    n = rows.shape[0]
    if n == 0 or n & (n - 1):
        raise ValueError(f"tree_sum needs a power-of-two number of items, found {n}")
    if _rank_order:
        for i in range(1, n):
            np.add(rows[0], rows[i], out=rows[0])
        return np.asarray(rows[0])
    stride = 1
    while stride < n:
        np.add(rows[0 :: 2 * stride], rows[stride :: 2 * stride], out=rows[0 :: 2 * stride])
        stride *= 2
    return np.asarray(rows[0])


class SliceReducer:
    """The exchange of a ZeRO-1 update on buffers kept across updates: the all-to-all of slices
    (rank j receives every rank's partial sum of its slice j), their combination by the top of
    the tree, and the all-gather of the updated slices. ``comm`` is a
    ``cairn.distributed.comm.Comm``; ``sizes`` every rank's slice length, in rank order."""

    def __init__(self, comm: Any, sizes: Sequence[int]) -> None:
        self.comm, self.sizes = comm, list(sizes)
        self.world = len(self.sizes)
        self.size = self.sizes[comm.rank]
        self._received = np.empty(self.world * self.size)
        self._tiled = np.empty(self.world * self.size)

    def received(self, partial: np.ndarray) -> np.ndarray:
        """The all-to-all: every rank's partial sum of this rank's slice, one row per rank."""
        out: np.ndarray = self.comm.exchange(partial, self.sizes, [self.size] * self.world, out=self._received)
        return out.reshape(self.world, self.size)

    def reduce_scatter(self, partial: np.ndarray) -> np.ndarray:
        """This rank's slice of the tree sum of every rank's ``partial`` (a view of a buffer
        that the next call overwrites)."""
        return tree_sum_rows(self.received(partial))

    def all_gather(self, mine: np.ndarray, out: np.ndarray) -> None:
        """Every rank's ``mine`` (its slice), concatenated in rank order into ``out``."""
        tiled = self._tiled.reshape(self.world, self.size)
        tiled[:] = mine
        self.comm.exchange(self._tiled, [self.size] * self.world, self.sizes, out=out)
