"""The command ``cairn train`` prints on Ctrl-C resumes the run as it was: every option that shaped
it (config, cadence, numerics profile, run id), with absolute paths, so that it works as printed
from any directory."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from cairn.checkpoint import CheckpointRef
from cairn.numerics import DEFAULT_PROFILE, ENV
from tests.unit.workers.cli.conftest import CONFIG, run


@contextmanager
def ctrl_c_once_training() -> Iterator[None]:
    """Send this process SIGINT once ``cairn train`` has installed its handler and run a few steps."""

    def send() -> None:
        deadline = time.monotonic() + 60
        while signal.getsignal(signal.SIGINT) is signal.default_int_handler and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        os.kill(os.getpid(), signal.SIGINT)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    try:
        yield
    finally:
        sender.join(5)


def option(words: list[str], flag: str) -> str:
    assert words.count(flag) == 1, (flag, words)
    return words[words.index(flag) + 1]


def test_the_resume_command_carries_every_option_that_shaped_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    here = tmp_path / "here"
    here.mkdir()
    shutil.copy(CONFIG, here / "my.json")
    monkeypatch.chdir(here)  # relative paths, as a user types them
    with ctrl_c_once_training():
        code, out, err = run(capsys, "train", "--config", "my.json", "--steps", "100000000", "--store", "runs",
                             "--run-id", "long", "--checkpoint-every", "7", "--set", "optimizer.lr=0.01",
                             "--json")  # fmt: skip
    assert code == 130, err
    interrupted = json.loads(out)
    words = shlex.split(err.split("resume with: ", 1)[1].splitlines()[0])
    assert words[:4] == ["cairn", "train", "--resume", interrupted["checkpoint"]], words
    assert option(words, "--config") == str(here / "my.json")
    assert option(words, "--store") == str(here / "runs")
    assert option(words, "--checkpoint-every") == "7"
    assert option(words, "--set") == "optimizer.lr=0.01"
    assert option(words, "--numerics") == (os.environ.get(ENV) or DEFAULT_PROFILE)
    assert "--run-id" not in words  # the checkpoint's own run
    assert Path(CheckpointRef.parse(interrupted["checkpoint"]).store_url).is_absolute()

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    words[words.index("--steps") + 1] = "15"
    code, out, err = run(capsys, *words[1:], "--json")
    assert code == 0, err
    resumed = json.loads(out)
    assert resumed["checkpoint_every"] == 7 and resumed["run_id"] == "long"
    assert resumed["step"] == interrupted["step"] + 15
    start = interrupted["step"]
    committed = sorted(int(m.parent.name) for m in (here / "runs" / "long").rglob("manifest.json"))
    assert [s for s in committed if s > start] == [*range(start - start % 7 + 7, start + 15, 7), start + 15]
