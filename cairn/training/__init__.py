"""A training state saved and loaded through its trainer: above ``cairn.checkpoint`` (the format,
which knows no trainer) and ``cairn.trainers`` (whose rules decide what a checkpoint must hold).

Modules: ``manager`` (save, and load validated by the run's trainer), ``async_save`` (snapshot
now, persist in the background).
"""

from cairn.training.async_save import AsyncCheckpointer, SaveHandle
from cairn.training.manager import load_training, load_training_with_trainer, save_training

__all__ = ["AsyncCheckpointer", "SaveHandle", "load_training", "load_training_with_trainer", "save_training"]
