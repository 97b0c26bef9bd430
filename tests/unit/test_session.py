"""A training session (``cairn.session``): the seed scenario in one process (17 updates, export,
restore, 23 more == 40 uninterrupted, bit for bit), a broken RNG save is caught, checkpoints
every N steps, and the dataset file's hash in the lineage."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cairn.checkpoint import latest_committed
from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig
from cairn.data import load_dataset
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.conftest import small_config


def test_seed_scenario_in_process(local_store: LocalStore, config: TrainConfig) -> None:
    """17 updates, export, restore, 23 more == 40 uninterrupted, bit for bit; 80 draws."""
    first = TrainingSession.fresh("seed", local_store, config)
    ref17 = first.run(17)
    assert ref17 is not None and ref17.manifest.step == 17 and ref17.manifest.cursor == 34

    resumed = TrainingSession.from_checkpoint(ref17.ref)
    resumed.run(23)

    reference = TrainingSession.fresh("reference", local_store, config)
    reference.run(40)

    assert compare_states(resumed.state, reference.state) == []
    assert resumed.state.step == 40 and resumed.state.cursor == 80  # 2 examples per update
    assert len(resumed.state.history["loss"]) == 40
    for name in reference.state.params:
        assert resumed.state.params[name].tobytes() == reference.state.params[name].tobytes()
        assert resumed.state.m[name].tobytes() == reference.state.m[name].tobytes()
        assert resumed.state.v[name].tobytes() == reference.state.v[name].tobytes()
    assert resumed.state.rng_state == reference.state.rng_state
    assert resumed.last_commit and reference.last_commit
    assert resumed.last_commit.manifest.fingerprint == reference.last_commit.manifest.fingerprint


def test_broken_rng_saving_is_caught(
    local_store: LocalStore, config: TrainConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recovery check can fail: break RNG saving on purpose and the seed check catches it."""
    import cairn.session as session_mod
    from cairn.trainers.mlp.arithmetic import fresh_rng_state

    real_save = session_mod.save_training

    def save_without_rng(store, run_id, state, **kw):  # type: ignore[no-untyped-def]
        broken = state.copy()
        broken.rng_state = fresh_rng_state(state.config)  # RNG "not saved": restores as new
        return real_save(store, run_id, broken, **kw)

    monkeypatch.setattr(session_mod, "save_training", save_without_rng)
    first = TrainingSession.fresh("broken", local_store, config)
    ref17 = first.run(17)
    assert ref17 is not None
    resumed = TrainingSession.from_checkpoint(ref17.ref)
    resumed.run(23)
    reference = TrainingSession.fresh("ref", local_store, config)
    reference.run(40)
    fields = {d.field for d in compare_states(resumed.state, reference.state)}
    assert "rng" in fields and "theta.W1" in fields


def test_latest_committed_and_checkpoint_every(local_store: LocalStore, config: TrainConfig) -> None:
    session = TrainingSession.fresh("every", local_store, config)
    session.run(25, checkpoint_every=10)
    ref = latest_committed(local_store, "every")
    assert ref is not None and ref.step == 25
    state, manifest = load_training(local_store, ref)
    assert state.step == 25 and manifest.lineage and manifest.lineage.parent is not None


def test_file_dataset_hash_in_lineage(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    path = tmp_path / "data.npz"
    np.savez(path, x=rng.standard_normal((40, 8)), y=rng.integers(0, 3, 40))
    cfg = small_config(data={"source": "file", "path": str(path), "n_features": 8, "n_classes": 3})
    session = TrainingSession.fresh("file", LocalStore(tmp_path / "s"), cfg)
    result = session.run(3)
    assert result is not None and result.manifest.lineage is not None
    assert result.manifest.lineage.dataset_hash == load_dataset(cfg.data).content_hash
