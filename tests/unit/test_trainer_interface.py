"""The trainer interface: the built-in MLP as its first implementation (v1 unchanged), selecting a
trainer by import path, epochs with an exact cursor, evaluation splits, and the lifecycle record."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointRef, latest_committed, load_training, read_manifest
from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig, parse_config
from cairn.sampler import EpochSampler
from cairn.session import TrainingSession, default_run_id
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer, trainer_for_checkpoint
from cairn.trainers.mlp.trainer import MLPTrainer
from tests.conftest import rewrite_manifest, small_config
from workers.cli.main import main as cli

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
V1_CONFIG = {
    "seed": 5,
    "batch_size": 4,
    "model": {"hidden": 4},
    "data": {"n_examples": 64, "n_features": 3, "n_classes": 3},
}


# -- v1 compatibility ---------------------------------------------------------------------------
def test_v1_checkpoint_reads_and_the_builtin_trainer_is_unchanged(tmp_path: Path) -> None:
    """A checkpoint written by format-v1 code (before the trainer interface) verifies, keeps its
    fingerprint, and equals — bit for bit — what today's built-in trainer computes."""
    store_dir = tmp_path / "store"
    shutil.copytree(FIXTURES / "v1_checkpoint", store_dir)
    store = LocalStore(store_dir)
    ref = latest_committed(store, "v1-run")
    assert ref is not None and ref.step == 7
    manifest = read_manifest(store, ref, expect_kind=None)
    assert manifest.fingerprint == "sha256:02fd9b588b16815114f04fe9e66f1900e18a61cac7b7dfc47beffacb954cfa46"
    old, _ = load_training(store, ref)
    config = parse_config(V1_CONFIG)
    assert default_run_id(config) == "cfg-67098caf765e"  # the v1 run id of this config
    now = TrainingSession.fresh("v1-run-now", tmp_path / "now", config)
    result = now.run(7)
    assert result is not None and result.manifest.fingerprint == manifest.fingerprint
    assert compare_states(old, now.state) == []
    resumed = TrainingSession.resume_latest("v1-run", store, config)
    assert resumed.state.step == 7 and resumed.trainer.path == "cairn.trainers.mlp:MLPTrainer"
    # What today's code writes for the built-in trainer is a v1 manifest, field for field, plus
    # the numerics profile it was computed under (provenance: outside the fingerprint).
    old_body = json.loads(store.read(f"{ref.prefix}/manifest.json"))
    new_body = json.loads(now.store.read(f"{result.ref.prefix}/manifest.json"))
    assert set(new_body) == set(old_body) and new_body["format_version"] == 1
    assert set(new_body["lineage"]) == set(old_body["lineage"]) | {"numerics"}
    assert new_body["lineage"]["numerics"]["profile"] == "x86-64-v3" and "numerics" not in old_body["lineage"]
    assert new_body["config"] == old_body["config"] and new_body["meta"] == old_body["meta"] == {}


# -- selecting a trainer ------------------------------------------------------------------------
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


# -- epochs and evaluation ---------------------------------------------------------------------
def test_epoch_sampler_draws_without_replacement_and_resumes_mid_epoch() -> None:
    sampler = EpochSampler(n_examples=50, batch_size=8, seed=3)
    assert sampler.steps_per_epoch == 6
    epoch0 = np.concatenate([sampler.batch(t) for t in range(6)])
    assert len(set(epoch0.tolist())) == 48  # no example twice in an epoch (2 dropped)
    epoch1 = np.concatenate([sampler.batch(t) for t in range(6, 12)])
    assert not np.array_equal(epoch0, epoch1)  # a new permutation per epoch
    later = EpochSampler(n_examples=50, batch_size=8, seed=3)  # a fresh process, mid-epoch
    assert all(np.array_equal(later.batch(t), sampler.batch(t)) for t in (9, 10, 11, 3))
    assert sampler.cursor(9).to_json() == {"epoch": 1, "position": 3}


def epoch_config(**data: object) -> TrainConfig:
    base = small_config().model_dump(mode="json")
    base["data"].update({"sampling": "epoch", "val_fraction": 0.2, "test_fraction": 0.1, **data})
    return parse_config(base)


def test_builtin_trainer_by_epochs_evaluates_and_resumes_bit_exact(tmp_path: Path) -> None:
    config = epoch_config()
    trainer = load_trainer(config)
    assert isinstance(trainer, MLPTrainer) and trainer.eval_history
    spe = trainer.steps_per_epoch
    total = 2 * spe + 3
    reference = TrainingSession.fresh("ref", tmp_path / "a", config)
    reference.run(total, checkpoint_at_end=False)
    assert reference.state.history["val_step"] == [float(spe), float(2 * spe)]
    assert all(0.0 <= a <= 1.0 for a in reference.state.history["val_accuracy"])
    assert reference.state.meta["data"] == {"epoch": 2, "position": 3, "steps_per_epoch": spe}
    first = TrainingSession.fresh("run", tmp_path / "b", config)
    first.run(spe + 2)  # stops mid-epoch
    resumed = TrainingSession.resume_latest("run", tmp_path / "b", config)
    resumed.run(total - spe - 2, checkpoint_at_end=False)
    assert compare_states(resumed.state, reference.state) == []


def test_forged_epoch_cursor_and_eval_history_are_refused(tmp_path: Path) -> None:
    config = epoch_config()
    session = TrainingSession.fresh("run", tmp_path / "s", config)
    result = session.run(load_trainer(config).steps_per_epoch + 1)
    assert result is not None
    store = session.store

    def forge_cursor(body: dict[str, object]) -> None:
        body["meta"]["data"]["position"] = 0  # type: ignore[index]

    rewrite_manifest(store, result.ref, forge_cursor)
    before = session.state.copy()
    with pytest.raises(E.InvariantError) as info:
        session.restore(result.ref)
    assert info.value.field == "meta.data"
    assert compare_states(session.state, before) == []  # a refused import leaves the run untouched


# -- lifecycle: init_from stages, final-test exposures -----------------------------------------
def test_init_from_starts_a_stage_and_test_exposures_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = epoch_config()
    store = tmp_path / "store"
    first = TrainingSession.fresh("stage1", store, base)
    done = first.run(20)
    assert done is not None
    body = base.model_dump(mode="json")
    body["stage"] = "finetune"
    body["optimizer"]["lr"] = 0.001
    body["init_from"] = {"checkpoint": str(done.ref)}
    stage2 = TrainingSession.fresh("stage2", store, parse_config(body))
    state = stage2.state
    assert state.step == 0 and state.lineage.reference is not None
    assert state.lineage.reference.fingerprint == done.manifest.fingerprint
    assert state.lineage.reference.may_change == ["data", "init_from", "optimizer", "stage"]
    assert np.array_equal(state.params["W1"], first.state.params["W1"])  # the weights came along...
    assert not state.m["W1"].any() and state.rng_state == stage2.trainer.init_state().rng_state  # ...nothing else
    stage2_done = stage2.run(5)
    assert stage2_done is not None

    body["seed"] = 99  # the stage contract does not allow a new seed
    with pytest.raises(E.IncompatibleConfigError, match="stage contract") as info:
        TrainingSession.fresh("stage3", store, parse_config(body))
    assert info.value.field == "config.seed"

    ckpt = str(stage2_done.ref)
    assert cli(["eval", ckpt, "--split", "val", "--json"]) == 0
    assert cli(["eval", ckpt, "--split", "test", "--json"]) == 0
    one = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert one["final_test_exposures"] == 1 and "warning" not in one
    assert cli(["eval", ckpt, "--split", "test", "--json"]) == 0
    out = capsys.readouterr()
    two = json.loads(out.out.splitlines()[-1])
    assert two["final_test_exposures"] == 2 and "evaluated 2 times" in out.err
    assert cli(["ckpt", "show", ckpt]) == 0
    shown = capsys.readouterr()
    assert "final-test exposures 2" in shown.out and "reference" in shown.out and "warning" in shown.err
    # The checkpoint itself stayed immutable: its fingerprint still verifies.
    assert cli(["ckpt", "verify", ckpt]) == 0
    capsys.readouterr()
    assert CheckpointRef.parse(ckpt) == stage2_done.ref


def test_cli_names_the_trainer_and_run_start_checks_its_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(small_config().to_json()))
    store = str(tmp_path / "store")
    assert (
        cli(
            [
                "train",
                "--config",
                str(config),
                "--steps",
                "3",
                "--store",
                store,
                "--json",
                "--trainer",
                "cairn.trainers.mlp:MLPTrainer",
            ]
        )
        == 0
    )
    assert json.loads(capsys.readouterr().out)["step"] == 3
    bare = tmp_path / "bare.json"
    bare.write_text(json.dumps({"seed": 1, "batch_size": 4}))
    assert cli(["train", "--config", str(bare), "--steps", "3", "--store", store, "--trainer", "nowhere.pkg:Net"]) == 2
    assert "module 'nowhere' is not installed" in capsys.readouterr().err
    # The built-in MLP's sections do not silently ride along with another trainer.
    assert (
        cli(["train", "--config", str(config), "--steps", "3", "--store", store, "--trainer", "nowhere.pkg:Net"]) == 2
    )
    assert "'model' configures the built-in MLP" in capsys.readouterr().err
    run = json.loads((Path(__file__).resolve().parents[2] / "examples" / "run.json").read_text())
    run["config"]["trainer"] = {"factory": "cairn.trainers.mlp:MLPTrainer", "options": {"depth": 3}}
    run_file = tmp_path / "run.json"
    run_file.write_text(json.dumps(run))
    assert cli(["run", "start", str(run_file), "--address", "127.0.0.1:1"]) == 2  # before connecting
    assert "config.trainer.options: depth: Extra inputs are not permitted" in capsys.readouterr().err
