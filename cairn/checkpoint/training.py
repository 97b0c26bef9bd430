"""A training state in checkpoint form, stated once: its tensors (the state's own plus its
history under ``history/``), the rest of its content, and the state rebuilt from what a
checkpoint holds."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np

from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.manifest import CheckpointKind, Manifest
from cairn.config import TrainConfig
from cairn.state import TrainState
from cairn.trainers.base import check_eval_history

__all__ = [
    "HISTORY_PREFIX",
    "history_name",
    "is_history",
    "history_arrays",
    "split_history",
    "training_tensors",
    "training_content",
    "training_state",
]

HISTORY_PREFIX = "history/"
"""Checkpoint tensors under this prefix are the state's history (float64, one value per entry)."""


def history_name(key: str) -> str:
    return HISTORY_PREFIX + key


def is_history(name: str) -> bool:
    return name.startswith(HISTORY_PREFIX)


def history_arrays(history: Mapping[str, list[float]]) -> dict[str, np.ndarray]:
    """The history as checkpoint tensors (``history/KEY``, float64)."""
    return {history_name(key): np.asarray(values, dtype=np.float64) for key, values in history.items()}


def split_history(arrays: Mapping[str, np.ndarray]) -> tuple[dict[str, np.ndarray], dict[str, list[float]]]:
    """A checkpoint's arrays as (the state's tensors, its history as lists)."""
    tensors = {name: arr for name, arr in arrays.items() if not is_history(name)}
    history = {name[len(HISTORY_PREFIX) :]: arr.tolist() for name, arr in arrays.items() if is_history(name)}
    return tensors, history


def training_tensors(state: TrainState) -> dict[str, np.ndarray]:
    """The arrays of a training state, by checkpoint tensor name (views, not copies)."""
    return {**state.tensors, **history_arrays(state.history)}


def training_content(run_id: str, state: TrainState) -> CheckpointContent:
    """Everything but the tensors of a training checkpoint of ``state``."""
    return CheckpointContent(
        kind=CheckpointKind.TRAINING,
        run_id=run_id,
        step=state.step,
        cursor=state.cursor,
        config=state.config.to_json(),
        lineage=state.lineage,
        rng=state.rng_state,
        meta=state.meta,
    )


def training_state(
    config: TrainConfig, manifest: Manifest, tensors: dict[str, np.ndarray], history: dict[str, list[float]]
) -> TrainState:
    """The state a validated training checkpoint holds; its lineage's parent is the checkpoint
    (the evaluation history is checked here: steps increasing within (0, step])."""
    assert manifest.lineage is not None  # a training manifest has one (checked on read)
    check_eval_history(manifest.step, history)
    return TrainState(
        config=config,
        lineage=manifest.lineage.model_copy(update={"parent": manifest.fingerprint}),
        tensors=tensors,
        step=manifest.step,
        cursor=manifest.cursor,
        rng_state=copy.deepcopy(manifest.rng) if manifest.rng is not None else {},
        history=history,
        meta=copy.deepcopy(manifest.meta),
    )
