"""A training state in checkpoint form, stated once: its tensors, the rest of its content (its
history as run-level segments: ``cairn.checkpoint.history``), and the state rebuilt from what a
checkpoint holds. Checkpoints written before history segments hold the history as tensors
``history/KEY`` (``training_tensors``, ``split_history``); they still restore."""

from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np

from cairn.checkpoint.content import HISTORY_PREFIX, CheckpointContent
from cairn.checkpoint.manifest import CheckpointKind, HistoryRef, Manifest
from cairn.config import TrainConfig
from cairn.errors import InvariantError
from cairn.state import TrainState

__all__ = [
    "HISTORY_PREFIX",
    "history_name",
    "is_history",
    "history_arrays",
    "split_history",
    "training_tensors",
    "training_content",
    "training_state",
    "check_eval_history",
]


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
    """The arrays of a training state with its history as ``history/KEY`` tensors, by checkpoint
    tensor name (the state's arrays are views, not copies): the form of checkpoints written
    before history segments. New saves write ``state.tensors`` and the history as segments."""
    return {**state.tensors, **history_arrays(state.history)}


def training_content(run_id: str, state: TrainState, history: HistoryRef | None = None) -> CheckpointContent:
    """Everything but the tensors of a training checkpoint of ``state``; ``history``: the
    segments its history was written to (``cairn.checkpoint.history.write_history``)."""
    return CheckpointContent(
        kind=CheckpointKind.TRAINING,
        run_id=run_id,
        step=state.step,
        cursor=state.cursor,
        config=state.config.to_json(),
        lineage=state.lineage,
        rng=state.rng_state,
        meta=state.meta,
        history=history,
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


def check_eval_history(step: int, history: Mapping[str, list[float]]) -> None:
    """Evaluation steps are whole numbers, strictly increasing, within (0, step]."""
    steps = history.get("val_step", [])
    prev = 0.0
    for i, s in enumerate(steps):
        if not (float(s).is_integer() and prev < s <= step):
            raise InvariantError(
                "evaluation steps must increase within (0, step]",
                field=f"history.val_step[{i}]",
                expected=f"an integer in ({prev:g}, {step}]",
                found=s,
            )
        prev = s
