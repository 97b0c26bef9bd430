"""Who owns what: checkpoint blocks and ZeRO-1 optimizer slices, for any world size.

The model's parameters, flattened in one fixed order (tensor name, then C order), are cut into
the checkpoint's blocks (``cairn.checkpoint.blocks``: the block size is the run's, not the
world size's). Rank r of W owns the blocks whose first element lies in ``[r N / W, (r+1) N / W)``
— a contiguous slice of the flat parameter vector, aligned to block boundaries. It keeps Adam's
moments for that slice only, updates that slice only, and writes that slice's blocks of theta,
m and v. A checkpoint saved at W is read at any W' by each rank reading the blocks of its new
slice (ranged reads); nothing else is resharded.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from cairn.checkpoint.blocks import Block, plan_blocks
from cairn.checkpoint.manifest import PartSpec
from cairn.errors import ConfigError

__all__ = ["FlatLayout", "Slice", "check_world_size", "flat_layout", "world_sizes"]


@dataclass(frozen=True)
class Slice:
    """One rank's share: the flat element range ``[start, stop)`` and the blocks in it."""

    rank: int
    start: int
    stop: int
    blocks: tuple[Block, ...]

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class FlatLayout:
    """The parameters of one group (``theta``) as a flat vector, and its blocks."""

    names: tuple[str, ...]
    """Parameter names (without the group prefix), in flat order."""
    shapes: Mapping[str, tuple[int, ...]]
    offsets: Mapping[str, int]
    """Flat offset of each parameter."""
    size: int
    block_elems: int
    blocks: tuple[Block, ...]
    """Blocks of the ``theta`` group, in flat order."""

    def flat_start(self, block: Block) -> int:
        return self.offsets[block.tensor.split("/", 1)[1]] + block.start

    def slices(self, world: int) -> list[Slice]:
        """Every rank's share at world size ``world`` (some may be empty for a tiny model)."""
        owner = [min(world - 1, self.flat_start(b) * world // max(1, self.size)) for b in self.blocks]
        out: list[Slice] = []
        cursor = 0
        for rank in range(world):
            mine = tuple(b for b, o in zip(self.blocks, owner, strict=True) if o == rank)
            stop = cursor + sum(b.size for b in mine)
            out.append(Slice(rank, cursor, stop, mine))
            cursor = stop
        return out

    def parts(self, group: str, dtype: str = "<f8") -> dict[str, PartSpec]:
        """The blocked layout (format v3) of one group of these parameters (float64 by default)."""
        return {
            f"{group}/{n}": PartSpec(shape=list(self.shapes[n]), block_elems=self.block_elems, dtype=dtype)
            for n in self.names
        }


def flat_layout(shapes: Mapping[str, tuple[int, ...]], block_elems: int) -> FlatLayout:
    """The flat layout of parameters ``shapes`` (name -> shape) cut into ``block_elems`` blocks."""
    names = tuple(sorted(shapes, key=lambda n: f"theta/{n}"))  # the checkpoint's tensor order
    offsets: dict[str, int] = {}
    total = 0
    for name in names:
        offsets[name] = total
        total += math.prod(shapes[name])
    parts = {f"theta/{n}": PartSpec(shape=list(shapes[n]), block_elems=block_elems) for n in names}
    return FlatLayout(
        names=names,
        shapes=dict(shapes),
        offsets=offsets,
        size=total,
        block_elems=block_elems,
        blocks=tuple(plan_blocks(parts)),
    )


def world_sizes(microbatches: int) -> list[int]:
    """The world sizes a run with this many microbatches can train at (its divisors)."""
    return [d for d in range(1, microbatches + 1) if microbatches % d == 0]


def check_world_size(microbatches: int, world: int, field: str = "world_size") -> None:
    if world < 1 or microbatches % world:
        expected = f"a divisor of distributed.microbatches ({microbatches}): one of {world_sizes(microbatches)}"
        raise ConfigError(field, expected=expected, found=world)
