"""Trainers: the interface the durable machinery drives (``base``), loading one by import path
under the trust rule (``loading``), the built-in numpy MLP (``mlp``) and the PyTorch adapter
(``pytorch``, needs the ``torch`` extra)."""

from cairn.trainers.base import (
    EVAL_HISTORY,
    STEP_HISTORY,
    DataParallelEngine,
    NoOptions,
    StepCallback,
    TensorSpec,
    Trainer,
    model_hash,
)
from cairn.trainers.loading import load_trainer, trainer_for_checkpoint

__all__ = [
    "EVAL_HISTORY",
    "STEP_HISTORY",
    "DataParallelEngine",
    "NoOptions",
    "StepCallback",
    "TensorSpec",
    "Trainer",
    "load_trainer",
    "model_hash",
    "trainer_for_checkpoint",
]
