"""What a user gives the PyTorch adapter: its options (a config section) and what ``build``
returns (model, optimizer, scheduler, data splits, versions)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from cairn.trainers.pytorch.data import DataSplit

__all__ = ["TorchOptions", "TorchSetup"]


class TorchOptions(BaseModel):
    """The adapter's own options; subclass it to add your model's (it is your config section)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    threads: int = Field(default=1, ge=1, le=256)
    """Intra-op threads (``torch.set_num_threads``): part of the bit-exact contract."""
    deterministic: bool = True
    """``torch.use_deterministic_algorithms``; false: the run records the tolerance contract."""
    scheduler_interval: Literal["step", "epoch"] = "step"
    """When the LR scheduler steps: after every update, or at every epoch end."""
    eval_batch_size: int = Field(default=1024, ge=1, le=1 << 20)


@dataclass
class TorchSetup:
    """What ``TorchTrainer.build`` returns: the objects the adapter trains and checkpoints."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    train: DataSplit
    scheduler: Any = None
    """A ``torch.optim.lr_scheduler.LRScheduler`` (its ``state_dict`` must be plain JSON)."""
    val: DataSplit | None = None
    test: DataSplit | None = None
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = nn.functional.cross_entropy
    version: str = "torch-model-v1"
    """The model's version, recorded in the lineage."""
    data_version: str = "data-v1"
