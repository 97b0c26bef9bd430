"""The FSDP engine (``TorchFSDP``): one rank's share of an FSDP run, its checkpoints laid out
exactly as a single writer of the whole state lays them out.

A tensor FSDP2 shards (a parameter; an optimizer state of its shape) is cut along dim 0 as
``torch.chunk`` cuts it (``fsdp.rows_of``). Its checkpoint blocks are written by the rank holding
each block's first element; the few elements a block takes from the next ranks' shards are sent
to it (one all-to-all, at most a block per shard boundary). Nothing is gathered whole: a rank
holds its shard and at most a block per boundary. A restore at any world size reads, per
tensor, only the blocks that overlap the rank's new shard. Tensors FSDP2 does not shard
(buffers, RNG states, step counters) are written by rank 0.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from cairn.checkpoint.blocks import Block, block_elems_for, logical_specs, plan_blocks, split_blocks
from cairn.checkpoint.manifest import Manifest, PartSpec
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.tensors import dtype_tag
from cairn.checkpoint.training import is_history
from cairn.distributed.comm import Comm
from cairn.distributed.engine import whole_buffers
from cairn.errors import InvariantError
from cairn.state import TrainState
from cairn.stores.base import Store
from cairn.trainers.pytorch.data_parallel import TorchDP
from cairn.trainers.pytorch.fsdp import ShardedTensors, check_fsdp, rows_of, shard_model
from cairn.trainers.pytorch.parts import LiveTrainer
from cairn.trainers.stages import initial_state

__all__ = ["TorchFSDP"]


@dataclass(frozen=True)
class _Piece:
    """Elements ``[start, stop)`` (flat, of tensor ``tensor``) of block ``block``, held by ``holder``."""

    block: Block
    holder: int
    start: int
    stop: int


class TorchFSDP(TorchDP):
    """One rank's share of an FSDP run of a PyTorch adapter trainer (see the module): the
    replicated engine's state handling, with a sharded model, update and checkpoint layout."""

    def __init__(self, trainer: LiveTrainer, comm: Comm, run_id: str, store: Store, options: CheckpointOptions) -> None:
        super().__init__(trainer, comm, run_id, store, options)
        live: Any = trainer
        check_fsdp(live)
        live.weight_specs()
        shard_model(live, comm)
        # On the shards: a probe step of the whole model holds the whole state (the parameters
        # twice, their gradients and the optimizer's moments), which a rank may have no room for.
        # A DTensor's shape is its global shape, so the probe's specs are the whole model's.
        live.optimizer_probe()
        self.shards = ShardedTensors(live, comm)
        live.shards = self.shards
        self._reading_blocks: dict[str, np.ndarray] = {}
        self._read_specs: dict[str, tuple[str, tuple[int, ...]]] = {}
        self._shard_out: dict[str, np.ndarray] = {}

    def install(self, state: TrainState) -> None:
        """A restore's state, read into buffers of this engine's own: adopted, not copied."""
        self._adopt(state, owned=True)

    def start_fresh(self) -> None:
        if not getattr(self.trainer, "pristine", True):
            raise InvariantError("an FSDP engine starts from the state build() made", field="trainer.pristine")
        if self.trainer.config.init_from is None:
            super().start_fresh()
            return
        self._adopt(self._imported())

    def _imported(self) -> TrainState:
        """Step 0 of a new stage on imported weights (``init_from``): the imports check and
        return whole tensors, so each sharded weight is offered to them by its whole shape (a
        read-only stand-in that holds no memory), and this rank keeps its rows of what came in."""
        live: Any = self.trainer
        fresh = live.init_state()
        mine: dict[str, np.ndarray] = {}  # this rank's rows, kept where the import does not replace them
        stand_ins: dict[str, np.ndarray] = {}
        for name, spec in live.weight_specs().items():
            if name in fresh.tensors and tuple(fresh.tensors[name].shape) != tuple(spec.shape):
                mine[name] = fresh.tensors[name]
                stand_ins[name] = np.broadcast_to(np.zeros((), mine[name].dtype), spec.shape)
        fresh.tensors.update(stand_ins)
        state = initial_state(live, options=self.options, fresh=fresh)
        for name, stand_in in stand_ins.items():
            got = state.tensors[name]
            lo, hi = rows_of(stand_in.shape[0], self.comm.world, self.comm.rank)
            state.tensors[name] = mine[name] if got is stand_in else got[lo:hi].copy()  # the whole one freed
        return state

    # -- geometry ------------------------------------------------------------------------------
    def _sharded(self, name: str, shape: tuple[int, ...]) -> bool:
        """A state tensor FSDP2 shards: a parameter, or an optimizer state of its parameter's shape."""
        params = self.trainer.params  # type: ignore[attr-defined]
        if name.startswith("param/"):
            return name[len("param/") :] in params
        if name.startswith("optim/"):
            param_name = name[len("optim/") :].rsplit("/", 1)[0]
            param = params.get(param_name)
            return param is not None and len(shape) > 0 and tuple(param.shape) == tuple(shape)
        return False

    def _flat_range(self, shape: Sequence[int], rank: int) -> tuple[int, int]:
        if not shape:
            return (0, 1) if rank == 0 else (0, 0)
        row = math.prod(shape[1:])
        start, stop = rows_of(shape[0], self.comm.world, rank)
        return start * row, stop * row

    def _pieces(self, parts: Mapping[str, PartSpec]) -> list[_Piece]:
        """Every (block, holder) overlap of the sharded tensors, in the one order all ranks agree on."""
        out: list[_Piece] = []
        ranges = {
            name: [self._flat_range(spec.shape, r) for r in range(self.comm.world)]
            for name, spec in parts.items()
            if name in self.shards.full_shapes
        }
        for block in plan_blocks({n: parts[n] for n in ranges}):
            for holder, (lo, hi) in enumerate(ranges[block.tensor]):
                start, stop = max(block.start, lo), min(block.stop, hi)
                if start < stop:
                    out.append(_Piece(block, holder, start, stop))
        return out

    # -- save ----------------------------------------------------------------------------------
    def parts(self) -> dict[str, PartSpec]:
        """The blocked layout of the whole state (what a single writer of it writes)."""
        assert self.state is not None
        out = {}
        for name, arr in sorted(self.state.tensors.items()):
            shape = self.shards.full_shapes.get(name, arr.shape)
            out[name] = PartSpec(
                shape=list(shape), block_elems=block_elems_for(arr.dtype, self.block_bytes), dtype=dtype_tag(arr.dtype)
            )
        return out

    def my_blocks(self) -> dict[str, np.ndarray]:
        """The blocks whose first element this rank holds, completed by its neighbours' pieces;
        rank 0 writes the tensors FSDP2 does not shard."""
        assert self.state is not None
        state, rank, world = self.state, self.comm.rank, self.comm.world
        parts = self.parts()
        unsharded = {n: a for n, a in state.tensors.items() if n not in self.shards.full_shapes}
        mine: dict[str, np.ndarray] = split_blocks(unsharded, parts, only=set(unsharded)) if rank == 0 else {}
        pieces = self._pieces(parts)
        owner = {p.block.name: p.holder for p in pieces if p.start == p.block.start}
        for name, spec in parts.items():  # an empty sharded tensor: one empty block, rank 0's
            if name in self.shards.full_shapes and math.prod(spec.shape) == 0:
                owner[f"{name}#00000"] = 0
                if rank == 0:
                    mine[f"{name}#00000"] = np.empty(0, dtype=state.tensors[name].dtype)

        flats: dict[str, tuple[np.ndarray, int]] = {}

        def flat_of(name: str) -> tuple[np.ndarray, int]:
            """This rank's shard of ``name`` as a flat array, and its first flat element."""
            if name not in flats:
                lo = self._flat_range(parts[name].shape, rank)[0]
                flats[name] = (np.ascontiguousarray(state.tensors[name]).reshape(-1), lo)
            return flats[name]

        by_block: dict[str, list[_Piece]] = {}  # in plan order: sender and receiver agree on it
        send: list[list[np.ndarray]] = [[] for _ in range(world)]
        recv_sizes = [0] * world
        for p in pieces:
            by_block.setdefault(p.block.name, []).append(p)
            to = owner[p.block.name]
            if p.holder == rank and to != rank:
                flat, lo = flat_of(p.block.tensor)
                send[to].append(flat[p.start - lo : p.stop - lo].view(np.uint8))
            elif to == rank and p.holder != rank:
                recv_sizes[p.holder] += (p.stop - p.start) * state.tensors[p.block.tensor].dtype.itemsize
        send_sizes = [sum(c.size for c in chunks) for chunks in send]
        outgoing = [c for chunks in send for c in chunks]  # views: the vector sent is the one copy
        received = self.comm.exchange(
            np.concatenate(outgoing) if outgoing else np.empty(0, np.uint8), send_sizes, recv_sizes
        )
        cursor = [sum(recv_sizes[:q]) for q in range(world)]
        for block_name, here in by_block.items():
            if owner[block_name] != rank:
                continue
            block = here[0].block
            dtype = state.tensors[block.tensor].dtype
            flat, lo = flat_of(block.tensor)
            if len(here) == 1:  # wholly in this rank's shard: a view, no copy
                mine[block_name] = flat[block.start - lo : block.stop - lo]
                continue
            out = np.empty(block.size, dtype=dtype)
            for p in here:
                if p.holder == rank:
                    out[p.start - block.start : p.stop - block.start] = flat[p.start - lo : p.stop - lo]
                else:
                    nbytes = (p.stop - p.start) * dtype.itemsize
                    raw = received[cursor[p.holder] : cursor[p.holder] + nbytes]
                    out[p.start - block.start : p.stop - block.start] = raw.view(dtype)
                    cursor[p.holder] += nbytes
            mine[block_name] = out
        return mine

    # -- restore -------------------------------------------------------------------------------
    def blocks_to_read(self, manifest: Manifest) -> dict[str, np.ndarray]:
        """Whole tensors FSDP2 does not shard; of each sharded one, only the blocks that overlap
        this rank's new shard: a block inside the shard is read straight into its place, one
        straddling a shard boundary (at most two per tensor) into a buffer of its own. A rank
        holds its shard and at most two blocks per tensor, never a whole sharded tensor (not even
        as unused address space: a rank's memory may be capped near its share)."""
        assert manifest.parts is not None
        specs = {n: (dtype, shape) for n, (dtype, shape) in logical_specs(manifest).items() if not is_history(n)}
        sharded = {n for n, (_, shape) in specs.items() if self._sharded(n, shape)}
        self._reading, targets = whole_buffers(manifest, history=False, exclude=sharded)
        self._read_specs = {n: specs[n] for n in sharded}
        dtypes = {n: np.dtype(specs[n][0]) for n in sharded}
        self._shard_out = {}
        for name in sharded:
            lo, hi = self._flat_range(specs[name][1], self.comm.rank)
            self._shard_out[name] = np.empty(hi - lo, dtype=dtypes[name])
        self._reading_blocks = {}
        parts = manifest.parts
        for block in plan_blocks({n: parts[n] for n in sharded}):
            lo, hi = self._flat_range(parts[block.tensor].shape, self.comm.rank)
            if lo <= block.start and block.stop <= hi and block.size > 0:
                targets[block.name] = self._shard_out[block.tensor][block.start - lo : block.stop - lo]
            elif block.start < hi and lo < block.stop or (block.size == 0 and self.comm.rank == 0):
                buf = np.empty(block.size, dtype=dtypes[block.tensor])
                self._reading_blocks[block.name] = buf
                targets[block.name] = buf
        return targets

    def tensors_read(self) -> dict[str, np.ndarray]:
        """This rank's rows of each sharded tensor (its blocks landed in place; the straddling
        ones' overlap copied in), and the whole others."""
        tensors, self._reading = self._reading, {}
        for entry, buf in self._reading_blocks.items():
            name, _, number = entry.rpartition("#")
            lo, hi = self._flat_range(self._read_specs[name][1], self.comm.rank)
            first = int(number) * block_elems_for(buf.dtype, self.block_bytes)
            start, stop = max(first, lo), min(first + buf.size, hi)
            if start < stop:
                self._shard_out[name][start - lo : stop - lo] = buf[start - first : stop - first]
        for name, (_, shape) in self._read_specs.items():
            first_row, stop_row = rows_of(shape[0], self.comm.world, self.comm.rank)
            tensors[name] = self._shard_out[name].reshape((stop_row - first_row, *shape[1:]))
        self._reading_blocks, self._read_specs, self._shard_out = {}, {}, {}
        return tensors
