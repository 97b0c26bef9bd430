"""Cairn core: full training state, a bit-exact trainer, checkpoints, stores, effects.

Never imports temporalio: workflows and activities build on this library, not the reverse.
The public names below load on first use, so ``import cairn.numerics`` can pin the numerics
profile before numpy is imported.

Its packages and modules are layers, lowest first: each imports only from its own layer or a
lower one, never in a cycle (``tests/unit/test_architecture.py`` holds the same table)::

    0  errors
    1  faults, jsonio, numerics, sampler, corpus, checkpoint_interval
    2  config, config_files, state, data
    3  stores
    4  checkpoint      the format: bytes, manifests, blocks, tensor specs, commit; no trainer
    5  distributed, effects, interop, trackers
    6  trainers        the trainer interface, its trust rule and checks, the built-in trainers
    7  training        a training state saved and loaded through its trainer
    8  session, models
    9  runs, gang

What is public: the names each package exports (its ``__all__``, pinned by
``tests/unit/test_public_api.py``); the modules inside a package are its internals. The app layers
(``activities``, ``workflows``, ``workers``) import ``cairn`` through those names only. The map of
the code: ``docs/architecture.md``.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CheckpointKind": "cairn.checkpoint",
    "CheckpointRef": "cairn.checkpoint",
    "load_training": "cairn.training",
    "save_training": "cairn.training",
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
