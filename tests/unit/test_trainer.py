"""The seed scenario and the trainer's determinism, in-process and across processes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cairn.checkpoint import latest_committed, load_training
from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig
from cairn.data import load_dataset
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trainers.mlp.arithmetic import advance, init_state, learning_rate, train, weights_only
from tests.conftest import REPO, small_config


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


def test_seed_scenario_across_processes(tmp_path: Path) -> None:
    """Export at 17, restore in a fresh Python process, 23 more: identical to 40 uninterrupted."""
    store = tmp_path / "store"
    cfg = REPO / "examples" / "config.json"

    def cairn(*args: str) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-m", "workers.cli", *args, "--json"],
            check=True,
            capture_output=True,
            text=True,
            cwd=REPO,
        )
        return json.loads(out.stdout)

    part = cairn("train", "--config", str(cfg), "--steps", "17", "--store", str(store), "--run-id", "seed")
    assert part["step"] == 17 and part["cursor"] == 34
    resumed = cairn("train", "--resume", str(part["checkpoint"]), "--steps", "23", "--store", str(store))
    whole = cairn("train", "--config", str(cfg), "--steps", "40", "--store", str(store), "--run-id", "whole")
    assert resumed["step"] == whole["step"] == 40
    assert resumed["cursor"] == whole["cursor"] == 80
    assert resumed["fingerprint"] == whole["fingerprint"]
    verdict = subprocess.run(
        [
            sys.executable,
            "-m",
            "workers.cli",
            "ckpt",
            "compare",
            str(resumed["checkpoint"]),
            str(whole["checkpoint"]),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert verdict.returncode == 0, verdict.stdout + verdict.stderr


def test_weights_only_restore_differs_at_next_update(local_store: LocalStore, config: TrainConfig) -> None:
    ds = load_dataset(config.data)
    s17 = train(init_state(config, ds), ds, 17)
    full_next = advance(s17, ds)
    weights_next = advance(weights_only(s17, ds), ds)
    # The forward function is the same before the update...
    for name in s17.params:
        assert np.array_equal(weights_only(s17, ds).params[name], s17.params[name])
    # ...but training is not: the very next update already differs.
    diffs = {d.field for d in compare_states(weights_next, full_next)}
    assert "theta.W1" in diffs and "m.W1" in diffs and "rng" in diffs and "cursor" in diffs


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


def test_trainer_is_pure_and_repeatable(config: TrainConfig) -> None:
    ds = load_dataset(config.data)
    s0 = init_state(config, ds)
    before = s0.copy()
    a = train(s0, ds, 80)
    b = train(s0, ds, 80)
    assert compare_states(s0, before) == []  # input untouched
    assert compare_states(a, b) == []
    loss = a.history["loss"]
    assert np.mean(loss[-20:]) < 0.5 * np.mean(loss[:20])  # it actually learns


def test_softmax_regression_and_gradients(config: TrainConfig) -> None:
    cfg = small_config(model={"hidden": 0})
    ds = load_dataset(cfg.data)
    state = init_state(cfg, ds)
    assert set(state.params) == {"W", "b"}
    # Finite-difference check of the analytic gradient on the MLP.
    from cairn.trainers.mlp.arithmetic import loss_and_grads

    mlp = init_state(config, load_dataset(config.data))
    xb, yb = load_dataset(config.data).x[:4], load_dataset(config.data).y[:4]
    _, grads = loss_and_grads(mlp.params, xb, yb)
    eps = 1e-6
    for name in ("W1", "b2"):
        p = {k: v.copy() for k, v in mlp.params.items()}
        p[name].flat[0] += eps
        up, _ = loss_and_grads(p, xb, yb)
        p[name].flat[0] -= 2 * eps
        down, _ = loss_and_grads(p, xb, yb)
        assert abs((up - down) / (2 * eps) - grads[name].flat[0]) < 1e-6


def test_learning_rate_schedule(config: TrainConfig) -> None:
    opt = config.optimizer
    assert learning_rate(config, 1) == pytest.approx(opt.lr / opt.warmup_steps)
    assert learning_rate(config, opt.warmup_steps) == pytest.approx(opt.lr)
    end = opt.warmup_steps + opt.decay_steps
    assert learning_rate(config, end) == pytest.approx(opt.lr * opt.min_lr_ratio)
    assert learning_rate(config, end + 100) == pytest.approx(opt.lr * opt.min_lr_ratio)


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
