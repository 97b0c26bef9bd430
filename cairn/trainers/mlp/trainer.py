"""The built-in trainer: the float64 numpy MLP of ``cairn.trainers.mlp.arithmetic`` behind the trainer interface.

Unchanged in behaviour from format v1: with the default data settings (sampling with
replacement, no held-out splits) its states, checkpoints and fingerprints are the v1 ones.
``data.sampling = "epoch"`` draws epochs without replacement (``cairn.sampler``);
``data.val_fraction`` holds out a validation split evaluated at every epoch end and
``data.test_fraction`` a final test split for ``cairn eval --split test``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from pydantic import BaseModel

from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.tensors import TensorSpec
from cairn.config import TrainConfig
from cairn.data import Dataset, load_dataset
from cairn.distributed.comm import Comm
from cairn.errors import InvariantError
from cairn.sampler import EpochSampler
from cairn.state import StepCallback, TrainState, param_shapes, rng_state_problem
from cairn.stores.base import Store
from cairn.trainers.base import DataParallelEngine
from cairn.trainers.mlp.arithmetic import init_state, loss_and_grads, train
from cairn.trainers.mlp.zero import ZeroMLP, ZeroTrainer

__all__ = ["MLPTrainer", "split_dataset"]

F8 = np.dtype("<f8").str
_SPLIT_DOMAIN = 0x5B17


def split_dataset(dataset: Dataset, val_fraction: float, test_fraction: float, seed: int) -> dict[str, Dataset]:
    """Train/val/test splits by one seeded permutation of the examples. Without held-out
    fractions the training split is the whole dataset, in its own order (the v1 behaviour)."""
    if not val_fraction and not test_fraction:
        return {"train": dataset}
    n = dataset.n_examples
    n_val, n_test = int(n * val_fraction), int(n * test_fraction)
    order = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, _SPLIT_DOMAIN]))).permutation(n)
    parts = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
    return {
        name: Dataset(x=dataset.x[idx], y=dataset.y[idx], content_hash=dataset.content_hash, version=dataset.version)
        for name, idx in parts.items()
        if idx.size
    }


def evaluate_split(params: dict[str, np.ndarray], data: Dataset) -> dict[str, float]:
    loss, _ = loss_and_grads(params, data.x, data.y)
    hidden = "W1" in params
    if hidden:
        logits = np.tanh(data.x @ params["W1"] + params["b1"]) @ params["W2"] + params["b2"]
    else:
        logits = data.x @ params["W"] + params["b"]
    accuracy = float(np.mean(np.argmax(logits, axis=1) == data.y))
    return {"loss": loss, "accuracy": accuracy}


class MLPTrainer(ZeroTrainer):
    """A one-hidden-layer tanh MLP (or softmax regression) with Adam, in float64 numpy."""

    def __init__(self, config: TrainConfig, options: BaseModel) -> None:
        super().__init__(config, options)
        self.dataset = load_dataset(config.data)
        d = config.data
        self.splits = split_dataset(self.dataset, d.val_fraction, d.test_fraction, d.seed)
        self.train_data = self.splits["train"]
        self.sampler = (
            EpochSampler(self.train_data.n_examples, config.batch_size, config.seed) if d.sampling == "epoch" else None
        )
        self.eval_history = "val" in self.splits

    @property
    def data_hash(self) -> str:
        return self.dataset.content_hash

    @property
    def steps_per_epoch(self) -> int:
        return max(1, self.train_data.n_examples // self.config.batch_size)

    def init_state(self) -> TrainState:
        state = init_state(self.config, self.dataset)
        if self.eval_history:
            state.history.update({"val_step": [], "val_loss": [], "val_accuracy": []})
        if self.sampler is not None:
            state.meta = {"data": self.sampler.cursor_json(0)}
        return state

    def after_update(self, state: TrainState) -> None:
        if self.sampler is not None:
            state.meta["data"] = self.sampler.cursor_json(state.step)
        if self.eval_history and state.step % self.steps_per_epoch == 0:
            metrics = evaluate_split(state.params, self.splits["val"])
            state.history["val_step"].append(float(state.step))
            state.history["val_loss"].append(metrics["loss"])
            state.history["val_accuracy"].append(metrics["accuracy"])

    def train(self, state: TrainState, steps: int, on_step: StepCallback | None = None) -> TrainState:
        needs_hook = self.sampler is not None or self.eval_history
        return train(
            state,
            self.train_data,
            steps,
            on_step,
            sampler=self.sampler,
            after_update=self.after_update if needs_hook else None,
        )

    def tensor_specs(self, step: int, meta: Mapping[str, Any]) -> dict[str, TensorSpec]:
        out: dict[str, TensorSpec] = {}
        for name, shape in param_shapes(self.config, self.config.data.n_features).items():
            for group in ("theta", "adam.m", "adam.v"):
                out[f"{group}/{name}"] = TensorSpec(F8, shape)
        return out

    def is_weight(self, name: str) -> bool:
        return name.startswith("theta/")

    def check_state(self, step: int, cursor: int, rng: Any, meta: Mapping[str, Any]) -> None:
        problem = rng_state_problem(rng)
        if problem:
            raise InvariantError("RNG state is malformed", field=problem[0], expected=problem[1], found=problem[2])
        self.check_cursor(step, cursor)
        expected_meta = {"data": self.sampler.cursor_json(step)} if self.sampler is not None else {}
        if self.sampler is not None:
            self.sampler.check_cursor(step, meta.get("data"))
        if dict(meta) != expected_meta:
            raise InvariantError("unexpected trainer state", field="meta", expected=expected_meta, found=dict(meta))

    def check_values(self, name: str, values: np.ndarray) -> None:
        super().check_values(name, values)
        if name.startswith("adam.v/") and values.size and values.min() < 0:
            raise InvariantError(
                "Adam second moment must be >= 0", field=f"tensors[{name}]", expected=">= 0", found=float(values.min())
            )

    def data_parallel(self, comm: Comm, run_id: str, store: Store, options: CheckpointOptions) -> DataParallelEngine:
        """ZeRO-1: each rank holds the full parameters and its own slice of Adam's moments."""
        return ZeroMLP(self, comm, run_id, store, options)

    def evaluate(self, state: TrainState, split: str) -> dict[str, float] | None:
        data = self.splits.get(split)
        return None if data is None else evaluate_split(state.params, data)
