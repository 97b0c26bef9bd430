"""The ``cairn`` entry point (``workers.cli.main``): a reader that went away (``| head``) is not an error."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.workers.cli.conftest import CONFIG, run


def test_broken_pipe_is_quiet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import subprocess
    import sys

    store = tmp_path / "s"
    code, _, train_err = run(
        capsys,
        "train",
        "--config",
        CONFIG,
        "--steps",
        "3",
        "--store",
        str(store),
        "--run-id",
        "r",
        "--checkpoint-every",
        "1",
    )
    assert code == 0, train_err
    # `ckpt list` in a process of its own: the pipe its stdout writes to is really closed (in this
    # process, stdout is pytest's capture).
    proc = subprocess.Popen(
        [sys.executable, "-m", "workers.cli", "ckpt", "list", str(store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.close()  # like `| head -0`: the reader is gone before we write
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and b"Traceback" not in err and b"BrokenPipe" not in err, err
