"""What interop needs of a model (``WeightExchange``): the names other tools know its weights by,
the files around them, and its value rules; and (``ComputedExport``) the exports a model computes
from a state rather than streaming a checkpoint's tensors. A trainer (``cairn.trainers.base.Trainer``) is one;
interop sits below the trainers and never imports one."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    from cairn.state import TrainState

__all__ = ["ComputedExport", "ComputedWeights", "WeightExchange"]


class WeightExchange(Protocol):
    def exchange_names(self) -> tuple[dict[str, str], dict[str, str]]:
        """Weight names as other tools know them (a safetensors file's keys) -> checkpoint
        names, and aliases: further keys that name one of those tensors (tied weights)."""

    def exchange_files(self) -> dict[str, bytes] | None:
        """The files that make an export a directory other tools load; None: weights only."""

    def check_values(self, name: str, values: np.ndarray) -> None:
        """The model's value rules for tensor ``name`` (finite, and its own)."""


@dataclass(frozen=True)
class ComputedWeights:
    """An export computed from a state: the weights by key, the files around them, the weights
    files' stem (``model``, ``adapter_model``) and what the directory is (``huggingface``, ``peft``)."""

    arrays: dict[str, np.ndarray]
    files: dict[str, bytes]
    stem: str
    kind: str


@runtime_checkable
class ComputedExport(Protocol):
    """A model some of whose export formats are computed from a checkpoint's state (LoRA
    adapters merged into their base; the adapters alone, as PEFT writes them)."""

    def computed_formats(self) -> frozenset[str]:
        """The ``ckpt export --format`` values this model computes (empty: none)."""

    def computed_export(self, fmt: str, state: TrainState) -> ComputedWeights:
        """The export in format ``fmt`` of ``state`` (read and checked)."""
