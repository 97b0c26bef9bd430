"""What the PyTorch adapter's parts see of its trainer: ``TorchParts``, the live objects, hooks and
setup facts the update, evaluation, probe and checks modules work on, and ``LiveTrainer``, what
the data-parallel engine drives besides the trainer interface. ``TorchTrainer`` is both; the
modules that type against them never import it."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, NamedTuple, Protocol

import torch
from torch import nn

from cairn.checkpoint.tensors import TensorSpec
from cairn.config import TrainConfig
from cairn.distributed.comm import Comm
from cairn.sampler import EpochSampler
from cairn.state import Lineage, TrainState
from cairn.trainers.base import Trainer
from cairn.trainers.pytorch.data import Split
from cairn.trainers.pytorch.setup import TorchOptions, TorchSetup
from cairn.trainers.pytorch.streams import Stream

__all__ = ["LiveTrainer", "OptimizerProbe", "TorchParts"]


class OptimizerProbe(NamedTuple):
    """The optimizer's per-parameter state, as one probe step shows it (``probe``)."""

    tensors: dict[str, TensorSpec]
    """``NAME/KEY`` -> the spec of a tensor of state."""
    scalars: dict[str, type]
    """``KEY`` -> the JSON type of a scalar of state."""
    stateful: list[str]
    """The parameters that have any state (plain SGD keeps none)."""


class TorchParts(Protocol):
    """A PyTorch adapter trainer as its parts see it: read, called, never re-bound."""

    # -- the run's config and the setup ``build()`` returned --------------------------------
    @property
    def config(self) -> TrainConfig: ...
    @property
    def options(self) -> TorchOptions: ...
    @property
    def setup(self) -> TorchSetup: ...

    # -- the live objects -------------------------------------------------------------------
    @property
    def model(self) -> nn.Module: ...
    @property
    def optimizer(self) -> torch.optim.Optimizer: ...
    @property
    def scheduler(self) -> Any: ...
    @property
    def plateau(self) -> bool: ...  # a ReduceLROnPlateau: it steps on the validation loss
    @property
    def scaler(self) -> torch.amp.GradScaler | None: ...
    @property
    def params(self) -> Mapping[str, nn.Parameter]: ...
    @property
    def buffers(self) -> Mapping[str, torch.Tensor]: ...
    @property
    def device(self) -> torch.device: ...

    # -- data -------------------------------------------------------------------------------
    @property
    def splits(self) -> Mapping[str, Split | Stream]: ...
    @property
    def epoch_sampler(self) -> EpochSampler: ...
    @property
    def micro_steps(self) -> int: ...
    @property
    def eval_history(self) -> bool: ...

    # -- what a checkpoint of this setup holds ----------------------------------------------
    @property
    def group_params(self) -> Sequence[list[str]]: ...  # each param group's parameter names
    @property
    def fresh_groups(self) -> Sequence[Mapping[str, Any]]: ...  # their settings as build() made them
    @property
    def fresh_scheduler(self) -> Any: ...
    @property
    def fresh_scaler(self) -> Any: ...
    def weight_specs(self) -> dict[str, TensorSpec]: ...
    def optimizer_probe(self) -> OptimizerProbe: ...

    # -- the user's hooks -------------------------------------------------------------------
    def forward(self, x: Any) -> Any: ...
    def compute_loss(self, x: Any, y: Any) -> torch.Tensor: ...
    def after_backward(self, step: int) -> None: ...
    def metrics(self, output: Any, target: Any) -> Mapping[str, tuple[float, float]]: ...
    def autocast(self) -> AbstractContextManager[Any]: ...

    # -- where code runs --------------------------------------------------------------------
    def runtime(self) -> AbstractContextManager[None]: ...
    def owned_rngs(self) -> AbstractContextManager[None]: ...
    def user_code(self, what: str) -> AbstractContextManager[None]: ...


class LiveTrainer(Trainer):
    """A trainer whose state lives in objects it updates in place: what a data-parallel engine
    drives besides the trainer interface."""

    @abstractmethod
    def runtime(self) -> AbstractContextManager[None]:
        """The process-wide settings the live objects run under (threads, deterministic mode)."""

    @abstractmethod
    def load_state(self, state: TrainState, *, owned: bool = False) -> None:
        """Make the live objects hold ``state`` (validated import; ``state`` is not modified).
        ``owned``: the caller gives ``state``'s arrays up (a restore's freshly read buffers,
        held by nothing else): their storage may be adopted instead of copied."""

    @abstractmethod
    def export_state(self, step: int, history: dict[str, list[float]], lineage: Lineage) -> TrainState:
        """The live objects as a state at ``step`` (views of them, not copies)."""

    @abstractmethod
    def advance(self, step: int, history: dict[str, list[float]], comm: Comm | None = None) -> float:
        """Update ``step + 1`` of the live objects, as this rank's share over ``comm``; returns its loss."""
