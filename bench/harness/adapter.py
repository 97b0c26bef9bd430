"""The Cairn PyTorch adapter on the bench's state: a module holding the same parameters (float64)
and Adam with the same moments, saved through the adapter (zero-copy views of the live tensors)
and restored by a validated import against the model (tensor specs learnt from the optimizer)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from pydantic import BaseModel

from cairn.checkpoint import latest_committed
from cairn.config import parse_config
from cairn.state import TrainState
from cairn.stores import LocalStore
from cairn.trainers.pytorch.trainer import TorchOptions, TorchSetup, TorchTrainer
from cairn.training import load_training, save_training


class BenchOptions(TorchOptions):
    shapes: dict[str, list[int]] = {}


class BenchModel(TorchTrainer):
    """A module whose parameters have the bench state's shapes; Adam; no data to speak of."""

    Options: ClassVar[type[BaseModel]] = BenchOptions
    options: BenchOptions

    def build(self) -> TorchSetup:
        module = torch.nn.Module()
        for name, shape in self.options.shapes.items():
            module.register_parameter(name, torch.nn.Parameter(torch.zeros(*shape, dtype=torch.float64)))
        optimizer = torch.optim.Adam(module.parameters(), lr=1e-3)
        x = torch.zeros(4, 1, dtype=torch.float64)
        return TorchSetup(model=module, optimizer=optimizer, train=(x, torch.zeros(4, dtype=torch.int64)))


def adapter_state(state: TrainState) -> tuple[BenchModel, TrainState]:
    """The bench's theta, m, v as a trained torch module + Adam state, exported by the adapter."""
    shapes = {name: list(a.shape) for name, a in state.params.items()}
    config = parse_config(
        {"batch_size": 1, "trainer": {"factory": "bench.harness.adapter:BenchModel", "options": {"shapes": shapes}}}
    )
    from cairn.trainers.loading import load_trainer

    trainer = load_trainer(config)
    assert isinstance(trainer, BenchModel)
    with torch.no_grad():
        for name, p in trainer.params.items():
            p.copy_(torch.from_numpy(state.params[name]))
            trainer.optimizer.state[p] = {
                "step": torch.tensor(10.0),
                "exp_avg": torch.from_numpy(state.m[name].copy()),
                "exp_avg_sq": torch.from_numpy(state.v[name].copy()),
            }
    history: dict[str, list[float]] = {"loss": [0.0] * 10, "lr": [1e-3] * 10}
    exported = trainer.export_state(10, history, trainer.lineage())  # zero-copy views of the live tensors
    return trainer, exported


def adapter_case(state: TrainState, work: Any, options: Any) -> tuple[Any, Any]:
    trainer, exported = adapter_state(state)
    store = LocalStore(work / "adapter")

    def save() -> None:
        store.delete([o.key for o in store.list("")])
        save_training(store, "adapter", exported, options=options)

    def load() -> object:
        ref = latest_committed(store, "adapter")
        assert ref is not None
        restored, _ = load_training(store, ref, trainer=trainer, options=options)
        return {k: v for k, v in restored.tensors.items() if not k.startswith("rng/")}

    return save, load


__all__ = ["BenchModel", "adapter_case", "adapter_state"]
