"""The coordinated engine (``cairn.distributed.engine``) at world size 1, with the built-in MLP's
ZeRO-1 layout: it restores training checkpoints only, applies the trainer's value rules before a
save (a non-finite state is a diverged run), and restores only blocks cut at the run's size. (The
bits across world sizes: ``test_history`` here, ``trainers/mlp/test_zero.py``,
``trainers/pytorch/test_data_parallel.py`` and the gang integration tests.)"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointContent, CheckpointKind, CheckpointOptions, list_checkpoints, write_checkpoint
from cairn.checkpoint.reader import read_manifest
from cairn.checkpoint.ref import CheckpointRef
from cairn.distributed.comm import SoloComm
from cairn.distributed.engine import check_blocked
from cairn.stores import LocalStore
from cairn.trainers.loading import load_trainer
from cairn.trainers.mlp.trainer import MLPTrainer
from cairn.trainers.mlp.zero import ZeroMLP
from tests.conftest import dist_config

RUN = "r"


def zero_engine(store: LocalStore) -> ZeroMLP:
    trainer = load_trainer(dist_config())
    assert isinstance(trainer, MLPTrainer)
    return ZeroMLP(trainer, SoloComm(), RUN, store, CheckpointOptions())


def test_only_a_training_checkpoint_is_restored(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    content = CheckpointContent(kind=CheckpointKind.JOURNAL, run_id=RUN, step=3, meta={"entries": []})
    ref = write_checkpoint(store, content, {}).ref
    engine = zero_engine(store)
    with pytest.raises(E.KindMismatchError, match="expected training, found journal"):
        engine.load(ref)  # (an agreed failure keeps its type and message)
    assert engine.state is None


def test_a_save_applies_the_trainers_value_rules_to_the_blocks_it_writes(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    engine = zero_engine(store)
    engine.start_fresh()
    engine.step()
    engine.v[0] = -1.0  # Adam's second moment: the MLP's own rule, which a restore would apply
    with pytest.raises(E.InvariantError, match="second moment"):
        engine.save()
    engine.v[0] = 0.0
    engine.theta[engine.mine.start] = np.nan
    with pytest.raises(E.TrainingDivergedError, match="step 1: .*nothing was committed"):
        engine.save()
    assert list_checkpoints(store, RUN) == []
    engine.theta[engine.mine.start] = 0.0
    assert engine.save().created  # the same engine saves once its state is sound


def test_a_restore_takes_blocks_cut_at_the_runs_size_only(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    engine = zero_engine(store)
    engine.start_fresh()
    ref = CheckpointRef.parse(engine.save().ref)
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING, expand_index=False)
    check_blocked(manifest, 64)
    with pytest.raises(E.InvariantError, match="block size") as refused:
        check_blocked(manifest, 128)
    assert refused.value.expected == 16 and refused.value.found == 8
    with pytest.raises(E.ManifestError, match="blocked"):
        check_blocked(manifest.model_copy(update={"parts": None}), 64)
    restored = zero_engine(store)
    assert restored.load(ref).fingerprint == manifest.fingerprint
    assert restored.state is not None and restored.state.step == 0
