"""The built-in MLP, data-parallel over any world size, ZeRO-1 sharded, bit-identical for every W.

Each update (``ZeroMLP.step``):

1. every rank draws the same batch (the data cursor and the RNG are global, not per rank) and
   computes the mean loss and gradient of its own contiguous block of the M microbatches;
2. it sums them as its subtree of the canonical tree (``cairn.distributed.reduce``);
3. the subtree sums are exchanged by one all-to-all of slices — rank j receives every rank's
   partial sum of the slice it owns (the traffic of a reduce-scatter) — and combined by the top
   of the tree, in microbatch order: the full batch's gradient, for the owned slice only;
4. the rank applies Adam to its slice (it alone holds that slice's m and v: ZeRO-1);
5. the updated slices are all-gathered, so every rank holds the full parameters again.

Elementwise arithmetic (Adam) gives the same bits on a slice as on a whole tensor, and the tree
fixes the order of every sum, so the state after each update does not depend on W; at W=1 it
is exactly ``MLPTrainer.train`` with the same ``distributed`` config.
"""

from __future__ import annotations

import math
from abc import abstractmethod

import numpy as np

from cairn.checkpoint.blocks import block_name
from cairn.checkpoint.manifest import Manifest, PartSpec
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.ref import CheckpointRef
from cairn.data import Dataset
from cairn.distributed.checkpoint import SaveOutcome
from cairn.distributed.comm import Comm
from cairn.distributed.engine import CoordinatedEngine
from cairn.distributed.partition import check_world_size, flat_layout
from cairn.distributed.reduce import SliceReducer, combine, tree_sum
from cairn.errors import ConfigError, TrainingDivergedError
from cairn.sampler import EpochSampler
from cairn.state import TrainState, param_shapes
from cairn.stores.base import Store
from cairn.trainers.base import Trainer
from cairn.trainers.mlp.arithmetic import adam_update, learning_rate, loss_and_grads
from cairn.trainers.stages import initial_state
from cairn.trainers.validate import RunRules

__all__ = ["ZeroMLP", "ZeroTrainer"]

GROUPS = ("theta", "adam.m", "adam.v")


class ZeroTrainer(Trainer):
    """What the engine needs of the MLP besides the trainer interface: its training data, the
    epoch sampler (None: batches drawn with replacement from the state's RNG) and the hook that
    records the data position and the epoch-end evaluation after an update."""

    train_data: Dataset
    sampler: EpochSampler | None

    @abstractmethod
    def after_update(self, state: TrainState) -> None:
        """Called after update ``state.step`` (the sampler's cursor, the evaluation at epoch ends)."""


class ZeroMLP:
    """One rank's share of a data-parallel run of the built-in MLP."""

    def __init__(self, trainer: ZeroTrainer, comm: Comm, run_id: str, store: Store, options: CheckpointOptions) -> None:
        config = trainer.config
        if config.distributed is None:
            raise ConfigError("distributed", expected="the built-in MLP with a 'distributed' section", found=None)
        self.trainer, self.comm, self.options = trainer, comm, options
        self.checkpoints = CoordinatedEngine(RunRules(trainer), comm, run_id, store, options)
        self.microbatches = config.distributed.microbatches
        check_world_size(self.microbatches, comm.world)
        self.block_elems = config.distributed.block_bytes // 8
        self.layout = flat_layout(param_shapes(config, config.data.n_features), self.block_elems)
        self.slices = self.layout.slices(comm.world)
        self.mine = self.slices[comm.rank]
        self.reducer = SliceReducer(comm, [s.size for s in self.slices])
        self.theta = np.zeros(self.layout.size)
        self.m = np.zeros(self.mine.size)
        self.v = np.zeros(self.mine.size)
        self.state: TrainState | None = None
        self.rng = np.random.Generator(np.random.PCG64())

    # -- state -----------------------------------------------------------------------------

    def _views(self) -> dict[str, np.ndarray]:
        lay = self.layout
        return {
            f"theta/{n}": self.theta[lay.offsets[n] : lay.offsets[n] + math.prod(lay.shapes[n])].reshape(lay.shapes[n])
            for n in lay.names
        }

    def _adopt(self, full: TrainState) -> None:
        """Take a full state: theta whole, m and v for the owned slice only."""
        lo, hi = self.mine.start, self.mine.stop
        for name in self.layout.names:
            off = self.layout.offsets[name]
            size = math.prod(self.layout.shapes[name])
            self.theta[off : off + size] = full.tensors[f"theta/{name}"].reshape(-1)
        flat_m = np.concatenate([full.tensors[f"adam.m/{n}"].reshape(-1) for n in self.layout.names])
        flat_v = np.concatenate([full.tensors[f"adam.v/{n}"].reshape(-1) for n in self.layout.names])
        self.m[:] = flat_m[lo:hi]
        self.v[:] = flat_v[lo:hi]
        full.tensors = self._views()
        self.state = full
        self.rng.bit_generator.state = full.rng_state

    def start_fresh(self) -> None:
        """Step 0 (every rank computes the same seeded state and keeps its share)."""
        self._adopt(initial_state(self.trainer, options=self.options))

    def _own_blocks(self) -> dict[str, np.ndarray]:
        """Block entry name -> this rank's buffer for it: its slice's blocks of theta, m and v
        (views: what a save writes and a restore fills)."""
        lo = self.mine.start
        out: dict[str, np.ndarray] = {}
        for block in self.mine.blocks:
            flat = self.layout.flat_start(block) - lo
            param = block.tensor.split("/", 1)[1]
            out[block.name] = self.theta[lo + flat : lo + flat + block.size]
            out[block_name(f"adam.m/{param}", block.index)] = self.m[flat : flat + block.size]
            out[block_name(f"adam.v/{param}", block.index)] = self.v[flat : flat + block.size]
        return out

    def _gather_theta(self) -> None:
        """Every rank's updated slice to every rank (an all-gather of uneven slices)."""
        self.reducer.all_gather(self.theta[self.mine.start : self.mine.stop], out=self.theta)

    # -- training --------------------------------------------------------------------------

    def step(self) -> float:
        """One update; returns its loss (the same on every rank)."""
        state = self.state
        assert state is not None
        config = self.trainer.config
        opt = config.optimizer
        data, sampler = self.trainer.train_data, self.trainer.sampler
        idx = (
            sampler.batch(state.step)
            if sampler is not None
            else self.rng.integers(0, data.n_examples, size=config.batch_size)
        )
        size = config.batch_size // self.microbatches
        per_rank = self.microbatches // self.comm.world
        first = self.comm.rank * per_rank
        params = {k[len("theta/") :]: a for k, a in state.tensors.items()}
        grads: list[np.ndarray] = []
        losses: list[float] = []
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            for i in range(first, first + per_rank):
                rows = idx[i * size : (i + 1) * size]
                loss_i, grad_i = loss_and_grads(params, data.x[rows], data.y[rows])
                grads.append(np.concatenate([grad_i[n].reshape(-1) for n in self.layout.names]))
                losses.append(loss_i)
            partial = tree_sum(grads)
            scale = 1.0 / self.microbatches
            g = self.reducer.reduce_scatter(partial)  # the top of the tree, in microbatch order
            g *= scale
            g += 0.0  # -0.0 -> +0.0, however many additions there were
            loss = combine(self.comm.all_gather_float(tree_sum(losses))) * scale
            t = state.step + 1
            lr = learning_rate(config, t)
            theta = self.theta[self.mine.start : self.mine.stop]
            adam_update(theta, g, self.m, self.v, opt, lr, 1.0 - opt.beta1**t, 1.0 - opt.beta2**t)
        self._gather_theta()
        state.step = t
        state.cursor += config.batch_size
        state.history["loss"].append(loss)
        state.history["lr"].append(lr)
        state.rng_state = dict(self.rng.bit_generator.state)
        if sampler is not None or self.trainer.eval_history:
            self.trainer.after_update(state)  # the data position; evaluation at epoch ends
        if not math.isfinite(loss):
            raise TrainingDivergedError(
                f"training diverged at step {t}: loss is {loss!r}; nothing was committed", field="loss"
            )
        return loss

    # -- checkpoints (the layout ``cairn.distributed.engine.CoordinatedEngine`` asks for) ------

    def load(self, ref: CheckpointRef) -> Manifest:
        """The coordinated load onto this world size: each rank reads the blocks of its own slice
        (theta, m, v) and the whole history, then the theta slices are all-gathered."""
        return self.checkpoints.load(ref, self)

    def save(self) -> SaveOutcome:
        """A coordinated checkpoint of the current step (every rank calls it)."""
        assert self.state is not None
        return self.checkpoints.save(self.state, self)

    def blocks_to_read(self, manifest: Manifest) -> dict[str, np.ndarray]:
        return self._own_blocks()

    def tensors_read(self) -> dict[str, np.ndarray]:
        self._gather_theta()
        return self._views()

    def install(self, state: TrainState) -> None:
        """Hold a restored state (its tensors are views of the gathered theta)."""
        self.state = state
        self.rng.bit_generator.state = state.rng_state

    def parts(self) -> dict[str, PartSpec]:
        """The checkpoint's blocked layout: exactly what a single writer of the same state writes."""
        assert self.state is not None
        out: dict[str, PartSpec] = {}
        for group in GROUPS:
            out.update(self.layout.parts(group))
        return dict(sorted(out.items()))

    def my_blocks(self) -> dict[str, np.ndarray]:
        """The blocks this rank writes: its slice of theta, m and v (the history's segments are
        written by rank 0: ``cairn.distributed.history``)."""
        assert self.state is not None
        return self._own_blocks()
