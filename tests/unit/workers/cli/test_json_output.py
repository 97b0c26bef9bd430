"""``--json`` prints exactly one JSON document on stdout, whatever the user's code prints: a
trainer that prints when imported, when built and at every step (from Python, straight to file
descriptor 1, and through C's buffered stdio) has all of it on stderr, for every command that
builds it and for those that do not."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO
from tests.unit.workers.cli.conftest import CONFIG
from tests.user_trainer import LOUD_SOURCE, UserModel, installed_user_model
from workers.cli.main import main

MODULE = "json_output_loud_model"
BUILT = ("loud: imported", "loud: fd 1 at import", "loud: number of parameters", "loud: C printf when built")
"""What the trainer prints whenever a command builds it."""
STEPPED = ('{"loud": "a step"}', "loud: fd 1 at a step")
"""What it prints at every step it trains."""


@pytest.fixture
def loud(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[UserModel]:
    yield from installed_user_model(tmp_path, monkeypatch, MODULE, LOUD_SOURCE)


def one_document(out: str) -> dict[str, Any]:
    """stdout as exactly one JSON object (``json.loads`` refuses anything before or after it)."""
    body = json.loads(out)
    assert isinstance(body, dict) and out.endswith("}\n") and out.count("\n") == 1, out
    return body


def cairn_json(capfd: pytest.CaptureFixture[str], *words: str) -> tuple[int, dict[str, Any], str]:
    """``cairn WORDS --json`` in this process, the trainer's module imported afresh (so it prints
    at import again); stdout and stderr as the file descriptors saw them."""
    sys.modules.pop(MODULE, None)
    code = main([*words, "--json"])
    out, err = capfd.readouterr()
    return code, one_document(out), err


def test_every_json_command_prints_one_document_whatever_the_trainer_prints(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], loud: UserModel
) -> None:
    store, config = tmp_path / "s", ("--config", str(loud.config))
    code, body, err = cairn_json(capfd, "train", *config, "--steps", "3", "--store", str(store), "--run-id", "loud")
    assert code == 0 and body["step"] == 3, err
    assert all(line in err for line in BUILT + STEPPED), err
    assert err.count(STEPPED[0]) >= 3 and err.count(STEPPED[1]) >= 3, err  # every step's
    ref = body["checkpoint"]
    builds = [
        ("ckpt", "verify", ref, *config),
        ("eval", ref, *config),
        ("ckpt", "compare", ref, ref, *config),
        ("ckpt", "export", ref, str(tmp_path / "exported"), "--format", "safetensors", *config),
        ("train", "--resume", ref, "--steps", "2", "--store", str(store), *config),
    ]
    for words in builds:
        code, body, err = cairn_json(capfd, *words)
        assert code == 0, (words, err)
        assert all(line in err for line in BUILT), (words, err)
    reads = [("ckpt", "show", ref), ("ckpt", "list", str(store)), ("ckpt", "pin", ref, "--name", "best")]
    for words in reads:
        code, body, err = cairn_json(capfd, *words)
        assert code == 0 and "loud:" not in err, (words, err)
    code, body, err = cairn_json(capfd, "ckpt", "verify", ref)  # an error is one document too
    assert code == 2 and body["ok"] is False and "not trusted here" in body["error"]["message"], err


def test_an_error_raised_after_the_trainer_printed_is_still_one_document(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], loud: UserModel
) -> None:
    store = tmp_path / "s"
    code, _, _ = cairn_json(capfd, "train", "--config", str(loud.config), "--steps", "2", "--store", str(store))
    assert code == 0
    other = json.loads(loud.config.read_text())
    other["seed"] += 1
    changed = tmp_path / "other.json"
    changed.write_text(json.dumps(other))
    ref = next(store.rglob("manifest.json")).parent
    code, body, err = cairn_json(capfd, "ckpt", "verify", str(ref), "--config", str(changed))
    assert code == 1 and body["error"]["type"] == "IncompatibleConfigError", err


def test_without_json_the_users_prints_stay_on_stdout(
    tmp_path: Path, capfd: pytest.CaptureFixture[str], loud: UserModel
) -> None:
    """Only ``--json`` moves them: a text command's stdout is the user's terminal as before."""
    sys.modules.pop(MODULE, None)
    store = str(tmp_path / "s")
    code = main(["train", "--config", str(loud.config), "--steps", "1", "--store", store, "--run-id", "t"])
    out, err = capfd.readouterr()
    assert code == 0 and "loud: imported" in out and "loud: fd 1 at a step" in out and out.endswith("000000000001\n")


def test_a_cairn_process_with_json_writes_one_document_to_its_stdout(tmp_path: Path, loud: UserModel) -> None:
    """The real command line: C-level writes and C stdio's buffer (flushed only at exit in a
    pipe) reach stderr, and stdout holds the one document."""
    store = str(tmp_path / "s")
    done = subprocess.run(
        [sys.executable, "-m", "workers.cli", "train", "--config", str(loud.config), "--steps", "2", "--store", store,
         "--json"],
        cwd=REPO, env=os.environ.copy(), capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert one_document(done.stdout)["step"] == 2
    assert all(line in done.stderr for line in BUILT + STEPPED), done.stderr


def test_json_documents_of_commands_that_run_no_user_code_are_unchanged(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    store = str(tmp_path / "s")
    code, body, err = cairn_json(capfd, "train", "--config", CONFIG, "--steps", "2", "--store", store)
    assert code == 0 and body["step"] == 2 and err == ""
    code, body, err = cairn_json(capfd, "ckpt", "gc", store, "--run", body["run_id"], "--dry-run")
    assert code == 0 and body["dry_run"] is True and err == ""
