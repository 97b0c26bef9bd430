"""Ownership slices (``cairn.distributed.partition``): contiguous, block-aligned, and together the
parameters, for every world size."""

from __future__ import annotations

import pytest

from cairn.distributed.partition import flat_layout


@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_slices_are_contiguous_block_aligned_and_cover_the_parameters(world: int) -> None:
    layout = flat_layout({"W1": (8, 16), "b1": (16,), "W2": (16, 3), "b2": (3,)}, block_elems=8)
    slices = layout.slices(world)
    assert slices[0].start == 0 and slices[-1].stop == layout.size
    for before, after in zip(slices, slices[1:], strict=False):
        assert before.stop == after.start
    for s in slices:
        assert sum(b.size for b in s.blocks) == s.size
        if s.blocks:
            assert layout.flat_start(s.blocks[0]) == s.start
    assert sorted(b.name for s in slices for b in s.blocks) == sorted(b.name for b in layout.blocks)
