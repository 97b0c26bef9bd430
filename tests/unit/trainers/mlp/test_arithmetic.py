"""The built-in trainer's arithmetic (``cairn.trainers.mlp.arithmetic``): pure and repeatable, it
learns, the analytic gradients match finite differences, the learning-rate schedule, weights
alone do not resume training, and microbatches (one is the v1 arithmetic; more change the bits)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig
from cairn.data import load_dataset
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.trainers.mlp.arithmetic import advance, init_state, learning_rate, train, weights_only
from tests.conftest import dist_config, small_config


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


def test_one_microbatch_is_the_v1_arithmetic(tmp_path: Path) -> None:
    plain = TrainingSession.fresh("r", LocalStore(tmp_path / "a"), small_config(batch_size=16))
    split = TrainingSession.fresh("r", LocalStore(tmp_path / "b"), dist_config(microbatches=1))
    plain.run(10)
    split.run(10)
    for name, arr in plain.state.tensors.items():
        assert np.array_equal(arr, split.state.tensors[name]), name


def test_microbatches_change_the_bits_so_they_are_part_of_the_run_identity(tmp_path: Path) -> None:
    a = TrainingSession.fresh("r", LocalStore(tmp_path / "a"), dist_config(microbatches=1))
    b = TrainingSession.fresh("r", LocalStore(tmp_path / "b"), dist_config(microbatches=8))
    a.run(10)
    b.run(10)
    assert not np.array_equal(a.state.tensors["theta/W1"], b.state.tensors["theta/W1"])
    assert a.state.history["loss"][0] == pytest.approx(b.state.history["loss"][0], rel=1e-12)
