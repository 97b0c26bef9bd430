"""The manager layer: training state <-> checkpoints, listing, latest committed.

Short functions that wire the state, the format and the store together. Listing sees only
committed checkpoints (a manifest exists); a half-written prefix is invisible here.
"""

from __future__ import annotations

import numpy as np

from cairn.checkpoint.commit import CommitResult, write_checkpoint
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.layout import parse_checkpoint_key, run_prefix
from cairn.checkpoint.manifest import CheckpointKind, Manifest
from cairn.checkpoint.options import CheckpointOptions
from cairn.checkpoint.reader import read_manifest, read_tensors
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.validate import check_training_manifest, check_training_values
from cairn.config import TrainConfig
from cairn.state import HISTORY_KEYS, TrainState
from cairn.stores.base import Store

__all__ = [
    "training_tensors",
    "training_content",
    "save_training",
    "load_training",
    "list_checkpoints",
    "latest_committed",
]


def training_tensors(state: TrainState) -> dict[str, np.ndarray]:
    """The arrays of a training state, by checkpoint tensor name (views, not copies)."""
    tensors: dict[str, np.ndarray] = {}
    for name in state.params:
        tensors[f"theta/{name}"] = state.params[name]
        tensors[f"adam.m/{name}"] = state.m[name]
        tensors[f"adam.v/{name}"] = state.v[name]
    for key in HISTORY_KEYS:
        tensors[f"history/{key}"] = np.asarray(state.history[key], dtype=np.float64)
    return tensors


def training_content(run_id: str, state: TrainState) -> CheckpointContent:
    """Everything but the tensors of a training checkpoint of ``state``."""
    return CheckpointContent(
        kind=CheckpointKind.TRAINING,
        run_id=run_id,
        step=state.step,
        cursor=state.cursor,
        config=state.config.model_dump(mode="json"),
        lineage=state.lineage,
        rng=state.rng_state,
    )


def save_training(
    store: Store, run_id: str, state: TrainState, *, options: CheckpointOptions | None = None
) -> CommitResult:
    """Commit the full training state under (run_id, training, step)."""
    return write_checkpoint(store, training_content(run_id, state), training_tensors(state), options=options)


def load_training(
    store: Store,
    ref: CheckpointRef,
    *,
    run_config: TrainConfig | None = None,
    dataset_hash: str | None = None,
    options: CheckpointOptions | None = None,
) -> tuple[TrainState, Manifest]:
    """Validate a training checkpoint completely and build a new TrainState from it.

    Nothing is returned (and so nothing can replace a run's state) unless every rule passed.
    """
    options = options or CheckpointOptions.from_env()
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING, options=options)
    config = check_training_manifest(manifest, run_config=run_config, dataset_hash=dataset_hash)
    arrays = read_tensors(store, ref, manifest, max_workers=options.max_workers, value_check=check_training_values)
    assert manifest.lineage is not None and manifest.rng is not None  # checked above
    group: dict[str, dict[str, np.ndarray]] = {"theta": {}, "adam.m": {}, "adam.v": {}}
    for name, arr in arrays.items():
        head, _, tail = name.partition("/")
        if head in group:
            group[head][tail] = arr
    state = TrainState(
        config=config,
        lineage=manifest.lineage.model_copy(update={"parent": manifest.fingerprint}),
        params=group["theta"],
        m=group["adam.m"],
        v=group["adam.v"],
        step=manifest.step,
        cursor=manifest.cursor,
        rng_state=dict(manifest.rng),
        history={k: arrays[f"history/{k}"].tolist() for k in HISTORY_KEYS},
    )
    return state, manifest


def list_checkpoints(
    store: Store, run_id: str | None = None, kind: CheckpointKind | None = None
) -> list[CheckpointRef]:
    """Committed checkpoints (those with a manifest), sorted by (run, kind, step)."""
    refs: list[CheckpointRef] = []
    kinds = {k.value: k for k in CheckpointKind}
    for info in store.list(run_prefix(run_id) if run_id else ""):
        key = parse_checkpoint_key(info.key)
        if key is None or not key.is_manifest or key.kind not in kinds:
            continue
        if kind is not None and key.kind != kind.value:
            continue
        refs.append(CheckpointRef(store.url, key.run_id, kinds[key.kind], key.step))
    return sorted(refs, key=lambda r: (r.run_id, r.kind.value, r.step))


def latest_committed(store: Store, run_id: str, kind: CheckpointKind = CheckpointKind.TRAINING) -> CheckpointRef | None:
    """The highest committed step of this run and kind: the last durable cursor."""
    refs = list_checkpoints(store, run_id, kind)
    return refs[-1] if refs else None
