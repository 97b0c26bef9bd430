"""What a user gives the PyTorch adapter: its options (a config section) and what ``build``
returns (model, optimizer, scheduler, data splits, versions)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator
from torch import nn

from cairn.trainers.pytorch.data import DataSplit
from cairn.trainers.pytorch.device import DEVICE_PATTERN
from cairn.trainers.pytorch.scoring import default_loss

__all__ = ["TorchOptions", "TorchSetup"]


class TorchOptions(BaseModel):
    """The adapter's own options; subclass it to add your model's (it is your config section)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    threads: int = Field(default=1, ge=1, le=256)
    """Intra-op threads (``torch.set_num_threads``): part of the bit-exact contract."""
    deterministic: bool = True
    """``torch.use_deterministic_algorithms``; false: the run records the tolerance contract."""
    scheduler_interval: Literal["step", "epoch"] = "step"
    """When the LR scheduler steps: after every update, or at every epoch end (``ReduceLROnPlateau``
    steps at every evaluation, on the validation loss, whatever this says)."""
    eval_batch_size: int = Field(default=1024, ge=1, le=1 << 20)
    """Examples per forward pass when evaluating (a stream evaluates in its loader's batches)."""
    eval_every: int | None = Field(default=None, ge=1)
    """Evaluate on ``val`` every this many updates; null: at every epoch end."""
    epoch_steps: int | None = Field(default=None, ge=1)
    """The updates an epoch means for a training stream that has no ``len()``."""
    clip_grad_norm: float | None = Field(default=None, gt=0)
    """Clip the total L2 norm of the final, unscaled gradient to this (``torch.nn.utils.clip_grad_norm_``)."""
    clip_grad_value: float | None = Field(default=None, gt=0)
    """Clip every gradient element to [-v, v] (``clip_grad_value_``; before the norm clip)."""
    accumulation: int = Field(default=1, ge=1, le=1024)
    """Gradient accumulation: each update's batch in this many micro-steps (a power of two
    dividing ``batch_size``), one optimizer step per update. The same arithmetic as
    ``distributed.microbatches``: accumulation K in one process and K microbatches over any world
    size give the same bits."""
    autocast: Literal["bfloat16", "float16"] | None = None
    """Run forward and loss under ``torch.autocast`` in this dtype, in training and evaluation."""
    grad_scaler: bool = False
    """Loss scaling for float16 autocast (``torch.amp.GradScaler``, float32 parameters); its state is checkpointed."""
    device: str = Field(default="cpu", pattern=DEVICE_PATTERN)
    """``cpu``, ``cuda`` (the current GPU; in a gang, the rank's ``LOCAL_RANK``) or ``cuda:N``:
    where the model, its optimizer state, batches and RNG live; a machine without CUDA refuses it at once."""

    @model_serializer(mode="wrap")
    def _cpu_is_implied(self, handler: Any) -> Any:
        """``device: cpu`` is left out of a dump: a CPU run's config dumps, hashes and names its run
        as it did before the option existed."""
        body = handler(self)
        if body.get("device") == "cpu":
            body.pop("device")
        return body

    @model_validator(mode="after")
    def _power_of_two(self) -> TorchOptions:
        k = self.accumulation
        if k & (k - 1):
            raise ValueError(f"accumulation must be a power of two (expected 1, 2, 4, ..., found {k})")
        if self.clip_grad_norm is not None and not math.isfinite(self.clip_grad_norm):
            raise ValueError(f"clip_grad_norm must be finite (found {self.clip_grad_norm})")
        return self


@dataclass
class TorchSetup:
    """What ``TorchTrainer.build`` returns: the objects the adapter trains and checkpoints."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    train: DataSplit
    """An ``(x, y)`` pair, a map-style dataset, a ``DataLoader`` over one (its dataset, batch
    size and collate function; Cairn's seeded sampler replaces its own), or a resumable stream:
    an ``IterableDataset`` or loader with ``state_dict()``/``load_state_dict()`` (torchdata's
    ``StatefulDataLoader``), whose state rides in the checkpoint's data cursor."""
    scheduler: Any = None
    """A ``torch.optim.lr_scheduler.LRScheduler`` or ``ReduceLROnPlateau`` (state plain JSON;
    infinities are kept)."""
    val: DataSplit | None = None
    test: DataSplit | None = None
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = default_loss
    """``loss_fn(model(x), y)``: training loss (see ``TorchTrainer.compute_loss``) and the
    validation loss. The default is cross-entropy over the last axis (classes or a vocabulary)."""
    version: str = "torch-model-v1"
    """The model's version, recorded in the lineage."""
    data_version: str = "data-v1"
