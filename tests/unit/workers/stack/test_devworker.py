"""The dev stack's worker follows the README's advice for the trainer the stack is configured
with (``cairn dev up --config``): a trainer's package preloaded, one activity at a time for a
torch trainer (the PyTorch adapter, the Hugging Face trainer), the defaults for the built-in MLP."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cairn.errors import ConfigError
from tests.conftest import REPO
from workers.stack.devstack import StackConfig, worker_argv
from workers.stack.devworker import DevWorker, dev_worker

EXAMPLES = REPO / "examples"
TORCH = ["--max-activities", "1", "--preload", "examples.digits"]


def test_no_config_and_the_builtin_mlp_keep_cairn_workers_defaults() -> None:
    assert dev_worker(None) == DevWorker()
    assert dev_worker(None).flags() == []
    assert dev_worker(str(EXAMPLES / "config.json")).flags() == []
    assert dev_worker(str(EXAMPLES / "run.json")).flags() == []  # a run file: its config section


@pytest.mark.parametrize("name", ["digits.json", "digits-run.json"])
def test_a_torch_trainer_gets_one_activity_and_its_package_preloaded(name: str) -> None:
    worker = dev_worker(str(EXAMPLES / name))
    assert worker.torch and worker.trainer == "examples.digits:DigitsCNN"
    assert worker.flags() == TORCH
    assert worker.command() == "cairn worker " + " ".join(TORCH)


def test_a_user_trainer_without_torch_is_preloaded_with_the_default_slots(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "numpy_trainer_pkg.py").write_text(
        "from cairn.trainers.mlp import MLPTrainer\n\n\nclass Mine(MLPTrainer):\n    pass\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = tmp_path / "mine.json"
    config.write_text(json.dumps({"trainer": {"factory": "numpy_trainer_pkg:Mine"}}))
    worker = dev_worker(str(config))
    assert not worker.torch
    assert worker.flags() == ["--preload", "numpy_trainer_pkg"]


@pytest.mark.parametrize(
    ("body", "named"),
    [
        (None, "--config: expected an existing file"),
        ({"trainer": {"factory": "no_such_module_here:T"}}, "no_such_module_here"),
        ({"trainer": {"factory": "json:dumps"}}, "Trainer subclass"),
        ({"seed": "x"}, "seed"),
    ],
)
def test_a_config_that_names_no_usable_trainer_is_refused(tmp_path: Path, body: object, named: str) -> None:
    path = tmp_path / "config.json"
    if body is not None:
        path.write_text(json.dumps(body))
    with pytest.raises(ConfigError, match=named):
        dev_worker(str(path))


def test_the_dev_workers_command_line_carries_the_settings(tmp_path: Path) -> None:
    plain = worker_argv(StackConfig(state_dir=tmp_path))
    assert plain[1:4] == ["-m", "workers.cli", "worker"] and "--preload" not in plain
    torch = worker_argv(StackConfig(state_dir=tmp_path, dev_worker=dev_worker(str(EXAMPLES / "digits.json"))))
    assert torch[: len(plain)] == plain and torch[len(plain) :] == TORCH


def test_a_yaml_config_is_read_as_everywhere_else(tmp_path: Path) -> None:
    import yaml

    config = tmp_path / "digits.yaml"
    config.write_text(yaml.safe_dump(json.loads((REPO / "examples" / "digits.json").read_text())))
    assert dev_worker(str(config)) == dev_worker(str(REPO / "examples" / "digits.json"))
    assert dev_worker(str(config)).torch
