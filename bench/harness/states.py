"""Training states of a given size, built without training, and the options they are saved
with (unsigned: the benchmarks measure bytes, not HMAC)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from bench.harness.measure import MiB
from cairn.checkpoint import CheckpointOptions
from cairn.config import TrainConfig
from cairn.data import load_dataset
from cairn.state import TrainState
from cairn.trainers.mlp.arithmetic import init_state

UNSIGNED = CheckpointOptions()


def big_state(mib: int, *, features: int = 2048, classes: int = 8, seed: int = 0) -> TrainState:
    """A real TrainState (tanh MLP) whose theta + m + v total about ``mib`` MiB, with
    non-trivial moments, as after real training."""
    hidden = max(1, int(mib * MiB / 8 / 3 / (features + classes + 1)))
    cfg = TrainConfig.model_validate(
        {
            "seed": seed,
            "model": {"hidden": hidden},
            "data": {"n_examples": 64, "n_features": features, "n_classes": classes},
        }
    )
    state = init_state(cfg, load_dataset(cfg.data))
    rng = np.random.default_rng(seed)
    for name in state.params:
        state.m[name][...] = rng.standard_normal(state.m[name].shape) * 1e-3
        state.v[name][...] = np.abs(rng.standard_normal(state.v[name].shape)) * 1e-6
    return state


def state_arrays(state: TrainState) -> list[np.ndarray]:
    """theta, m, v in a fixed order (what the floor writes and reads)."""
    return [*state.params.values(), *state.m.values(), *state.v.values()]


def state_bytes(state: TrainState) -> int:
    return sum(a.nbytes for a in state_arrays(state))


def state_at(base: Any, step: int, history: dict[str, Any]) -> Any:
    """``base`` (a ``TrainState``; its arrays shared, read-only) as a valid state at ``step``
    with ``step`` entries of each ``history`` array."""
    return dataclasses.replace(
        base,
        step=step,
        cursor=step * base.config.batch_size,
        history={k: v[:step].tolist() for k, v in history.items()},
    )
