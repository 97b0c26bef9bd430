"""Trainers: the interface the durable machinery drives, and the built-in implementation.

``cairn.trainers.mlp.MLPTrainer`` is the built-in float64 numpy MLP; the PyTorch adapter is
``cairn.trainers.pytorch.TorchTrainer`` (needs the ``torch`` extra).
"""

from cairn.trainers.base import (
    EVAL_HISTORY,
    STEP_HISTORY,
    NoOptions,
    StepCallback,
    TensorSpec,
    Trainer,
    load_trainer,
    model_hash,
    trainer_for_checkpoint,
)

__all__ = [
    "EVAL_HISTORY",
    "STEP_HISTORY",
    "NoOptions",
    "StepCallback",
    "TensorSpec",
    "Trainer",
    "load_trainer",
    "model_hash",
    "trainer_for_checkpoint",
]
