"""The trainer interface: what the durable machinery needs from any trainer.

A trainer owns the arithmetic of one run: S_{t+1} = F(S_t, D_t). Cairn owns everything else
(checkpoints, validated import, retention, Temporal, drills). The contract:

- ``init_state()`` builds step 0 from the config and its seed;
- a state names every piece of itself as tensors (``TrainState.tensors``: name -> array with
  dtype and shape) plus JSON (``rng_state``, ``meta``) and a per-step/per-evaluation history;
- ``train(state, steps, on_step)`` runs updates, never modifying ``state`` itself;
- ``tensor_specs(step, meta)`` gives the validation side the tensors a checkpoint of *this*
  model must hold, so an import is checked against the model, not a hard-coded list;
- ``check_state(...)`` states the invariants between fields (cursor vs step, RNG form, ...);
- ``evaluate(state, split)`` measures a state on a held-out split (``val`` or ``test``);
- ``weights_only(state)`` keeps the weights and resets everything else (for ``init_from`` and
  to show that weights alone do not resume training).

A trainer is named by import path (``package.module:Class``, ``TrainConfig.trainer.factory``)
and gets its own validated options model (``Options``). ``load_trainer`` imports it and fails
with a ``ConfigError`` (non-retryable) naming what is missing.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
from pydantic import BaseModel, ConfigDict, ValidationError

from cairn.config import BUILTIN_TRAINER, TrainConfig, TrainerSpec, config_error_from
from cairn.errors import ConfigError, IncompatibleConfigError, InvariantError, NonFiniteError
from cairn.state import HISTORY_KEYS, Lineage, TrainState

__all__ = [
    "TensorSpec",
    "Trainer",
    "NoOptions",
    "StepCallback",
    "STEP_HISTORY",
    "EVAL_HISTORY",
    "load_trainer",
    "normalized_config",
    "require_trusted",
    "check_trainer_options",
    "trainer_for_checkpoint",
    "model_hash",
    "TRUSTED_TRAINERS_ENV",
    "check_finite",
    "check_eval_history",
]

StepCallback = Callable[[TrainState], bool | None]
STEP_HISTORY = HISTORY_KEYS
"""History kept per update: one value per step (``loss``, ``lr``)."""
EVAL_HISTORY = ("val_step", "val_loss", "val_accuracy")
"""History kept per evaluation on the validation split (at each epoch end)."""
TRUSTED_TRAINERS_ENV = "CAIRN_TRAINERS"


@dataclass(frozen=True)
class TensorSpec:
    """What one state tensor must be: numpy dtype string (little-endian) and shape."""

    dtype: str
    shape: tuple[int, ...]


class NoOptions(BaseModel):
    """A trainer without options of its own."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def model_hash(specs: Mapping[str, TensorSpec]) -> str:
    """sha256 over tensor names, dtypes and shapes: the architecture, not the values."""
    body = sorted([name, s.dtype, list(s.shape)] for name, s in specs.items())
    return "sha256:" + hashlib.sha256(json.dumps(body, separators=(",", ":")).encode()).hexdigest()


class Trainer(ABC):
    """One model, optimizer and data pipeline, driven by Cairn. See the module docstring."""

    Options: ClassVar[type[BaseModel]] = NoOptions
    """The trainer's own config section (``TrainConfig.trainer.options``), validated on load."""

    def __init__(self, config: TrainConfig, options: BaseModel) -> None:
        self.config = config
        self.options = options
        self.eval_history = False
        """Whether states carry ``EVAL_HISTORY`` (the trainer has a validation split)."""

    # -- identity ------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return self.config.trainer_path

    @property
    @abstractmethod
    def data_hash(self) -> str:
        """Content hash of the data this run trains on (checked against a checkpoint's lineage)."""

    @property
    @abstractmethod
    def steps_per_epoch(self) -> int:
        """Updates per epoch (``segment.epochs`` is sized in these)."""

    @property
    def reproducibility(self) -> str:
        """``bit-exact`` (same build, same thread count) or ``tolerance``."""
        return "bit-exact"

    def lineage(self) -> Lineage:
        """The lineage of a fresh state of this trainer."""
        c = self.config
        return Lineage(
            dataset_version=c.data.version,
            dataset_hash=self.data_hash,
            model_version=c.model.version,
            tokenizer_version=c.tokenizer_version,
            stage_contract=c.stage,
        )

    # -- state ---------------------------------------------------------------------------
    @abstractmethod
    def init_state(self) -> TrainState:
        """Step 0, from the config and its seed."""

    @abstractmethod
    def train(self, state: TrainState, steps: int, on_step: StepCallback | None = None) -> TrainState:
        """Apply ``steps`` updates; ``state`` is not modified. ``on_step`` sees the working state
        after each update (it must copy what it keeps) and may return True to stop early."""

    @abstractmethod
    def tensor_specs(self, step: int, meta: Mapping[str, Any]) -> dict[str, TensorSpec]:
        """The tensors (history excluded) a checkpoint of this model at ``step`` must hold."""

    @abstractmethod
    def check_state(self, step: int, cursor: int, rng: Any, meta: Mapping[str, Any]) -> None:
        """Cross-field invariants of a checkpoint's JSON part; raise ``InvariantError``."""

    def check_cursor(self, step: int, cursor: int) -> None:
        """The data cursor counts the examples drawn: ``step x batch_size``."""
        if cursor != step * self.config.batch_size:
            raise InvariantError(
                "data cursor must equal step x batch_size",
                field="cursor",
                expected=step * self.config.batch_size,
                found=cursor,
            )

    @abstractmethod
    def is_weight(self, name: str) -> bool:
        """Whether tensor ``name`` is part of the model's weights (what ``weights_only`` and
        ``init_from`` keep): parameters and buffers, not optimizer state."""

    def weights_only(self, state: TrainState) -> TrainState:
        """Keep the weights, reset everything else (moments, step, RNG, cursor, history).

        This is what "restoring from weights" gives: the forward function, not training.
        """
        fresh = self.init_state()
        for name, arr in state.tensors.items():
            if self.is_weight(name):
                fresh.tensors[name] = np.array(arr, copy=True)
        return fresh

    def evaluate(self, state: TrainState, split: str) -> dict[str, float] | None:
        """Loss and accuracy of ``state`` on ``split`` (``val`` or ``test``); None if the
        trainer has no such split."""
        return None

    def check_values(self, name: str, values: np.ndarray) -> None:
        """Value rules for (a chunk of) one tensor: floats must be finite everywhere."""
        check_finite(name, values)


def check_finite(name: str, values: np.ndarray) -> None:
    """Floating-point values must be finite: one cheap sum proves the common case; the exact
    (allocating) test runs only when the sum is not finite (or overflowed)."""
    if values.dtype.kind != "f":
        return
    with np.errstate(all="ignore"):  # a signalling NaN or an overflowing sum: the typed error alone says so
        finite = bool(np.isfinite(values.sum())) or bool(np.isfinite(values).all())
        bad = 0 if finite else int(values.size - np.count_nonzero(np.isfinite(values)))
    if not finite:
        raise NonFiniteError(
            "tensor holds NaN or infinity", field=f"tensors[{name}]", expected="finite", found=f"{bad} non-finite"
        )


# -- loading ---------------------------------------------------------------------------------
def _import_factory(path: str) -> type[Trainer]:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        raise ConfigError(
            f"trainer.factory: cannot import {path!r}: module {missing!r} is not installed on this "
            f"worker (install the package that provides it, or run the trainer on a worker that has it)"
        ) from None
    except Exception as exc:  # the user's module failed while importing
        raise ConfigError(f"trainer.factory: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise ConfigError(f"trainer.factory: module {module_name!r} has no attribute {attr!r}")
    if not (isinstance(factory, type) and issubclass(factory, Trainer)):
        raise ConfigError("trainer.factory", expected="a cairn.trainers.Trainer subclass", found=repr(factory)[:80])
    return factory


def _options(factory: type[Trainer], config: TrainConfig) -> BaseModel:
    raw = config.trainer.options if config.trainer is not None else {}
    try:
        return factory.Options.model_validate(raw)
    except ValidationError as exc:
        raise config_error_from(exc, "trainer.options", factory.Options) from exc


def _normalized(factory: type[Trainer], config: TrainConfig) -> tuple[TrainConfig, BaseModel]:
    options = _options(factory, config)
    if config.trainer is None:
        return config, options
    if config.trainer.factory == BUILTIN_TRAINER and not options.model_dump():
        return config.model_copy(update={"trainer": None}), options  # the default, spelt out
    spec = TrainerSpec(factory=config.trainer.factory, options=options.model_dump(mode="json"))
    return config.model_copy(update={"trainer": spec}), options


def normalized_config(config: TrainConfig) -> TrainConfig:
    """The config with its trainer's options as the trainer's model has them (defaults filled in,
    values coerced), so two configs that mean the same run compare, hash and name a run alike."""
    return _normalized(_import_factory(config.trainer_path), config)[0]


def load_trainer(config: TrainConfig) -> Trainer:
    """Import the config's trainer, validate its options, and build it (``trainer.config`` is
    the normalized config: see ``normalized_config``)."""
    factory = _import_factory(config.trainer_path)
    normalized, options = _normalized(factory, config)
    return factory(normalized, options)


def check_trainer_options(config: TrainConfig) -> bool:
    """Validate the trainer's options without building it (no model, no data), where its package
    is installed; False when it is not installed here (the workers decide)."""
    try:
        factory = _import_factory(config.trainer_path)
    except ConfigError as exc:
        if "is not installed" in str(exc):
            return False
        raise
    _options(factory, config)
    return True


SHIPPED_TRAINERS = frozenset({BUILTIN_TRAINER, "examples.digits:DigitsCNN"})
"""Trainers that ship with Cairn: a checkpoint may name them without further trust."""


def _trusted_paths() -> set[str]:
    raw = os.environ.get(TRUSTED_TRAINERS_ENV, "")
    return set(SHIPPED_TRAINERS) | {p.strip() for p in raw.split(",") if p.strip()}


def trainer_for_checkpoint(found: TrainConfig, run_config: TrainConfig | None) -> Trainer:
    """The trainer that validates a checkpoint whose config is ``found``.

    A checkpoint is untrusted input: the trainer it names is imported only if the caller's own
    config names the same one, or it ships with Cairn (``SHIPPED_TRAINERS``), or it is listed in
    ``CAIRN_TRAINERS`` (comma-separated import paths). A different trainer is refused before
    anything is imported.
    """
    require_trusted(found, run_config)
    return load_trainer(found)


def require_trusted(found: TrainConfig, run_config: TrainConfig | None) -> None:
    """Refuse, before importing anything, a checkpoint's trainer that is not the run's own
    (or, without a run config, not trusted); see ``trainer_for_checkpoint``."""
    if run_config is not None and run_config.trainer_path != found.trainer_path:
        raise IncompatibleConfigError(
            "checkpoint was written by another trainer",
            field="config.trainer.factory",
            expected=run_config.trainer_path,
            found=found.trainer_path,
        )
    if run_config is None and found.trainer_path not in _trusted_paths():
        raise ConfigError(
            f"config.trainer.factory: the checkpoint names trainer {found.trainer_path!r}; pass a config "
            f"naming it (--config) or list it in {TRUSTED_TRAINERS_ENV} to import it"
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
