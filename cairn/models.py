"""From a checkpoint to a model, in Python: ``load_model`` gives the trainer's model holding a
checkpoint's weights; ``load_checkpoint`` the whole training state and the trainer that checked it.

Both read a checkpoint as ``cairn eval`` and ``cairn ckpt verify`` do: the trust rule of
``cairn.trainers.loading`` (with a config, the config decides and the checkpoint must match it;
without one, only a trainer that ships with Cairn or that ``CAIRN_TRAINERS`` lists is imported),
then every check of a validated import (manifest, signature, model, data, checksums, values).
The trainer is built on the host (``on_host``): a GPU run's checkpoint loads on a CPU machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np

from cairn.checkpoint import CheckpointKind, CheckpointOptions, CheckpointRef, Manifest, read_manifest
from cairn.checkpoint.validate import manifest_config
from cairn.config import TrainConfig, load_config
from cairn.errors import ConfigError
from cairn.state import TrainState
from cairn.stores import open_store
from cairn.trainers.base import Trainer
from cairn.trainers.loading import trainer_for_checkpoint
from cairn.training.manager import load_training_with_trainer

__all__ = ["LiveModel", "LoadedCheckpoint", "load_checkpoint", "load_model"]


@runtime_checkable
class LiveModel(Protocol):
    """A trainer whose model is a live object a state is loaded into (the PyTorch adapter's
    ``TorchTrainer``): ``model`` has ``eval()``, ``load_state`` puts a state's tensors into it."""

    model: Any

    def load_state(self, state: TrainState) -> None: ...


@dataclass(frozen=True)
class LoadedCheckpoint:
    """A checkpoint read and checked: its full training state, its manifest, and its trainer."""

    state: TrainState
    manifest: Manifest
    trainer: Trainer

    def model(self) -> Any:
        """The trainer's model holding this state's weights, for inference. For a trainer with a
        live model (``LiveModel``: a PyTorch trainer, a Hugging Face one) that model, a
        ``torch.nn.Module`` on the CPU in eval mode; for one without (the built-in numpy MLP) the
        weights, ``{name: numpy array}`` under the names ``cairn ckpt export --weights-only``
        writes (the MLP's ``W1``, ``b1``, ... under ``theta/``)."""
        trainer = self.trainer
        if isinstance(trainer, LiveModel):
            trainer.load_state(self.state)
            trainer.model.eval()
            return trainer.model
        names, _ = trainer.exchange_names()
        return {name: np.array(self.state.tensors[ckpt], copy=True) for name, ckpt in names.items()}


def load_checkpoint(
    checkpoint: str | CheckpointRef,
    config: TrainConfig | str | os.PathLike[str] | None = None,
    *,
    on_host: bool = True,
) -> LoadedCheckpoint:
    """Read and check a training checkpoint (``STORE/RUN/training/STEP``) with its trainer: built
    from ``config`` (a ``TrainConfig`` or a config file's path: the run's own config) when given,
    the checkpoint then refused unless it matches it; else from the checkpoint's own config under
    the trust rule. ``on_host``: the trainer on this process's CPU whatever device the config
    names (``False``: on that device). Raises the typed errors of ``cairn.errors`` (``ConfigError``
    for an untrusted trainer, ``IncompatibleConfigError``, ``IntegrityError``, ...)."""
    ref = checkpoint if isinstance(checkpoint, CheckpointRef) else CheckpointRef.parse(checkpoint)
    if ref.kind != CheckpointKind.TRAINING:
        raise ConfigError("checkpoint.kind", expected="training", found=ref.kind.value)
    given = config if isinstance(config, TrainConfig) or config is None else load_config(os.fspath(config))
    store = open_store(ref.store_url)
    options = CheckpointOptions.from_env()  # an entry point: the configured signer and bounds, read once
    read = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING, options=options, expand_index=False)
    trainer = trainer_for_checkpoint(manifest_config(read), given, on_host=on_host)  # the config decides
    state, manifest, trainer = load_training_with_trainer(store, ref, trainer=trainer, options=options)
    return LoadedCheckpoint(state, manifest, trainer)


def load_model(checkpoint: str | CheckpointRef, config: TrainConfig | str | os.PathLike[str] | None = None) -> Any:
    """The trainer's model holding a checkpoint's weights (``LoadedCheckpoint.model``), read with
    every check of ``load_checkpoint``: e.g. ``cairn.load_model(CKPT, config="my.json")``."""
    return load_checkpoint(checkpoint, config).model()
