"""Loading a trainer by import path, its validated options, and the trust rule.

The trust rule, stated here once and applied on every path that reads a checkpoint (the worker,
gang ranks, ``cairn train --resume``, ``ckpt verify/compare/export``, ``eval``, ``init_from``,
reports, drills): a checkpoint is untrusted input, so the trainer it names is imported only when

1. the run's own config names the same trainer (``run_config``: the run input for the worker
   and the drill, the config ``cairn train``/``ckpt``/``eval``/``report`` were given with
   ``--config``, the workflow's recorded input for ``cairn run report``), or
2. it ships with Cairn (``SHIPPED_TRAINERS``), or
3. ``CAIRN_TRAINERS`` lists it (comma-separated import paths).

Anything else is refused before anything is imported, with a ``ConfigError`` that says how to
trust it. With a run config, that config decides: the trainer is built from it alone, and a
checkpoint whose config differs from it on an identity field (``IDENTITY_FIELDS``) is refused
naming the first such field; the checkpoint's own config builds the trainer only without one.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from cairn.config import BUILTIN_TRAINER, TrainConfig, TrainerSpec, config_error_from
from cairn.errors import ConfigError, IncompatibleConfigError
from cairn.trainers.base import ON_HOST, Trainer

__all__ = [
    "IDENTITY_FIELDS",
    "SHIPPED_TRAINERS",
    "TRUSTED_TRAINERS_ENV",
    "check_checkpoint_config",
    "check_config_compatible",
    "check_trainer_options",
    "first_difference",
    "load_trainer",
    "normalized_config",
    "require_trusted",
    "trainer_for_checkpoint",
    "trainer_options_model",
]

TRUSTED_TRAINERS_ENV = "CAIRN_TRAINERS"
IDENTITY_FIELDS = ("trainer", "seed", "batch_size", "model", "data", "tokenizer_version", "init_from", "distributed")
"""The config fields a checkpoint must share with the run that reads it (the optimizer and the
stage may differ)."""
LAYOUT_FIELDS = ("strategy", "param_dtype")
"""``distributed`` settings a run may change between checkpoints, as it may change its world size:
how the state is laid across ranks and computed (replicated or FSDP), not what the state is."""


def _import_factory(path: str) -> type[Trainer]:
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        missing = exc.name or module_name
        raise ConfigError(
            f"trainer.factory: cannot import {path!r}: module {missing!r} is not installed in this Python "
            f"environment ({sys.executable}; install the package that provides it here, or train on a worker "
            "that has it)"
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


def load_trainer(config: TrainConfig, *, on_host: bool = False) -> Trainer:
    """Import the config's trainer, validate its options, and build it (``trainer.config`` is
    the normalized config: see ``normalized_config``). ``on_host``: a trainer that only reads,
    verifies, exports or describes, built without a GPU (``cairn.trainers.base.ON_HOST``)."""
    factory = _import_factory(config.trainer_path)
    normalized, options = _normalized(factory, config)
    token = ON_HOST.set(on_host)
    try:
        return factory(normalized, options)
    finally:
        ON_HOST.reset(token)


def trainer_options_model(path: str) -> type[BaseModel]:
    """The options model of the trainer at ``path`` (``module:Class``), imported (not built)."""
    if ":" not in path:
        raise ConfigError("--trainer", expected="module:Class (e.g. cairn.trainers.pytorch:TorchTrainer)", found=path)
    return _import_factory(path).Options


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


SHIPPED_TRAINERS = frozenset({BUILTIN_TRAINER, "examples.digits:DigitsCNN", "examples.lm:ByteLM"})
"""Trainers that ship with Cairn whose options are bounded: a checkpoint may name them without
further trust. (``cairn.trainers.hf:HFCausalLM`` ships too, but its options name any model size
and any local text files: a checkpoint alone must not choose them, so it needs the run's config.)"""


def _trusted_paths() -> set[str]:
    raw = os.environ.get(TRUSTED_TRAINERS_ENV, "")
    return set(SHIPPED_TRAINERS) | {p.strip() for p in raw.split(",") if p.strip()}


def trainer_for_checkpoint(found: TrainConfig, run_config: TrainConfig | None, *, on_host: bool = False) -> Trainer:
    """The trainer that validates a checkpoint whose config is ``found``. With ``run_config``
    (the run's own config, or ``--config``) it is built from that config alone, after ``found``
    has been compared with it (``check_config_compatible``); without one, from ``found``, imported
    only under the trust rule (the module docstring)."""
    require_trusted(found, run_config)
    if run_config is None:
        return load_trainer(found, on_host=on_host)
    run = normalized_config(run_config)
    check_config_compatible(run, normalized_config(found))  # the factory is the run's: checked above
    return load_trainer(run, on_host=on_host)


def check_checkpoint_config(found: TrainConfig, run_config: TrainConfig) -> None:
    """Refuse a checkpoint (its config ``found``) that is not the run's: another trainer (named
    before anything is imported), or another identity field (the first that differs)."""
    require_trusted(found, run_config)
    check_config_compatible(normalized_config(run_config), normalized_config(found))


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
            f"config.trainer.factory: the checkpoint names trainer {found.trainer_path!r}, which is not trusted "
            f"here; pass the run's config naming it (--config FILE) or list it in {TRUSTED_TRAINERS_ENV} to import it"
        )


def _difference(a: Any, b: Any, path: str) -> tuple[str, Any, Any] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            diff = _difference(a.get(key), b.get(key), f"{path}.{key}")
            if diff:
                return diff
        return None
    return None if a == b else (path, a, b)


def first_difference(
    expected: TrainConfig, found: TrainConfig, fields: Iterable[str] = IDENTITY_FIELDS
) -> tuple[str, Any, Any] | None:
    """The first of ``fields`` (in order; nested keys sorted) where the configs differ, as
    (``config.PATH``, expected value, found value); None where they agree. Compare normalized
    configs (``normalized_config``): ``{}`` and the defaults spelt out are then the same."""
    want, got = expected.model_dump(mode="json"), found.model_dump(mode="json")
    for body in (want, got):
        if isinstance(body.get("distributed"), dict):
            body["distributed"] = {k: v for k, v in body["distributed"].items() if k not in LAYOUT_FIELDS}
    for name in fields:
        diff = _difference(want[name], got[name], f"config.{name}")
        if diff:
            return diff
    return None


def check_config_compatible(run: TrainConfig, found: TrainConfig) -> None:
    """Refuse a checkpoint whose identity fields differ from the run's config, naming the first."""
    diff = first_difference(run, found)
    if diff:
        path, want, got = diff
        raise IncompatibleConfigError(
            "checkpoint belongs to a different run configuration", field=path, expected=want, found=got
        )
