"""The full training state S_t and the lineage that travels with it.

S_t = (theta, m, v, t, RNG state, data cursor, config, history). Weights alone (theta)
reproduce the forward function, not training: resuming needs every field here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from cairn.config import TrainConfig

__all__ = ["Lineage", "TrainState", "HISTORY_KEYS", "param_shapes", "rng_state_problem"]

HISTORY_KEYS = ("loss", "lr")
_U128 = 1 << 128


class Lineage(BaseModel):
    """Where a state came from. Part of the fingerprint; checked on import."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    dataset_version: str
    dataset_hash: str
    model_version: str
    tokenizer_version: str
    parent: str | None = None
    """Fingerprint of the checkpoint this state was resumed from (None for a fresh run)."""
    stage_contract: str = "train"
    final_test_exposures: int = Field(default=0, ge=0)
    """How many times the held-out final test split has been evaluated in this lineage."""


def param_shapes(config: TrainConfig, n_features: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of theta for this config; m and v have the same."""
    d, c, h = n_features, config.data.n_classes, config.model.hidden
    if h == 0:
        return {"W": (d, c), "b": (c,)}
    return {"W1": (d, h), "b1": (h,), "W2": (h, c), "b2": (c,)}


@dataclass
class TrainState:
    """One point of a training run. Arrays are float64; ``history`` lists are per update."""

    config: TrainConfig
    lineage: Lineage
    params: dict[str, np.ndarray]
    m: dict[str, np.ndarray]
    v: dict[str, np.ndarray]
    step: int
    cursor: int
    rng_state: dict[str, Any]
    history: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in HISTORY_KEYS})

    def copy(self) -> TrainState:
        """A deep copy: nothing in the copy aliases this state's arrays or lists."""
        return TrainState(
            config=self.config,
            lineage=self.lineage,
            params={k: a.copy() for k, a in self.params.items()},
            m={k: a.copy() for k, a in self.m.items()},
            v={k: a.copy() for k, a in self.v.items()},
            step=self.step,
            cursor=self.cursor,
            rng_state=_copy_rng_state(self.rng_state),
            history={k: list(v) for k, v in self.history.items()},
        )


def _copy_rng_state(state: dict[str, Any]) -> dict[str, Any]:
    out = dict(state)
    if isinstance(state.get("state"), dict):
        out["state"] = dict(state["state"])
    return out


def rng_state_problem(state: Any) -> tuple[str, str, Any] | None:
    """Return (field, expected, found) for the first malformed part of a PCG64 state, else None."""
    if not isinstance(state, dict):
        return ("rng", "an object", type(state).__name__)
    if state.get("bit_generator") != "PCG64":
        return ("rng.bit_generator", "PCG64", state.get("bit_generator"))
    inner = state.get("state")
    if not isinstance(inner, dict) or set(inner) != {"state", "inc"}:
        return ("rng.state", "an object with 'state' and 'inc'", inner)
    for key in ("state", "inc"):
        val = inner[key]
        if not isinstance(val, int) or isinstance(val, bool) or not 0 <= val < _U128:
            return (f"rng.state.{key}", "an integer in [0, 2**128)", val)
    if inner["inc"] % 2 != 1:
        return ("rng.state.inc", "an odd integer (PCG64 increments are odd)", inner["inc"])
    if state.get("has_uint32") not in (0, 1):
        return ("rng.has_uint32", "0 or 1", state.get("has_uint32"))
    uint = state.get("uinteger")
    if not isinstance(uint, int) or isinstance(uint, bool) or not 0 <= uint < (1 << 32):
        return ("rng.uinteger", "an integer in [0, 2**32)", uint)
    return None
