"""The canonical tree reduction (``cairn.distributed.reduce``): subtrees combined in tree order equal
the whole tree for every world size, the rank-order switch makes the sum depend on the split, and
the in-place tree over rows is bit-equal to ``tree_sum``."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from cairn.distributed.reduce import combine, tree_sum


def test_subtrees_combined_in_tree_order_equal_the_whole_tree_for_every_world_size() -> None:
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(1000) * 10.0 ** rng.integers(-8, 8) for _ in range(16)]
    whole = tree_sum(grads)
    for world in (1, 2, 4, 8, 16):
        per = 16 // world
        partials = [tree_sum(grads[r * per : (r + 1) * per]) for r in range(world)]
        assert np.array_equal(combine(partials), whole), world
    # A left fold (what a rank-order reduction does) is a different number: order matters.
    fold = grads[0]
    for g in grads[1:]:
        fold = fold + g
    assert not np.array_equal(fold, whole)


def test_rank_order_switch_makes_the_sum_depend_on_the_split(rank_order_sums: Callable[[], None]) -> None:
    rng = np.random.default_rng(1)
    grads = [rng.standard_normal(1000) * 10.0 ** rng.integers(-8, 8) for _ in range(8)]
    rank_order_sums()
    one_rank = tree_sum(grads)
    four_ranks = combine([tree_sum(grads[r * 2 : r * 2 + 2]) for r in range(4)])
    assert not np.array_equal(one_rank, four_ranks)


def test_tree_sum_refuses_a_count_that_is_not_a_power_of_two() -> None:
    with pytest.raises(ValueError, match="power-of-two"):
        tree_sum([np.ones(2)] * 3)


@pytest.mark.parametrize("rank_order", [False, True])
def test_the_in_place_tree_over_rows_is_bit_equal_to_tree_sum(
    rank_order: bool, rank_order_sums: Callable[[], None]
) -> None:
    from cairn.distributed.reduce import tree_sum_rows

    if rank_order:
        rank_order_sums()
    rng = np.random.default_rng(2)
    for world in (1, 2, 4, 8):
        rows = rng.standard_normal((world, 257)) * 10.0 ** rng.integers(-8, 8, size=(world, 1))
        expected = tree_sum(list(rows))
        assert tree_sum_rows(rows.copy()).tobytes() == expected.tobytes()
