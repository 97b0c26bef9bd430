"""Step 0 of a run: fresh, or a new stage on another run's weights or a safetensors file's
(``config.init_from``).

The reference is validated like any import, its fingerprint recorded in the new lineage, and
the stage contract enforced: the new config differs from the reference's only in the fields
``init_from.may_change`` lists (``stage`` and ``init_from`` always may)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cairn.checkpoint.manager import load_training_with_trainer
from cairn.checkpoint.manifest import CheckpointKind
from cairn.checkpoint.options import CheckpointOptions, resolve_options
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.validate import manifest_config
from cairn.config import BUILTIN_TRAINER
from cairn.errors import IncompatibleConfigError, TensorSpecError
from cairn.interop.weights import read_weights
from cairn.runs.exposures import exposure_count
from cairn.state import ReferenceSnapshot, TrainState
from cairn.stores import open_store
from cairn.trainers.base import Trainer
from cairn.trainers.loading import trainer_for_checkpoint

__all__ = ["initial_state"]


ALWAYS_MAY_CHANGE = ("stage", "init_from")
SAFETENSORS_SOURCE = "safetensors:"
"""How a lineage's reference names weights read from a safetensors file or directory."""


def initial_state(trainer: Trainer, *, options: CheckpointOptions | None = None) -> TrainState:
    """Step 0 of a run: fresh, or — with ``init_from`` — a new stage on a reference's weights."""
    state = trainer.init_state()
    init = trainer.config.init_from
    if init is None:
        return state
    if init.safetensors is not None:
        return _from_safetensors(trainer, state, Path(init.safetensors))
    assert init.checkpoint is not None
    ref = CheckpointRef.parse(init.checkpoint)
    options = resolve_options(options)
    source = open_store(ref.store_url)
    manifest = read_manifest(source, ref, expect_kind=CheckpointKind.TRAINING, options=options, expand_index=False)
    ref_config = manifest_config(manifest)
    _check_stage_contract(trainer, ref_config.model_dump(mode="json"), init.may_change)
    ref_trainer = trainer_for_checkpoint(ref_config, trainer.config)  # the same factory: checked above
    ref_state, ref_manifest, _ = load_training_with_trainer(source, ref, trainer=ref_trainer, options=options)
    weights = {n: a for n, a in ref_state.tensors.items() if trainer.is_weight(n)}
    want = {n: a for n, a in state.tensors.items() if trainer.is_weight(n)}
    if set(weights) != set(want):
        raise TensorSpecError(
            "init_from: the reference's weights do not fit this model",
            field="init_from.checkpoint",
            expected=sorted(want)[:10],
            found=sorted(weights)[:10],
        )
    for name, arr in weights.items():
        if arr.shape != want[name].shape or arr.dtype != want[name].dtype:
            raise TensorSpecError(
                field=f"init_from: tensors[{name}]",
                expected=f"{want[name].dtype}{list(want[name].shape)}",
                found=f"{arr.dtype}{list(arr.shape)}",
            )
        state.tensors[name] = arr.copy()
    inherited = exposure_count(source, ref.run_id, ref_state.lineage)
    state.lineage = state.lineage.model_copy(
        update={
            "reference": ReferenceSnapshot(
                checkpoint=str(ref),
                fingerprint=ref_manifest.fingerprint,
                run_id=ref.run_id,
                step=ref.step,
                may_change=sorted({*init.may_change, *ALWAYS_MAY_CHANGE}),
            ),
            "final_test_exposures": inherited,
        }
    )
    return state


def _from_safetensors(trainer: Trainer, state: TrainState, path: Path) -> TrainState:
    """Step 0 with the weights of a safetensors file or Hugging Face directory (validated
    against this model before anything replaces a state; ``cairn.interop.weights``)."""
    imported = read_weights(path, trainer, state.tensors)
    state.tensors.update(imported.arrays)
    state.lineage = state.lineage.model_copy(
        update={
            "reference": ReferenceSnapshot(
                checkpoint=f"{SAFETENSORS_SOURCE}{path.resolve()}",
                fingerprint=imported.content_hash,
                run_id="",
                step=0,
                may_change=[],
            )
        }
    )
    return state


def _check_stage_contract(trainer: Trainer, reference: dict[str, Any], may_change: Sequence[str]) -> None:
    mine = trainer.config.model_dump(mode="json")
    ref_factory = (reference.get("trainer") or {}).get("factory") or BUILTIN_TRAINER
    if ref_factory != trainer.path:
        raise IncompatibleConfigError(
            'init_from: a stage keeps its reference\'s trainer ("trainer" in may_change allows its options to change)',
            field="config.trainer.factory",
            expected=ref_factory,
            found=trainer.path,
        )
    allowed = {*may_change, *ALWAYS_MAY_CHANGE}
    for name in sorted(mine):
        if name in allowed or mine[name] == reference.get(name):
            continue
        raise IncompatibleConfigError(
            "init_from: the stage contract does not allow this change relative to the reference "
            f"(add {name!r} to init_from.may_change if the new stage may change it)",
            field=f"config.{name}",
            expected=reference.get(name),
            found=mine[name],
        )
