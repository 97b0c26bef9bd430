"""A user's own trainer, outside Cairn: written as a module into a temporary folder that tests put
on ``sys.path`` (and on ``PYTHONPATH`` for the processes they start), named in a config's
``trainer.factory``. Neither shipped with Cairn nor listed in ``CAIRN_TRAINERS``: a tool trusts it
only as the run's own trainer."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO

__all__ = ["MARKER_ENV", "SOURCE", "UserModel", "installed_user_model", "user_config", "write_user_trainer"]

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


@dataclass(frozen=True)
class UserModel:
    factory: str
    config: Path
    marker: Path


def installed_user_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str) -> Iterator[UserModel]:
    """The trainer on this process's path and on its workers' (``PYTHONPATH``), trusted nowhere,
    with its config file and marker (a fixture's body: yields once, then forgets the module)."""
    folder = tmp_path / "usercode"
    factory = write_user_trainer(folder, module)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("CAIRN_TRAINERS", raising=False)
    marker = tmp_path / "trained.txt"
    monkeypatch.setenv(MARKER_ENV, str(marker))
    config = tmp_path / "my.json"
    config.write_text(json.dumps(user_config(factory)))
    yield UserModel(factory, config, marker)
    sys.modules.pop(module, None)
