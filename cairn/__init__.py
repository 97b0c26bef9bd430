"""Cairn core: full training state, a bit-exact trainer, checkpoints, stores, effects.

Never imports temporalio: workflows and activities build on this library, not the reverse.
"""

from cairn.checkpoint import CheckpointKind, CheckpointRef, load_training, save_training
from cairn.config import TrainConfig, load_config
from cairn.data import Dataset, load_dataset
from cairn.session import TrainingSession
from cairn.state import Lineage, TrainState
from cairn.stores import open_store
from cairn.trainer import advance, init_state, train

__all__ = [
    "CheckpointKind",
    "CheckpointRef",
    "Dataset",
    "Lineage",
    "TrainConfig",
    "TrainState",
    "TrainingSession",
    "advance",
    "init_state",
    "load_config",
    "load_dataset",
    "load_training",
    "open_store",
    "save_training",
    "train",
]
__version__ = "0.1.0"
