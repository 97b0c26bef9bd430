"""The trackers' own libraries, optional: the ``trackers`` extra (tensorboard, mlflow-skinny,
wandb). Imported on first use by the sink that needs them; a missing one is a
``MissingExtraError`` naming ``cairn-train[trackers]``."""

from __future__ import annotations

import importlib
from types import ModuleType

from cairn.errors import MissingExtraError

__all__ = ["EXTRA", "import_extra"]

EXTRA = "trackers"


def import_extra(module: str, library: str, needed_by: str) -> ModuleType:
    """``module`` of ``library``, or ``MissingExtraError`` (one line: pip install 'cairn-train[trackers]')."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise MissingExtraError(library, EXTRA, needed_by) from None
