"""What interop needs of a model (``WeightExchange``): the names other tools know its weights by,
the files around them, and its value rules. A trainer (``cairn.trainers.base.Trainer``) is one;
interop sits below the trainers and never imports one."""

from __future__ import annotations

from typing import Protocol

import numpy as np

__all__ = ["WeightExchange"]


class WeightExchange(Protocol):
    def exchange_names(self) -> tuple[dict[str, str], dict[str, str]]:
        """Weight names as other tools know them (a safetensors file's keys) -> checkpoint
        names, and aliases: further keys that name one of those tensors (tied weights)."""

    def exchange_files(self) -> dict[str, bytes] | None:
        """The files that make an export a directory other tools load; None: weights only."""

    def check_values(self, name: str, values: np.ndarray) -> None:
        """The model's value rules for tensor ``name`` (finite, and its own)."""
