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

__all__ = [
    "LOUD_SOURCE",
    "MARKER_ENV",
    "SOURCE",
    "UserModel",
    "installed_user_model",
    "user_config",
    "write_user_trainer",
]

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

LOUD_SOURCE = '''"""The digits CNN as research code is written: it prints when imported, when built and at every
step, from Python and from C (straight to file descriptor 1, and through C's buffered stdio)."""

import ctypes
import json
import os

from examples.digits import DigitsCNN

print("loud: imported")
os.write(1, b"loud: fd 1 at import\\n")


class UserCNN(DigitsCNN):
    def __init__(self, config, options):
        print("loud: number of parameters: 1.23K")
        ctypes.CDLL(None).printf(b"loud: C printf when built\\n")
        super().__init__(config, options)

    def compute_loss(self, x, y):
        print(json.dumps({"loud": "a step"}))
        os.write(1, b"loud: fd 1 at a step\\n")
        return super().compute_loss(x, y)
'''


def write_user_trainer(folder: Path, module: str, source: str = SOURCE) -> str:
    """Write the trainer (``SOURCE``, or ``LOUD_SOURCE``) as ``folder/module.py``; returns its factory path."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(source)
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


def installed_user_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, source: str = SOURCE
) -> Iterator[UserModel]:
    """The trainer on this process's path and on its workers' (``PYTHONPATH``), trusted nowhere,
    with its config file and marker (a fixture's body: yields once, then forgets the module)."""
    folder = tmp_path / "usercode"
    factory = write_user_trainer(folder, module, source)
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(folder), str(REPO), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("CAIRN_TRAINERS", raising=False)
    marker = tmp_path / "trained.txt"
    monkeypatch.setenv(MARKER_ENV, str(marker))
    config = tmp_path / "my.json"
    config.write_text(json.dumps(user_config(factory)))
    yield UserModel(factory, config, marker)
    sys.modules.pop(module, None)
