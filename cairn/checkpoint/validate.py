"""Training-state rules: what a training checkpoint must satisfy before it replaces a run's state.

Format-level rules (size bounds, format version, kind, schema, layout, checksums, signature,
fingerprint) live in ``cairn.checkpoint.reader``; this module adds what makes the bytes a
*training state* for *this run and this model*:

- config: parses as a TrainConfig and matches the run on every identity field
  (``IDENTITY_FIELDS``: trainer and its options, model, dataset, seed, batch size, tokenizer,
  ``init_from``); a checkpoint naming another trainer is refused before anything is imported;
- lineage: agrees with what the trainer says of itself (model, tokenizer and dataset versions,
  model architecture hash, reproducibility contract), and its dataset content hash equals the
  run's data;
- tensor set: exactly the trainer's ``tensor_specs`` (names, dtypes, shapes — asked of the
  model, not a hard-coded list) plus the history: ``loss``/``lr`` with one value per step and,
  for trainers with a validation split, ``val_step``/``val_loss`` and one ``val_<metric>`` per
  ``trainer.eval_metrics`` with one value per evaluation passed (``trainer.evaluations(step)``) —
  as ``history/KEY`` tensors, or as history segments whose ref tiles each key's length exactly;
- values: finite everywhere, and the trainer's own value rules (the MLP's Adam v >= 0);
- invariants: the trainer's ``check_state`` (cursor vs step, RNG form, data position, ...).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
from pydantic import ValidationError

from cairn.checkpoint.blocks import logical_specs
from cairn.checkpoint.history import check_history_ref
from cairn.checkpoint.manifest import HistoryRef, Manifest
from cairn.checkpoint.options import Limits
from cairn.checkpoint.tensors import dtype_tag
from cairn.checkpoint.training import history_name, is_history
from cairn.config import TrainConfig, config_error_from
from cairn.errors import (
    CairnError,
    IncompatibleConfigError,
    InvariantError,
    ManifestError,
    SizeLimitError,
    TensorSpecError,
)
from cairn.trainers.base import (
    STEP_HISTORY,
    TensorSpec,
    Trainer,
)
from cairn.trainers.loading import (
    IDENTITY_FIELDS,
    check_config_compatible,
    normalized_config,
    require_trusted,
    trainer_for_checkpoint,
)

__all__ = [
    "IDENTITY_FIELDS",
    "expected_tensors",
    "expected_history",
    "check_training_manifest",
    "check_config_compatible",
    "run_bounds",
    "manifest_config",
]

F8 = dtype_tag(np.float64)
WIDEST_ITEMSIZE = 8
"""Bytes per element of the widest dtype a checkpoint may hold (``ALLOWED_DTYPES``)."""


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
        out.update({history_name(k): TensorSpec(F8, (n,)) for k, n in expected_history(trainer, manifest).items()})
    return out


def _check_history(ref: HistoryRef, want: dict[str, int]) -> None:
    """Exactly the expected history keys, each of its expected length, tiled by its segments."""
    missing, extra = sorted(set(want) - set(ref.series)), sorted(set(ref.series) - set(want))
    if missing or extra:
        raise TensorSpecError(
            "missing history" if missing else "unexpected history",
            field="history.series",
            expected=sorted(want),
            found=sorted(ref.series),
        )
    for name, n in want.items():
        if ref.series[name].length != n:
            raise InvariantError(
                "len(history) must equal step" if name in STEP_HISTORY else "one value per evaluation",
                field=f"history.series[{name}].length",
                expected=n,
                found=ref.series[name].length,
            )
    check_history_ref(ref)


def run_bounds(
    trainer: Trainer, manifest: Manifest, ceiling: Limits, *, checked: bool = False, block_bytes: int = 1 << 20
) -> Limits:
    """The bounds a training checkpoint of ``trainer`` at the manifest's step is read under,
    sized by what its tensor specs declare (never above the ``ceiling``): at most as many bytes
    as the declared elements take in the widest dtype a checkpoint may hold (8 bytes), and at
    most as many blocks as the declared elements make in blocks of the *run's* size — its
    config's ``distributed.block_bytes``, else ``block_bytes`` (a single-process run's
    ``CheckpointOptions.block_bytes``) — never the manifest's own (one-element blocks would
    reach the ceiling, and every block entry costs memory). Computed from the specs (Python
    integers): a manifest that claims more is refused before anything is allocated, and one the
    trainer declares at 2 TB is read. (The exact dtypes and shapes are compared next, by
    ``check_training_manifest``.) Unless ``checked``, the checkpoint's config is compared with
    the trainer's first (``IncompatibleConfigError`` naming the field: a checkpoint of another
    model is refused for that, not for its size), then the trainer's ``check_state`` runs (its
    specs may read ``meta``, which must be well formed); a state it refuses is read under the
    ``ceiling`` and refused by ``check_training_manifest``."""
    if not checked:  # the checkpoint is the run's (the config names what differs, before any size), then meta's form
        found = manifest_config(manifest)
        require_trusted(found, trainer.config)
        check_config_compatible(trainer.config, normalized_config(found))
        try:
            trainer.check_state(manifest.step, manifest.cursor, manifest.rng, manifest.meta)
        except CairnError:
            return ceiling  # refused later, in ``check_training_manifest``'s order (the config first)
    specs = expected_tensors(trainer, manifest)
    dist = trainer.config.distributed
    block = dist.block_bytes if dist is not None else block_bytes
    per_block = max(1, block // WIDEST_ITEMSIZE)
    elements = {name: math.prod(spec.shape) for name, spec in specs.items()}
    blocks = sum(max(1, -(-n // per_block)) for n in elements.values())
    return replace(
        ceiling,
        max_total_bytes=min(ceiling.max_total_bytes, WIDEST_ITEMSIZE * sum(elements.values())),
        max_blocks=min(ceiling.max_blocks, blocks),
        sized_by=f"what the run's trainer declares at step {manifest.step}, in {block}-byte blocks",
    )


def manifest_config(manifest: Manifest) -> TrainConfig:
    """The checkpoint's own config, parsed (no trainer is imported)."""
    if manifest.config is None:
        raise ManifestError(field="config", expected="the full trainer config", found=None)
    try:
        return TrainConfig.model_validate(manifest.config)
    except ValidationError as exc:
        raise ManifestError(str(config_error_from(exc, "manifest config", TrainConfig))) from exc


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
        raise IncompatibleConfigError(
            "checkpoint was trained on different data",
            field="lineage.dataset_hash",
            expected=trainer.data_hash,
            found=lineage.dataset_hash,
        )
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
    declared = run_bounds(trainer, manifest, Limits(), checked=True)
    if manifest.total_bytes > declared.max_total_bytes:  # (read_manifest's bounds, if it was not given them)
        raise SizeLimitError(
            field="total_bytes",
            expected=f"<= {declared.max_total_bytes} ({declared.sized_by})",
            found=manifest.total_bytes,
        )
    want_specs = expected_tensors(trainer, manifest)
    have = logical_specs(manifest)
    missing = sorted(set(want_specs) - set(have))
    if missing:
        raise TensorSpecError("missing tensors", field="tensors", expected=missing, found=sorted(have)[:20])
    extra = sorted(set(have) - set(want_specs))
    if extra:
        raise TensorSpecError("unexpected tensors", field="tensors", expected=sorted(want_specs)[:20], found=extra)
    for name, spec in want_specs.items():
        got_dtype, got_shape = have[name]
        if got_dtype != spec.dtype:
            raise TensorSpecError(field=f"tensors[{name}].dtype", expected=spec.dtype, found=got_dtype)
        if got_shape != spec.shape and is_history(name):
            raise InvariantError(
                "len(history) must equal step" if name[8:] in STEP_HISTORY else "one value per evaluation",
                field=f"tensors[{name}].shape",
                expected=list(spec.shape),
                found=list(got_shape),
            )
        if got_shape != spec.shape:
            raise TensorSpecError(field=f"tensors[{name}].shape", expected=list(spec.shape), found=list(got_shape))
    if manifest.history is not None:
        _check_history(manifest.history, expected_history(trainer, manifest))
    return config, trainer
