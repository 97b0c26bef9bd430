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
from typing import TYPE_CHECKING

import numpy as np

from cairn.checkpoint.blocks import block_name, plan_blocks
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.manifest import HistoryRef, Manifest, PartSpec
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.training import is_history, split_history, training_content, training_state
from cairn.checkpoint.validate import check_training_manifest, run_bounds
from cairn.distributed.checkpoint import SaveOutcome, agree, coordinated_save, failure_of, read_blocks
from cairn.distributed.comm import Comm
from cairn.distributed.history import gang_history_committed, read_gang_history, write_gang_history
from cairn.distributed.partition import check_world_size, flat_layout
from cairn.distributed.reduce import SliceReducer, combine, tree_sum
from cairn.errors import ConfigError, InvariantError, ManifestError, TrainingDivergedError
from cairn.runs.stages import initial_state
from cairn.state import TrainState, param_shapes
from cairn.stores.base import Store
from cairn.trainers.mlp.arithmetic import adam_update, learning_rate, loss_and_grads

if TYPE_CHECKING:
    from cairn.trainers.mlp.trainer import MLPTrainer

__all__ = ["ZeroMLP"]

GROUPS = ("theta", "adam.m", "adam.v")


class ZeroMLP:
    """One rank's share of a data-parallel run of the built-in MLP."""

    def __init__(self, trainer: MLPTrainer, comm: Comm, run_id: str, store: Store, options: CheckpointOptions) -> None:
        config = trainer.config
        if config.distributed is None:
            raise ConfigError("distributed", expected="the built-in MLP with a 'distributed' section", found=None)
        self.trainer, self.comm, self.run_id, self.store, self.options = trainer, comm, run_id, store, options
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

    def load(self, ref: CheckpointRef) -> Manifest:
        """The coordinated load path onto this world size: each rank checks the manifest against
        the run's trainer, reads the blocks of its own slice (theta, m, v) and the whole history
        (its segments, or in a checkpoint written before them its blocks), then the theta
        slices are all-gathered."""
        failure: list[str] | None = None
        manifest: Manifest | None = None
        try:
            manifest = read_manifest(
                self.store,
                ref,
                expect_kind=None,
                options=self.options,
                expand_index=False,
                bounds=lambda m: run_bounds(self.trainer, m, self.options.limits),
            )
            check_training_manifest(manifest, trainer=self.trainer)
            self._check_layout(manifest)
        except Exception as exc:
            failure = failure_of(exc)
        agree(self.comm, failure, f"restore of {ref}")
        assert manifest is not None and manifest.parts is not None
        targets = self._own_blocks()
        history_parts = {n: p for n, p in manifest.parts.items() if is_history(n)}
        history = {n: np.empty(p.shape) for n, p in history_parts.items()}
        for block in plan_blocks(history_parts):
            targets[block.name] = history[block.tensor].reshape(-1)[block.start : block.stop]
        read_blocks(
            self.comm, self.store, ref, manifest, targets, value_check=self.trainer.check_values, options=self.options
        )
        self._gather_theta()
        _, hist = split_history(history)
        if manifest.history is not None:
            check = self.trainer.check_values
            hist = read_gang_history(self.comm, self.store, ref, manifest.history, self.options, value_check=check)
        self.state = training_state(self.trainer.config, manifest, self._views(), hist)
        self.rng.bit_generator.state = self.state.rng_state
        return manifest

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

    def _check_layout(self, manifest: Manifest) -> None:
        if manifest.parts is None:
            raise ManifestError(
                "a distributed run restores only blocked checkpoints", field="format_version", expected=[2, 3], found=1
            )
        for name in self.layout.names:
            for group in GROUPS:
                spec = manifest.parts.get(f"{group}/{name}")
                if spec is None or spec.block_elems != self.block_elems:
                    raise InvariantError(
                        "block size differs from the run's distributed.block_bytes",
                        field=f"parts[{group}/{name}].block_elems",
                        expected=self.block_elems,
                        found=None if spec is None else spec.block_elems,
                    )

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

    # -- checkpoints -----------------------------------------------------------------------

    def parts(self) -> dict[str, PartSpec]:
        """The checkpoint's blocked layout: exactly what a single writer of the same state writes."""
        assert self.state is not None
        out: dict[str, PartSpec] = {}
        for group in GROUPS:
            out.update(self.layout.parts(group))
        return dict(sorted(out.items()))

    def my_blocks(self) -> dict[str, np.ndarray]:
        """The blocks this rank writes: its slice of theta, m and v (rank 0 writes the history's
        segments before the save: ``cairn.distributed.history``)."""
        assert self.state is not None
        return self._own_blocks()

    def content(self, history: HistoryRef | None = None) -> CheckpointContent:
        assert self.state is not None
        return training_content(self.run_id, self.state, history)

    def save(self) -> SaveOutcome:
        """A coordinated checkpoint of the current step (every rank calls it)."""
        failure: list[str] | None = None
        for name, arr in (
            ("theta", self.theta[self.mine.start : self.mine.stop]),
            ("adam.m", self.m),
            ("adam.v", self.v),
        ):
            if arr.size and not np.isfinite(arr).all():
                failure = [
                    "TrainingDivergedError",
                    f"{name} is not finite at step {self.state.step if self.state else '?'}; nothing was committed",
                ]
                break
        agree(self.comm, failure, "save")
        assert self.state is not None
        check = self.trainer.check_values
        history = write_gang_history(
            self.comm, self.store, self.run_id, self.state.history, self.options, value_check=check
        )
        content = self.content(history)
        saved = coordinated_save(self.comm, self.store, content, self.my_blocks(), self.parts(), self.options)
        if self.comm.rank == 0:
            gang_history_committed(self.store, self.run_id, self.state.step, history, saved)
        self.state.lineage = self.state.lineage.model_copy(update={"parent": saved.fingerprint})  # provenance
        return saved
