"""Cairn core: full training state, a bit-exact trainer, checkpoints, stores, effects.

Never imports temporalio: workflows and activities build on this library, not the reverse.
The public names below load on first use, so ``import cairn.numerics`` can pin the numerics
profile before numpy is imported.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CheckpointKind": "cairn.checkpoint",
    "CheckpointRef": "cairn.checkpoint",
    "load_training": "cairn.checkpoint",
    "save_training": "cairn.checkpoint",
    "TrainConfig": "cairn.config",
    "load_config": "cairn.config",
    "Dataset": "cairn.data",
    "load_dataset": "cairn.data",
    "TrainingSession": "cairn.session",
    "load_checkpoint": "cairn.models",
    "load_model": "cairn.models",
    "Lineage": "cairn.state",
    "TrainState": "cairn.state",
    "open_store": "cairn.stores",
    "advance": "cairn.trainers.mlp.arithmetic",
    "init_state": "cairn.trainers.mlp.arithmetic",
    "train": "cairn.trainers.mlp.arithmetic",
}

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'cairn' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
