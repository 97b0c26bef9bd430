"""What the ``cairn`` command tests share: the example config, and the command run in this process."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from workers.cli.main import main

CONFIG = str(REPO / "examples" / "config.json")


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``cairn ARGS`` in this process (``main`` returns the exit code): the code, stdout, stderr."""
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err
