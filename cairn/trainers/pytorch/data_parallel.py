"""The PyTorch adapter, data-parallel over any world size (replicated optimizer, each rank its
share of every checkpoint), bit-identical for every W: ``microbatched_update`` (one update) and
``TorchDP`` (one rank's engine). How and why: docs/pytorch.md."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from cairn.checkpoint.blocks import parts_of, plan_blocks, split_blocks
from cairn.checkpoint.manifest import Manifest, PartSpec
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.ref import CheckpointRef
from cairn.distributed.checkpoint import SaveOutcome
from cairn.distributed.comm import Comm
from cairn.distributed.engine import CoordinatedEngine, whole_buffers
from cairn.distributed.partition import check_world_size
from cairn.distributed.reduce import combine, tree_sum
from cairn.errors import ConfigError, TrainingDivergedError
from cairn.state import TrainState
from cairn.stores.base import Store
from cairn.trainers.pytorch.device import place
from cairn.trainers.pytorch.parts import LiveTrainer, TorchParts
from cairn.trainers.pytorch.state_io import RngStates, np_dtype
from cairn.trainers.pytorch.streams import Stream
from cairn.trainers.pytorch.update import apply_update, backward
from cairn.trainers.stages import initial_state
from cairn.trainers.validate import RunRules

__all__ = [
    "TorchDP",
    "microbatched_update",
    "reduce_microbatches",
    "gradient_dtype",
    "microbatch_seed",
    "microbatch_source",
    "rank_microbatches",
    "microbatch_rngs",
    "byte_shares",
    "install_buffer_means",
    "microbatch_stats",
]

SEED_DOMAIN = 0x7D0D
"""Separates the microbatch generators' seeds from any other use of the run's seed."""


def microbatch_seed(seed: int, step: int, index: int) -> np.ndarray:
    """Four 32-bit words seeding the generators of microbatch ``index`` of update ``step + 1``."""
    return np.random.SeedSequence([seed, SEED_DOMAIN, step, index]).generate_state(4, np.uint32)


@contextmanager
def microbatch_rngs(seed: int, step: int, index: int, device: torch.device) -> Iterator[None]:
    """Torch's (every device's), numpy's and Python's global generators seeded for one
    microbatch; the run's streams (installed by ``TorchTrainer.owned_rngs``) are put back
    afterwards, untouched."""
    kept = RngStates.capture(device)
    words = [int(w) for w in microbatch_seed(seed, step, index)]
    torch.manual_seed((words[0] << 32) | words[1])
    np.random.seed(np.asarray(words, dtype=np.uint32))
    random.seed((words[2] << 32) | words[3])
    try:
        yield
    finally:
        kept.install()


def reduce_microbatches(comm: Comm, partial: np.ndarray, microbatches: int) -> np.ndarray:
    """The mean over all M microbatches of the vectors whose subtree sum this rank holds
    (``partial``), in ``partial``'s dtype: exchange of slices, the top of the tree in rank
    (= microbatch) order, 1/M, all-gather. The same bits on every rank and for every W dividing M."""
    world = comm.world
    bounds = [partial.size * r // world for r in range(world + 1)]
    sizes = [bounds[r + 1] - bounds[r] for r in range(world)]
    mine = sizes[comm.rank]
    received = comm.exchange(partial, sizes, [mine] * world)
    pieces = [received[r * mine : (r + 1) * mine] for r in range(world)]
    kind = partial.dtype.type
    # + 0: a zero's sign depends on where the tree was cut (x + 0 turns -0 into +0); after it
    # every W gives the same bits, zeros included.
    reduced = combine(pieces) * kind(1.0 / microbatches) + kind(0.0)
    return comm.exchange(np.tile(reduced, world), [mine] * world, sizes)


def gradient_dtype(params: Sequence[torch.Tensor]) -> np.dtype[Any]:
    """The dtype gradients are summed in: the parameters' (float32 for a float32 model, as a
    data-parallel all-reduce sums them), at least float32 (bf16/fp16 gradients are summed in it)."""
    return np.result_type(np.float32, *(np.float64 if p.dtype == torch.float64 else np.float32 for p in params))


def _flat(t: torch.Tensor | None, like: torch.Tensor, dtype: np.dtype[Any]) -> np.ndarray:
    if t is None:
        return np.zeros(like.numel(), dtype=dtype)
    wide = torch.float64 if dtype == np.float64 else torch.float32
    return t.detach().reshape(-1).to(wide).cpu().numpy()


def _as_tensor_of(values: np.ndarray, like: torch.Tensor) -> torch.Tensor:
    """``values`` (float32/64) in ``like``'s dtype, shape and device (rounded as torch rounds)."""
    return torch.from_numpy(np.ascontiguousarray(values)).to(like.dtype).reshape(like.shape).to(like.device)


def microbatch_source(trainer: TorchParts, step: int, size: int) -> Callable[[int], tuple[Any, Any]]:
    """Microbatch ``i`` (of ``size`` examples) of update ``step + 1``, on the trainer's device:
    the sampler's indices, or a slice of the training stream's next batch (every rank draws the
    whole batch, so the streams stay in step)."""
    split = trainer.splits["train"]
    if isinstance(split, Stream):
        with trainer.user_code(f"update {step + 1}: the training stream's next batch"):
            whole = split.next_batch()

        def from_stream(i: int) -> tuple[Any, Any]:
            return place((whole[0][i * size : (i + 1) * size], whole[1][i * size : (i + 1) * size]), trainer.device)

        return from_stream
    idx = trainer.epoch_sampler.batch(step)

    def from_sampler(i: int) -> tuple[Any, Any]:
        return place(split.batch(idx[i * size : (i + 1) * size]), trainer.device)

    return from_sampler


def rank_microbatches(trainer: TorchParts, comm: Comm) -> tuple[range, int]:
    """This rank's microbatches of every update (a contiguous, aligned block of ``M / W``: one
    subtree of the canonical reduction) and their size in examples."""
    microbatches = trainer.micro_steps
    check_world_size(microbatches, comm.world)
    per_rank = microbatches // comm.world
    return range(comm.rank * per_rank, (comm.rank + 1) * per_rank), trainer.config.batch_size // microbatches


def microbatched_update(trainer: TorchParts, step: int, comm: Comm) -> tuple[float, float]:
    """Update ``step + 1`` of ``trainer``'s live objects as this rank's share of the gang (see
    the module); returns the batch's loss (the tree mean of the microbatch losses) and the
    learning rate it used. Runs inside ``TorchTrainer.owned_rngs``."""
    config = trainer.config
    microbatches = trainer.micro_steps
    mine, size = rank_microbatches(trainer, comm)
    model, optimizer = trainer.model, trainer.optimizer
    trainable = [p for p in trainer.params.values() if p.requires_grad]
    buffers = list(trainer.buffers.values())
    acc = gradient_dtype(trainable)
    micro = microbatch_source(trainer, step, size)
    grads: list[np.ndarray] = []
    stats: list[np.ndarray] = []
    with trainer.user_code(f"update {step + 1}"):
        model.train()
        start = [b.detach().clone() for b in buffers]
        for i in mine:
            xb, yb = micro(i)
            with torch.no_grad():
                for b, s in zip(buffers, start, strict=True):
                    b.copy_(s)
            optimizer.zero_grad(set_to_none=True)
            with microbatch_rngs(config.seed, step, i, trainer.device):
                with trainer.autocast():
                    loss = trainer.compute_loss(xb, yb)
                backward(trainer, loss)
            grads.append(np.concatenate([np.empty(0, acc), *(_flat(p.grad, p, acc) for p in trainable)]))
            stats.append(microbatch_stats(buffers, loss))
    with np.errstate(over="ignore", invalid="ignore"):  # a diverged update is refused by its loss
        mean_grad = reduce_microbatches(comm, tree_sum(grads), microbatches)
        mean_stats = reduce_microbatches(comm, tree_sum(stats), microbatches)
    with trainer.user_code(f"update {step + 1}"):
        with torch.no_grad():
            offset = 0
            for p in trainable:
                n = p.numel()
                p.grad = _as_tensor_of(mean_grad[offset : offset + n], p)
                offset += n
        mean_loss = install_buffer_means(buffers, mean_stats)
        lr = apply_update(trainer, step)
    return mean_loss, lr


def microbatch_stats(buffers: Sequence[torch.Tensor], loss: torch.Tensor) -> np.ndarray:
    """One microbatch's buffers after its forward (BatchNorm's running statistics) and its loss,
    as one float64 vector (what ``install_buffer_means`` reads back once reduced)."""
    f8 = np.dtype(np.float64)
    return np.concatenate([*(_flat(b, b, f8) for b in buffers), [float(loss.detach())]])


def install_buffer_means(buffers: Sequence[torch.Tensor], mean_stats: np.ndarray) -> float:
    """Set every buffer to its mean over the microbatches (integer buffers rounded), from the
    reduced ``microbatch_stats``; returns the mean loss (its last entry)."""
    offset = 0
    with torch.no_grad():
        for b in buffers:
            n = b.numel()
            mean = mean_stats[offset : offset + n]
            if not b.is_floating_point():
                mean = np.rint(mean)
            b.copy_(
                _as_tensor_of(mean, b)
                if b.is_floating_point()
                else torch.from_numpy(mean.astype(np_dtype(b))).reshape(b.shape).to(b.device)
            )
            offset += n
    return float(mean_stats[offset])


def byte_shares(sizes: Sequence[int], world: int) -> list[range]:
    """Contiguous ranges of items (blocks of ``sizes`` bytes, in order), one per rank, balanced by
    bytes: item k goes to the rank whose share of the total its first byte falls in."""
    total = max(1, sum(sizes))
    counts = [0] * world  # one pass: owners are non-decreasing in k
    cursor = 0
    for size in sizes:
        counts[min(world - 1, cursor * world // total)] += 1
        cursor += size
    out: list[range] = []
    lo = 0
    for count in counts:
        out.append(range(lo, lo + count))
        lo += count
    return out


class TorchDP:
    """One rank's share of a data-parallel run of a PyTorch adapter trainer (replicated
    optimizer state; each rank writes its own share of every checkpoint)."""

    def __init__(self, trainer: LiveTrainer, comm: Comm, run_id: str, store: Store, options: CheckpointOptions) -> None:
        config = trainer.config
        if config.distributed is None:
            raise ConfigError(
                "distributed", expected="a PyTorch adapter trainer with a 'distributed' section", found=None
            )
        check_world_size(config.distributed.microbatches, comm.world)
        self.trainer, self.comm, self.options = trainer, comm, options
        self.checkpoints = CoordinatedEngine(RunRules(trainer), comm, run_id, store, options)
        self.block_bytes = config.distributed.block_bytes
        self.state: TrainState | None = None
        self._reading: dict[str, np.ndarray] = {}

    # -- state -----------------------------------------------------------------------------

    def _adopt(self, state: TrainState, *, owned: bool = False) -> None:
        """Install ``state`` in the live objects (the adapter's validated import) and hold the
        live export; ``self.state`` stays the same object (callers keep a reference to it).
        ``owned``: ``state``'s arrays are given up (``LiveTrainer.load_state``)."""
        trainer = self.trainer
        with trainer.runtime():
            trainer.load_state(state, owned=owned)
            live = trainer.export_state(state.step, {k: list(v) for k, v in state.history.items()}, state.lineage)
        self._hold(live)

    def _hold(self, live: TrainState) -> None:
        if self.state is None:
            self.state = live
            return
        held = self.state
        held.lineage, held.tensors, held.step, held.cursor = live.lineage, live.tensors, live.step, live.cursor
        held.rng_state, held.history, held.meta = live.rng_state, live.history, live.meta

    def start_fresh(self) -> None:
        """Step 0 (every rank builds the same seeded state)."""
        self._adopt(initial_state(self.trainer, options=self.options))

    # -- training --------------------------------------------------------------------------

    def step(self) -> float:
        """One update; returns its loss (the same on every rank)."""
        state = self.state
        assert state is not None
        trainer = self.trainer
        with trainer.runtime():
            loss = trainer.advance(state.step, state.history, self.comm)
            live = trainer.export_state(state.step + 1, state.history, state.lineage)
        self._hold(live)
        if not math.isfinite(loss):
            raise TrainingDivergedError(
                f"training diverged at step {live.step}: loss is {loss!r}; nothing was committed", field="loss"
            )
        return loss

    # -- checkpoints (the layout ``cairn.distributed.engine.CoordinatedEngine`` asks for) ------

    def load(self, ref: CheckpointRef) -> Manifest:
        """The coordinated load: every rank reads every block (the state is replicated) and
        installs the state through the adapter's import."""
        return self.checkpoints.load(ref, self)

    def save(self) -> SaveOutcome:
        """A coordinated checkpoint of the current step (every rank calls it)."""
        assert self.state is not None
        return self.checkpoints.save(self.state, self)

    def blocks_to_read(self, manifest: Manifest) -> dict[str, np.ndarray]:
        """Every block of the state's tensors, into whole arrays."""
        self._reading, blocks = whole_buffers(manifest, history=False)
        return blocks

    def tensors_read(self) -> dict[str, np.ndarray]:
        tensors, self._reading = self._reading, {}
        return tensors

    def install(self, state: TrainState) -> None:
        self._adopt(state)

    def parts(self) -> dict[str, PartSpec]:
        """The checkpoint's blocked layout: exactly what a single writer of the same state writes."""
        assert self.state is not None
        return parts_of(self.state.tensors, self.block_bytes)

    def my_blocks(self) -> dict[str, np.ndarray]:
        """This rank's contiguous, byte-balanced share of the blocks (views of the live state)."""
        assert self.state is not None
        parts = self.parts()
        views = split_blocks(self.state.tensors, parts)
        names = [b.name for b in plan_blocks(parts)]
        share = byte_shares([views[n].nbytes for n in names], self.comm.world)[self.comm.rank]
        return {names[k]: views[names[k]] for k in share}
