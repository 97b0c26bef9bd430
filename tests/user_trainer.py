"""A user's own trainer, outside Cairn: written as a module into a temporary folder that tests put
on ``sys.path`` (and on ``PYTHONPATH`` for the processes they start), named in a config's
``trainer.factory``. Neither shipped with Cairn nor listed in ``CAIRN_TRAINERS``: a tool trusts it
only as the run's own trainer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.conftest import REPO

__all__ = ["MARKER_ENV", "SOURCE", "user_config", "write_user_trainer"]

MARKER_ENV = "USER_TRAINER_MARKER"
"""A file the trainer appends ``STEP+STEPS`` to whenever it is asked to train (the proof, or not,
that training started)."""

SOURCE = f'''"""The digits CNN under a user's import path, noting every call to train."""

import os

from examples.digits import DigitsCNN


class UserCNN(DigitsCNN):
    def train(self, state, steps, on_step=None):
        marker = os.environ.get("{MARKER_ENV}")
        if marker and steps:
            with open(marker, "a") as f:
                f.write(f"{{state.step}}+{{steps}}\\n")
        return super().train(state, steps, on_step)
'''


def write_user_trainer(folder: Path, module: str) -> str:
    """Write the trainer as ``folder/module.py``; returns its factory path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(SOURCE)
    return f"{module}:UserCNN"


def user_config(factory: str) -> dict[str, Any]:
    """The digits example's config (small: 4 channels, 16 hidden units) naming ``factory``."""
    body: dict[str, Any] = json.loads((REPO / "examples" / "digits.json").read_text())
    body["trainer"]["factory"] = factory
    body["trainer"]["options"].update({"channels": 4, "hidden": 16})
    return body
