"""Training-state rules: what a training checkpoint must satisfy before it replaces a run's state,
asked of the run's trainer (the checks themselves, given its specs: ``cairn.checkpoint.validate``):

- config: parses as a TrainConfig and matches the run on every identity field
  (``IDENTITY_FIELDS``: trainer and its options, model, dataset, seed, batch size, tokenizer,
  ``init_from``); a checkpoint naming another trainer is refused before anything is imported;
- lineage: agrees with what the trainer says of itself (model, tokenizer and dataset versions,
  model architecture hash, reproducibility contract), and its dataset content hash equals the
  run's data (refused in the trainer's words: ``other_data_error``, which may name a changed file);
- tensor set: exactly the trainer's ``tensor_specs`` (names, dtypes, shapes — asked of the
  model, not a hard-coded list) plus the history: ``loss``/``lr`` with one value per step and,
  for trainers with a validation split, ``val_step``/``val_loss`` and one ``val_<metric>`` per
  ``trainer.eval_metrics`` with one value per evaluation passed (``trainer.evaluations(step)``) —
  as ``history/KEY`` tensors, or as history segments whose ref tiles each key's length exactly;
- values: finite everywhere, and the trainer's own value rules (the MLP's Adam v >= 0);
- invariants: the trainer's ``check_state`` (cursor vs step, RNG form, data position, ...).

``RunRules`` hands these rules to a gang's coordinated engine (``cairn.distributed.engine``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cairn.checkpoint.manifest import Manifest
from cairn.checkpoint.options import Limits
from cairn.checkpoint.tensors import TensorSpec
from cairn.checkpoint.validate import (
    check_declared_size,
    check_history_lengths,
    check_tensor_specs,
    declared_bounds,
    history_specs,
    manifest_config,
)
from cairn.config import TrainConfig
from cairn.errors import CairnError, InvariantError, ManifestError
from cairn.trainers.base import STEP_HISTORY, Trainer
from cairn.trainers.loading import check_config_compatible, normalized_config, require_trusted, trainer_for_checkpoint

__all__ = ["expected_tensors", "expected_history", "check_training_manifest", "run_bounds", "RunRules"]


def expected_history(trainer: Trainer, manifest: Manifest) -> dict[str, int]:
    """History key -> how many values a training checkpoint at the manifest's step holds."""
    out = dict.fromkeys(STEP_HISTORY, manifest.step)
    if trainer.eval_history:
        keys = ("val_step", "val_loss", *(f"val_{m}" for m in trainer.eval_metrics(manifest.meta)))
        out.update(dict.fromkeys(keys, trainer.evaluations(manifest.step)))
    return out


def expected_tensors(trainer: Trainer, manifest: Manifest) -> dict[str, TensorSpec]:
    """Tensor name -> spec that a training checkpoint of ``trainer`` at the manifest's step must
    hold (its history among them, as ``history/KEY``, unless it is kept in segments)."""
    out = dict(trainer.tensor_specs(manifest.step, manifest.meta))
    if manifest.history is None:
        out.update(history_specs(expected_history(trainer, manifest)))
    return out


def run_bounds(
    trainer: Trainer, manifest: Manifest, ceiling: Limits, *, checked: bool = False, block_bytes: int = 1 << 20
) -> Limits:
    """The bounds a training checkpoint of ``trainer`` at the manifest's step is read under,
    sized by what its tensor specs declare (``cairn.checkpoint.validate.declared_bounds``, never
    above the ``ceiling``), in blocks of the *run's* size — its config's
    ``distributed.block_bytes``, else ``block_bytes`` (a single-process run's
    ``CheckpointOptions.block_bytes``) — never the manifest's own (one-element blocks would
    reach the ceiling, and every block entry costs memory). (The exact dtypes and shapes are
    compared next, by ``check_training_manifest``.) Unless ``checked``, the checkpoint's config
    is compared with the trainer's first (``IncompatibleConfigError`` naming the field: a
    checkpoint of another model is refused for that, not for its size), then the trainer's
    ``check_state`` runs (its specs may read ``meta``, which must be well formed); a state it
    refuses is read under the ``ceiling`` and refused by ``check_training_manifest``."""
    if not checked:  # the checkpoint is the run's (the config names what differs, before any size), then meta's form
        found = manifest_config(manifest)
        require_trusted(found, trainer.config)
        check_config_compatible(trainer.config, normalized_config(found))
        try:
            trainer.check_state(manifest.step, manifest.cursor, manifest.rng, manifest.meta)
        except CairnError:
            return ceiling  # refused later, in ``check_training_manifest``'s order (the config first)
    dist = trainer.config.distributed
    block = dist.block_bytes if dist is not None else block_bytes
    sized_by = f"what the run's trainer declares at step {manifest.step}, in {block}-byte blocks"
    return declared_bounds(expected_tensors(trainer, manifest), ceiling, block=block, sized_by=sized_by)


def check_training_manifest(
    manifest: Manifest,
    *,
    run_config: TrainConfig | None = None,
    trainer: Trainer | None = None,
) -> tuple[TrainConfig, Trainer]:
    """Metadata rules, checked before any tensor bytes are read.

    ``trainer`` is the run's trainer; without it, ``trainer_for_checkpoint`` builds one: from
    ``run_config`` when given (the run's config decides), else from the checkpoint's own config
    under the trust rule. The checkpoint's config must match the trainer's on every identity
    field. Returns the checkpoint's config and the trainer that validates (and will train) it.
    """
    found = manifest_config(manifest)
    if trainer is None:
        trainer = trainer_for_checkpoint(found, run_config)
    else:
        require_trusted(found, trainer.config)  # before the checkpoint's trainer is imported
    config = normalized_config(found)
    check_config_compatible(trainer.config, config)
    lineage = manifest.lineage
    if lineage is None:
        raise ManifestError(field="lineage", expected="dataset and model versions", found=None)
    if lineage.dataset_hash != trainer.data_hash:
        raise trainer.other_data_error(lineage.dataset_hash, manifest.meta)
    own = trainer.lineage()
    for field in ("model_version", "tokenizer_version", "dataset_version", "trainer", "model_hash", "reproducibility"):
        want, got = getattr(own, field), getattr(lineage, field)
        if want != got:
            raise InvariantError(
                "lineage disagrees with the checkpoint's config and model",
                field=f"lineage.{field}",
                expected=want,
                found=got,
            )
    trainer.check_state(manifest.step, manifest.cursor, manifest.rng, manifest.meta)
    check_declared_size(manifest, run_bounds(trainer, manifest, Limits(), checked=True))
    check_tensor_specs(manifest, expected_tensors(trainer, manifest))
    if manifest.history is not None:
        check_history_lengths(manifest.history, expected_history(trainer, manifest))
    return config, trainer


@dataclass(frozen=True)
class RunRules:
    """The run's trainer's rules for a training checkpoint, as a gang's coordinated engine asks
    them (``cairn.distributed.engine.TrainingRules``)."""

    trainer: Trainer

    @property
    def config(self) -> TrainConfig:
        return self.trainer.config

    def bounds(self, manifest: Manifest, ceiling: Limits) -> Limits:
        return run_bounds(self.trainer, manifest, ceiling)

    def check_manifest(self, manifest: Manifest) -> None:
        check_training_manifest(manifest, trainer=self.trainer)

    def check_values(self, name: str, values: np.ndarray) -> None:
        self.trainer.check_values(name, values)
