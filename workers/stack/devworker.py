"""The dev stack's worker settings: the README's advice for the trainer the stack is configured
with (``cairn dev up --config FILE``), as ``cairn worker`` flags.

A trainer of your own is imported before the worker polls (``--preload``: a retried segment does
not wait for ``import torch``); a torch trainer (the PyTorch adapter, the Hugging Face trainer)
owns its process's RNGs and thread settings while it trains, so its worker runs one activity at
a time (``--max-activities 1``). The built-in MLP keeps ``cairn worker``'s defaults.
"""

from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from pathlib import Path

from cairn.config import parse_config
from cairn.config_files import load_document
from cairn.errors import ConfigError
from cairn.trainers import Trainer

__all__ = ["DevWorker", "dev_worker"]


@dataclass(frozen=True)
class DevWorker:
    """How the dev stack runs its worker."""

    trainer: str | None = None
    """The configured trainer's import path; None: the built-in MLP (no configuration)."""
    torch: bool = False
    """The trainer is a torch one: one activity per worker process."""
    preload: str = ""
    """Modules the worker imports before it polls (``--preload``)."""

    def flags(self) -> list[str]:
        """The ``cairn worker`` flags these settings add to its defaults."""
        flags = ["--max-activities", "1"] if self.torch else []
        return flags + (["--preload", self.preload] if self.preload else [])

    def command(self) -> str:
        """The command of a worker started by hand with the same settings."""
        return " ".join(["cairn", "worker", *self.flags()])


def dev_worker(config_file: str | None) -> DevWorker:
    """The worker settings for a trainer config (as ``cairn train --config`` takes it) or a run
    file (as ``cairn run start`` takes it: its ``config``); None: the built-in MLP's."""
    if config_file is None:
        return DevWorker()
    if not Path(config_file).is_file():
        raise ConfigError("--config", expected="an existing file", found=config_file)
    body = load_document(config_file, what="config file").data  # JSON, YAML or TOML, as everywhere
    if isinstance(body, dict) and "config" in body:  # a run file: the trainer config is its section
        body = body["config"]
    config = parse_config(body, config_file)
    if config.builtin_trainer:
        return DevWorker()
    module_name = config.trainer_path.partition(":")[0]
    return DevWorker(trainer=config.trainer_path, torch=_is_torch(_factory(config.trainer_path)), preload=module_name)


def _factory(path: str) -> type:
    """The trainer class an import path names (imported here, as the worker will import it)."""
    module_name, _, attr = path.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"trainer.factory: cannot import {path!r}: module {exc.name or module_name!r} is not installed in this "
            f"Python environment ({sys.executable}), where the dev worker runs"
        ) from None
    except Exception as exc:  # the user's module failed while importing
        raise ConfigError(f"trainer.factory: importing {module_name!r} failed: {type(exc).__name__}: {exc}") from None
    factory = getattr(module, attr, None)
    if not (isinstance(factory, type) and issubclass(factory, Trainer)):
        raise ConfigError("trainer.factory", expected="a cairn.trainers.Trainer subclass", found=path)
    return factory


def _is_torch(factory: type) -> bool:
    """Whether a trainer class is the PyTorch adapter's (the Hugging Face trainer is one). A class
    whose import did not import torch is not; the adapter is imported only when torch is there."""
    if "torch" not in sys.modules:
        return False
    from cairn.trainers.pytorch import TorchTrainer

    return issubclass(factory, TorchTrainer)
