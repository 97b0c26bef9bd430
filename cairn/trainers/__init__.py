"""Trainers: the interface the durable machinery drives, the rules a checkpoint must satisfy for
a trainer, and the built-in trainers.

Modules: ``base`` (the interface), ``loading`` (a trainer by import path, under the trust rule),
``validate`` (a training checkpoint against the run's trainer), ``stages`` (step 0: fresh, or a
new stage on another run's weights), ``mlp`` (the built-in numpy MLP), ``pytorch`` (the PyTorch
adapter, needs the torch extra), ``hf`` (Hugging Face causal LMs, needs the hf extra).
"""

from cairn.checkpoint.tensors import TensorSpec
from cairn.trainers.base import (
    EVAL_HISTORY,
    STEP_HISTORY,
    DataParallelEngine,
    NoOptions,
    StepCallback,
    Trainer,
    check_finite,
    model_hash,
)
from cairn.trainers.loading import (
    check_checkpoint_config,
    check_trainer_options,
    load_trainer,
    normalized_config,
    require_trusted,
    trainer_for_checkpoint,
    trainer_options_model,
)
from cairn.trainers.validate import check_training_manifest

__all__ = [
    "EVAL_HISTORY",
    "STEP_HISTORY",
    "DataParallelEngine",
    "NoOptions",
    "StepCallback",
    "TensorSpec",
    "Trainer",
    "check_checkpoint_config",
    "check_finite",
    "check_trainer_options",
    "check_training_manifest",
    "load_trainer",
    "model_hash",
    "normalized_config",
    "require_trusted",
    "trainer_for_checkpoint",
    "trainer_options_model",
]
