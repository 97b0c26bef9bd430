"""Loading a trainer (``cairn.trainers.loading``): by import path, failing at once naming what is
missing; its options validated; and the trust rule: a trainer named only by a checkpoint is
never imported, on any path (verify, compare, eval, resume, gang resume, the library)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointRef
from cairn.config import load_config, parse_config
from cairn.session import TrainingSession
from cairn.trainers.loading import load_trainer, normalized_config, trainer_for_checkpoint
from tests.conftest import REPO, rewrite_manifest, small_config


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        ("no_such_package.models:Net", "module 'no_such_package' is not installed"),
        ("cairn.trainers.mlp:NoSuchClass", "has no attribute 'NoSuchClass'"),
        ("cairn.config:TrainConfig", "expected a cairn.trainers.Trainer subclass"),
    ],
)
def test_unknown_trainer_fails_at_once_naming_what_is_missing(factory: str, message: str) -> None:
    config = parse_config({"trainer": {"factory": factory}})
    with pytest.raises(E.ConfigError, match="trainer.factory") as info:
        load_trainer(config)
    assert message in str(info.value)
    assert not info.value.retryable and info.value.exit_code == 2


def test_trainer_path_and_options_are_validated() -> None:
    with pytest.raises(E.ConfigError, match=r"trainer\.factory.*String should match pattern"):
        parse_config({"trainer": {"factory": "not a path"}})
    with pytest.raises(E.ConfigError, match=r"trainer\.options: lr: Extra inputs are not permitted"):
        load_trainer(small_config(trainer={"factory": "cairn.trainers.mlp:MLPTrainer", "options": {"lr": 1}}))


def test_a_checkpoint_naming_an_untrusted_trainer_is_refused_before_import(tmp_path: Path) -> None:
    """A checkpoint is untrusted input: the trainer it names is not imported on its word."""
    found = parse_config({"trainer": {"factory": "evil.module:Payload"}})
    with pytest.raises(E.ConfigError, match="names trainer 'evil.module:Payload'.*CAIRN_TRAINERS"):
        trainer_for_checkpoint(found, None)
    with pytest.raises(E.IncompatibleConfigError, match="another trainer") as info:
        trainer_for_checkpoint(found, small_config())
    assert info.value.field == "config.trainer.factory"


def test_with_the_runs_config_the_trainer_is_built_from_it_never_from_the_checkpoint() -> None:
    """The run's config decides: the trainer is built from it, and a checkpoint whose config
    differs on an identity field is refused naming it before anything is built; the checkpoint's
    own config builds the trainer only when there is no run config."""
    given = small_config(stage="finetune")
    found = small_config(optimizer={"lr": 0.5})  # not an identity field: the run's may differ
    assert trainer_for_checkpoint(found, given).config == normalized_config(given)
    assert trainer_for_checkpoint(found, None).config == normalized_config(found)
    with pytest.raises(E.IncompatibleConfigError, match="different run configuration") as info:
        trainer_for_checkpoint(small_config(model={"kind": "mlp", "hidden": 4}), given)
    assert (info.value.field, info.value.expected, info.value.found) == ("config.model.hidden", 16, 4)


PAYLOAD = """
import os, pathlib
pathlib.Path(os.environ["EVIL_MARKER"], "imported").touch()
from cairn.trainers.mlp.trainer import MLPTrainer

class Trainer(MLPTrainer):
    def __init__(self, *args, **kwargs):
        pathlib.Path(os.environ["EVIL_MARKER"], "constructed").touch()
        super().__init__(*args, **kwargs)
"""


@pytest.fixture
def forged(tmp_path: Path) -> tuple[CheckpointRef, dict[str, str]]:
    """A real distributed-config checkpoint whose config was edited to name a payload module that
    is on the Python path (checksums and fingerprint recomputed: validation itself must refuse)."""
    (tmp_path / "payload" / "evilpkg").mkdir(parents=True)
    (tmp_path / "payload" / "evilpkg" / "__init__.py").write_text(PAYLOAD)
    (tmp_path / "marker").mkdir()
    session = TrainingSession.fresh("victim", tmp_path / "store", load_config(str(REPO / "examples/distributed.json")))
    result = session.run(2)
    assert result is not None

    def name_payload(body: dict[str, object]) -> None:
        config: dict[str, object] = body["config"]  # type: ignore[assignment]
        config["trainer"] = {"factory": "evilpkg:Trainer", "options": {}}
        for section in ("model", "data", "optimizer"):  # a trainer of its own takes no built-in sections
            config.pop(section, None)

    rewrite_manifest(session.store, result.ref, name_payload)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "payload"), str(REPO)]),
        "EVIL_MARKER": str(tmp_path / "marker"),
    }
    env.pop("CAIRN_TRAINERS", None)
    return result.ref, env


# `cairn` in a fresh process, not main() in this one: the payload is importable only on the child's
# PYTHONPATH, so an import it must not make is seen (the marker) and cannot leak into this process
# (test_the_library_refuses_the_payload_before_import checks sys.modules).
def _cairn(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.cli", *args], capture_output=True, text=True, cwd=REPO, env=env, timeout=180
    )


@pytest.mark.parametrize(
    "path",
    [
        ("ckpt", "verify", "{ref}"),
        ("ckpt", "compare", "{ref}", "{ref}"),
        ("eval", "{ref}"),
        ("train", "--resume", "{ref}", "--steps", "1", "--store", "{store}"),
        ("train", "--resume", "{ref}", "--steps", "1", "--store", "{store}", "--world-size", "2"),
    ],
    ids=["verify", "compare", "eval", "resume", "gang-resume"],
)
def test_a_payload_trainer_named_by_a_checkpoint_is_never_imported(
    forged: tuple[CheckpointRef, dict[str, str]], path: tuple[str, ...]
) -> None:
    ref, env = forged
    args = [a.format(ref=ref, store=ref.store_url) for a in path]
    out = _cairn(env, *args)
    marker = Path(env["EVIL_MARKER"])
    assert sorted(p.name for p in marker.iterdir()) == [], out.stderr
    assert out.returncode == 2, out.stderr
    assert "names trainer 'evilpkg:Trainer'" in out.stderr and "CAIRN_TRAINERS" in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr


def test_the_payload_test_can_fail_a_trusted_payload_is_imported(forged: tuple[CheckpointRef, dict[str, str]]) -> None:
    """The marker test detects an import: trusting the payload explicitly makes it run."""
    ref, env = forged
    _cairn({**env, "CAIRN_TRAINERS": "evilpkg:Trainer"}, "ckpt", "verify", str(ref))
    assert (Path(env["EVIL_MARKER"]) / "imported").exists()


def test_the_library_refuses_the_payload_before_import(forged: tuple[CheckpointRef, dict[str, str]]) -> None:
    ref, env = forged
    with pytest.raises(E.ConfigError, match="CAIRN_TRAINERS"):
        TrainingSession.from_checkpoint(ref)
    assert "evilpkg" not in sys.modules
