"""The full training state S_t and the lineage that travels with it.

S_t = (theta, m, v, t, RNG state, data cursor, config, history). Weights alone (theta)
reproduce the forward function, not training: resuming needs every field here.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_serializer

from cairn.config import TrainConfig
from cairn.numerics import NumericsRecord

__all__ = [
    "Lineage",
    "ReferenceSnapshot",
    "TrainState",
    "StepCallback",
    "HISTORY_KEYS",
    "param_shapes",
    "rng_state_problem",
]

HISTORY_KEYS = ("loss", "lr")
_U128 = 1 << 128


class ReferenceSnapshot(BaseModel):
    """The checkpoint a new stage started from, and what the stage may change relative to it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    checkpoint: str
    fingerprint: str
    run_id: str
    step: int = Field(ge=0)
    may_change: list[str]
    """Top-level config fields this stage was allowed to change (the stage contract)."""


V1_ADDITIONS = ("trainer", "model_hash", "reproducibility", "reference", "numerics")


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
    """Final-test exposures inherited from the reference this stage started from (``init_from``);
    this run's own exposures are in its lifecycle log (``cairn.checkpoint.exposures``)."""
    trainer: str | None = None
    """Import path of the trainer (None: the built-in MLP)."""
    model_hash: str | None = None
    """sha256 over the model's tensor names, dtypes and shapes (its architecture)."""
    reproducibility: str | None = None
    """The contract the run trains under: ``bit-exact`` or ``tolerance`` (None: bit-exact, built-in)."""
    reference: ReferenceSnapshot | None = None
    """The checkpoint this stage was initialised from (``init_from``): weights only, not a resume."""
    numerics: NumericsRecord | None = None
    """The numerics profile the state was computed under (``cairn.numerics``); provenance, like
    ``parent``, so it is not part of the fingerprint. None: written before profiles were recorded."""

    @model_serializer(mode="wrap")
    def _omit_unset_v1_additions(self, handler: Any) -> Any:
        """Fields added after format v1 are left out of every dump while unset, so a manifest of
        the built-in trainer is exactly a v1 manifest (older readers refuse unknown fields)."""
        body = handler(self)
        for name in V1_ADDITIONS:
            if body.get(name) is None:
                body.pop(name, None)
        return body

    def fingerprint_json(self) -> dict[str, Any]:
        """The lineage as content: without ``parent`` and ``numerics`` (provenance); v1
        checkpoints keep their fingerprints (see ``_omit_unset_v1_additions``)."""
        return self.model_dump(mode="json", exclude={"parent", "numerics"})


def param_shapes(config: TrainConfig, n_features: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of theta for this config; m and v have the same."""
    d, c, h = n_features, config.data.n_classes, config.model.hidden
    if h == 0:
        return {"W": (d, c), "b": (c,)}
    return {"W1": (d, h), "b1": (h,), "W2": (h, c), "b2": (c,)}


@dataclass
class TrainState:
    """One point of a training run, as every trainer hands it to the durable machinery.

    ``tensors`` holds every array of the state by its checkpoint name (for the built-in MLP:
    ``theta/W1``, ``adam.m/W1``, ``adam.v/W1`` ...; for the PyTorch adapter: ``param/...``,
    ``buffer/...``, ``optim/...``, ``rng/torch``). ``history`` lists are per update (``loss``,
    ``lr``) or per evaluation (``val_step``, ``val_loss``, ``val_accuracy``). ``meta`` is the
    trainer's own JSON state (optimizer param groups, scheduler, data position, contract); the
    built-in MLP has none.
    """

    config: TrainConfig
    lineage: Lineage
    tensors: dict[str, np.ndarray]
    step: int
    cursor: int
    rng_state: dict[str, Any]
    history: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in HISTORY_KEYS})
    meta: dict[str, Any] = field(default_factory=dict)

    def last(self, key: str) -> float | None:
        """The latest value of ``history[key]`` (the last update's ``loss``, the last evaluation's
        ``val_loss``), None while there is none."""
        values = self.history.get(key)
        return values[-1] if values else None

    def group(self, prefix: str) -> dict[str, np.ndarray]:
        """The tensors named ``prefix/NAME``, by NAME (the same arrays, not copies)."""
        head = prefix + "/"
        return {k[len(head) :]: a for k, a in self.tensors.items() if k.startswith(head)}

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The built-in MLP's theta (views of ``tensors``)."""
        return self.group("theta")

    @property
    def m(self) -> dict[str, np.ndarray]:
        return self.group("adam.m")

    @property
    def v(self) -> dict[str, np.ndarray]:
        return self.group("adam.v")

    def copy(self) -> TrainState:
        """A deep copy: nothing in the copy aliases this state's arrays, lists or meta."""
        return TrainState(
            config=self.config,
            lineage=self.lineage,
            tensors={k: np.array(a, copy=True) for k, a in self.tensors.items()},
            step=self.step,
            cursor=self.cursor,
            rng_state=copy.deepcopy(self.rng_state),
            history={k: list(v) for k, v in self.history.items()},
            meta=copy.deepcopy(self.meta),
        )


StepCallback = Callable[[TrainState], bool | None]
"""Called with the working state after each update (copy what you keep); True stops early."""


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
