"""Step 0 of a run: fresh, or a new stage on another run's weights, a safetensors file's or a
PyTorch Distributed Checkpoint's (``config.init_from``).

The new stage's config decides, as ``--config`` does for ``ckpt verify``: the stage contract is
enforced (the reference's config differs from it only in the fields ``init_from.may_change``
lists; ``stage`` and ``init_from`` always may), the reference is read with a trainer built from
the stage's config, never from its own, and its fingerprint is recorded in the new lineage. Only
its weights are read, checked against this stage's model (names, dtypes, shapes, checksums, value
rules); where it agrees with the stage on every identity field it is validated completely first,
as a resume would be (its data, lineage, cursor, RNG and tensor set)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from cairn.checkpoint.blocks import logical_specs
from cairn.checkpoint.exposures import exposure_count
from cairn.checkpoint.manifest import CheckpointKind, Manifest
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.reader import read_logical, read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.tensors import dtype_tag
from cairn.checkpoint.validate import manifest_config
from cairn.config import TrainConfig
from cairn.errors import IncompatibleConfigError, TensorSpecError
from cairn.interop.dcp import read_dcp_weights
from cairn.interop.weights import ImportedWeights, read_weights
from cairn.state import ReferenceSnapshot, TrainState
from cairn.stores import Store, open_store
from cairn.trainers.base import Trainer
from cairn.trainers.loading import first_difference, normalized_config, trainer_for_checkpoint
from cairn.trainers.validate import check_training_manifest

__all__ = ["initial_state"]


ALWAYS_MAY_CHANGE = ("stage", "init_from")
SAFETENSORS_SOURCE = "safetensors:"
"""How a lineage's reference names weights read from a safetensors file or directory."""
DCP_SOURCE = "dcp:"
"""How a lineage's reference names weights read from a PyTorch Distributed Checkpoint directory."""


def initial_state(trainer: Trainer, *, options: CheckpointOptions, fresh: TrainState | None = None) -> TrainState:
    """Step 0 of a run: fresh, or — with ``init_from`` — a new stage on a reference's weights.
    ``fresh`` is the trainer's ``init_state()`` when the caller made it (an FSDP rank: its
    sharded weights stood in for by their whole shapes, which the imports check against)."""
    state = trainer.init_state() if fresh is None else fresh
    init = trainer.config.init_from
    if init is None:
        return state
    if init.safetensors is not None:
        path = Path(init.safetensors)
        return _from_file(state, SAFETENSORS_SOURCE, path, read_weights(path, trainer, state.tensors))
    if init.dcp is not None:
        path = Path(init.dcp)
        return _from_file(state, DCP_SOURCE, path, read_dcp_weights(path, trainer, state.tensors))
    assert init.checkpoint is not None
    ref = CheckpointRef.parse(init.checkpoint)
    source = open_store(ref.store_url)
    manifest = read_manifest(source, ref, expect_kind=CheckpointKind.TRAINING, options=options)
    reference = _check_stage_contract(trainer, manifest_config(manifest), init.may_change)
    as_reference = trainer.config.model_copy(update={"init_from": reference.init_from, "stage": reference.stage})
    if first_difference(as_reference, reference) is None:  # the same run's data, model, seed...: check it all
        check_training_manifest(manifest, trainer=trainer_for_checkpoint(reference, as_reference, on_host=True))
    state.tensors.update(_reference_weights(source, ref, manifest, trainer, state, options))
    inherited = exposure_count(source, ref.run_id, manifest.lineage)
    state.lineage = state.lineage.model_copy(
        update={
            "reference": ReferenceSnapshot(
                checkpoint=str(ref),
                fingerprint=manifest.fingerprint,
                run_id=ref.run_id,
                step=ref.step,
                may_change=sorted({*init.may_change, *ALWAYS_MAY_CHANGE}),
            ),
            "final_test_exposures": inherited,
        }
    )
    return state


def _from_file(state: TrainState, source: str, path: Path, imported: ImportedWeights) -> TrainState:
    """Step 0 with the weights read from ``path`` (a safetensors file or Hugging Face directory,
    or a DCP directory: validated against this model before anything replaces a state;
    ``cairn.interop``), its content hash in the lineage."""
    state.tensors.update(imported.arrays)
    state.lineage = state.lineage.model_copy(
        update={
            "reference": ReferenceSnapshot(
                checkpoint=f"{source}{path.resolve()}",
                fingerprint=imported.content_hash,
                run_id="",
                step=0,
                may_change=[],
            )
        }
    )
    return state


def _check_stage_contract(trainer: Trainer, reference: TrainConfig, may_change: Sequence[str]) -> TrainConfig:
    """The reference's config, normalized, once it differs from the stage's only where the
    contract allows; else refused naming the first field that differs (expected: the reference's)."""
    if reference.trainer_path != trainer.path:  # before the reference's options are validated by its trainer's model
        raise IncompatibleConfigError(
            'init_from: a stage keeps its reference\'s trainer ("trainer" in may_change allows its options to change)',
            field="config.trainer.factory",
            expected=reference.trainer_path,
            found=trainer.path,
        )
    reference = normalized_config(reference)  # the stage's own trainer: trusted
    allowed = {*may_change, *ALWAYS_MAY_CHANGE}
    fixed = [name for name in sorted(TrainConfig.model_fields) if name not in allowed]
    diff = first_difference(reference, trainer.config, fixed)
    if diff:
        path, want, got = diff
        name = path.split(".")[1]
        raise IncompatibleConfigError(
            "init_from: the stage contract does not allow this change relative to the reference "
            f"(add {name!r} to init_from.may_change if the new stage may change it)",
            field=path,
            expected=want,
            found=got,
        )
    return reference


def _reference_weights(
    source: Store,
    ref: CheckpointRef,
    manifest: Manifest,
    trainer: Trainer,
    fresh: TrainState,
    options: CheckpointOptions,
) -> dict[str, np.ndarray]:
    """The reference's weights, exactly this model's (names, dtypes and shapes checked before a
    byte is read), read with every checksum and the trainer's value rules; nothing else is read."""
    want = {n: a for n, a in fresh.tensors.items() if trainer.is_weight(n)}
    have = {n: spec for n, spec in logical_specs(manifest).items() if trainer.is_weight(n)}
    if set(have) != set(want):
        raise TensorSpecError(
            "init_from: the reference's weights do not fit this model",
            field="init_from.checkpoint",
            expected=sorted(want)[:10],
            found=sorted(have)[:10],
        )
    for name, (dtype, shape) in sorted(have.items()):
        arr = want[name]
        if (dtype, shape) != (dtype_tag(arr.dtype), arr.shape):
            raise TensorSpecError(
                field=f"init_from: tensors[{name}]",
                expected=f"{dtype_tag(arr.dtype)}{list(arr.shape)}",
                found=f"{dtype}{list(shape)}",
            )
    check = trainer.check_values
    return read_logical(source, ref, manifest, names=set(want), max_workers=options.max_workers, value_check=check)
