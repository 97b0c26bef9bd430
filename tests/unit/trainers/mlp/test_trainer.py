"""The built-in trainer (``cairn.trainers.mlp.MLPTrainer``): a checkpoint written by format-v1 code
reads, and today's trainer computes it bit for bit; by epochs it evaluates and resumes bit-exact;
a forged epoch cursor is refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cairn import errors as E
from cairn.checkpoint import latest_committed, read_manifest
from cairn.checkpoint.compare import compare_states
from cairn.config import parse_config
from cairn.session import TrainingSession, default_run_id
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.trainers.mlp.trainer import MLPTrainer
from cairn.training import load_training
from tests.conftest import FIXTURES, epoch_config, rewrite_manifest

V1_CONFIG = {
    "seed": 5,
    "batch_size": 4,
    "model": {"hidden": 4},
    "data": {"n_examples": 64, "n_features": 3, "n_classes": 3},
}


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
    # the numerics profile it was computed under (provenance: outside the fingerprint) and its
    # history as segments (``history``, in place of the ``history/KEY`` tensors: same fingerprint).
    old_body = json.loads(store.read(f"{ref.prefix}/manifest.json", 1 << 30))
    new_body = json.loads(now.store.read(f"{result.ref.prefix}/manifest.json", 1 << 30))
    assert set(new_body) == set(old_body) | {"history"} and new_body["format_version"] == 1
    assert {t["name"] for t in old_body["tensors"]} - {t["name"] for t in new_body["tensors"]} == {
        "history/loss",
        "history/lr",
    }
    assert set(new_body["lineage"]) == set(old_body["lineage"]) | {"numerics"}
    assert new_body["lineage"]["numerics"]["profile"] == "x86-64-v3" and "numerics" not in old_body["lineage"]
    assert new_body["config"] == old_body["config"] and new_body["meta"] == old_body["meta"] == {}


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
