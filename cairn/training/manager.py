"""The manager layer: training state <-> checkpoints, a load validated by the run's trainer.

Short functions that wire the state, the format, the trainer's rules and the store together.
Listing and the latest committed checkpoint are the checkpoint's own (``cairn.checkpoint``).
"""

from __future__ import annotations

from cairn.checkpoint.commit import CommitResult, write_checkpoint
from cairn.checkpoint.history import read_history, remember, write_history
from cairn.checkpoint.manifest import CheckpointKind, Manifest
from cairn.checkpoint.options import CheckpointOptions, resolve_options
from cairn.checkpoint.reader import read_logical, read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.reuse import remember_blocks
from cairn.checkpoint.training import split_history, training_content, training_state
from cairn.config import TrainConfig
from cairn.state import TrainState
from cairn.stores.base import Store
from cairn.trainers.base import Trainer
from cairn.trainers.validate import check_training_manifest, run_bounds

__all__ = ["save_training", "load_training", "load_training_with_trainer"]


def save_training(
    store: Store, run_id: str, state: TrainState, *, options: CheckpointOptions | None = None
) -> CommitResult:
    """Commit the full training state under (run_id, training, step); a run with a
    ``distributed`` config is saved in its blocked layout (format v3), exactly as its ranks
    would save it, and so is any run saved ``incremental`` (``CheckpointOptions``: blocks the
    run holds durably are referenced, not rewritten). The history goes to the run's history
    segments first, only what is not durable yet (``cairn.checkpoint.history``); the manifest
    references them."""
    options = resolve_options(options)
    dist = state.config.distributed
    history = write_history(store, run_id, state.history, workers=options.max_workers)
    block_bytes = dist.block_bytes if dist is not None else options.block_bytes if options.incremental else None
    result = write_checkpoint(
        store,
        training_content(run_id, state, history),
        state.tensors,
        options=options,
        block_bytes=block_bytes,
        incremental=options.incremental,
    )
    remember(store, run_id, result.manifest.history, state.step)  # the committed one's (the winner's)
    return result


def load_training(
    store: Store,
    ref: CheckpointRef,
    *,
    trainer: Trainer | None = None,
    run_config: TrainConfig | None = None,
    options: CheckpointOptions | None = None,
) -> tuple[TrainState, Manifest]:
    """Validate a training checkpoint completely and build a new TrainState from it.

    ``trainer`` is the run's trainer: the checkpoint is checked against its model (tensor
    specs, invariants, data). Without it the checkpoint's own trainer is used, if trusted
    (``cairn.trainers.trainer_for_checkpoint``). Nothing is returned (and so nothing can
    replace a run's state) unless every rule passed.
    """
    options = resolve_options(options)  # an entry point: the configured ones when given none
    state, manifest, _ = load_training_with_trainer(store, ref, trainer=trainer, run_config=run_config, options=options)
    return state, manifest


def load_training_with_trainer(
    store: Store,
    ref: CheckpointRef,
    *,
    trainer: Trainer | None = None,
    run_config: TrainConfig | None = None,
    options: CheckpointOptions,
) -> tuple[TrainState, Manifest, Trainer]:
    """``load_training``, also returning the trainer that validated the checkpoint."""
    run_trainer = trainer
    sized = (
        None
        if run_trainer is None
        else (lambda m: run_bounds(run_trainer, m, options.limits, block_bytes=options.block_bytes))
    )
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING, options=options, bounds=sized)
    config, trainer = check_training_manifest(manifest, run_config=run_config, trainer=trainer)
    arrays = read_logical(store, ref, manifest, max_workers=options.max_workers, value_check=trainer.check_values)
    if manifest.history is None:  # written before history segments: the history is in the tensors
        tensors, history = split_history(arrays)
    else:
        check, workers = trainer.check_values, options.max_workers
        tensors = arrays
        history = read_history(
            store, ref.run_id, manifest.history, limits=options.limits, value_check=check, workers=workers
        )
    state = training_state(config, manifest, tensors, history)
    remember(store, ref.run_id, manifest.history, ref.step)
    if options.incremental:  # the next save may reference these blocks
        indexed, nonce = manifest.indexes is not None, manifest.writer.nonce
        kind, entries = ref.kind.value, manifest.tensors
        remember_blocks(store, ref.run_id, kind, ref.step, entries, manifest.shards, indexed=indexed, nonce=nonce)
    return state, manifest, trainer
