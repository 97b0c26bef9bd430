"""The built-in trainer's arithmetic: a pure, seeded, float64 MLP. S_{t+1} = F(S_t, D_t).

An MLP (or softmax regression) trained with Adam on a deterministic dataset. Each update
draws ``batch_size`` example indices from the training RNG (PCG64), or — with
``data.sampling = "epoch"`` — takes the next batch of the epoch's seeded permutation
(``cairn.sampler``); the data cursor counts the examples drawn. No hidden globals, no wall
clock, no unseeded randomness: the same state and data give the same next state, bit for bit.
``cairn.trainers.mlp.MLPTrainer`` wires these functions into the trainer interface.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from cairn.config import OptimizerConfig, TrainConfig
from cairn.data import Dataset
from cairn.distributed.reduce import tree_sum
from cairn.errors import ConfigError
from cairn.sampler import EpochSampler
from cairn.state import HISTORY_KEYS, Lineage, StepCallback, TrainState, param_shapes

__all__ = ["init_state", "advance", "train", "learning_rate", "weights_only", "loss_and_grads"]


def _seed_sequences(config: TrainConfig) -> tuple[np.random.SeedSequence, np.random.SeedSequence]:
    init_seq, train_seq = np.random.SeedSequence(config.seed).spawn(2)
    return init_seq, train_seq


def fresh_rng_state(config: TrainConfig) -> dict[str, object]:
    """The training RNG's state at step 0."""
    _, train_seq = _seed_sequences(config)
    return dict(np.random.PCG64(train_seq).state)


def init_state(config: TrainConfig, dataset: Dataset) -> TrainState:
    """Step 0 of a run: seeded weights, zero moments, a fresh training RNG."""
    if dataset.x.shape[1] != config.data.n_features:
        raise ConfigError("data.n_features", expected=dataset.x.shape[1], found=config.data.n_features)
    init_seq, _ = _seed_sequences(config)
    init_rng = np.random.Generator(np.random.PCG64(init_seq))
    params: dict[str, np.ndarray] = {}
    for name, shape in param_shapes(config, dataset.x.shape[1]).items():
        if len(shape) == 2:
            scale = config.model.init_scale / math.sqrt(shape[0])
            params[name] = init_rng.standard_normal(shape) * scale
        else:
            params[name] = np.zeros(shape, dtype=np.float64)
    lineage = Lineage(
        dataset_version=dataset.version,
        dataset_hash=dataset.content_hash,
        model_version=config.model.version,
        tokenizer_version=config.tokenizer_version,
        stage_contract=config.stage,
    )
    tensors: dict[str, np.ndarray] = {}
    for name, theta in params.items():
        tensors[f"theta/{name}"] = theta
        tensors[f"adam.m/{name}"] = np.zeros_like(theta)
        tensors[f"adam.v/{name}"] = np.zeros_like(theta)
    return TrainState(
        config=config,
        lineage=lineage,
        tensors=tensors,
        step=0,
        cursor=0,
        rng_state=fresh_rng_state(config),
        history={k: [] for k in HISTORY_KEYS},
    )


def weights_only(state: TrainState, dataset: Dataset) -> TrainState:
    """Keep theta, reset everything else (moments, step, RNG, cursor, history).

    This is what "restoring from weights" gives you. It reproduces the forward function,
    not training: the next update already differs from the uninterrupted run.
    """
    fresh = init_state(state.config, dataset)
    for name, theta in state.params.items():
        fresh.tensors[f"theta/{name}"] = theta.copy()
    return fresh


def learning_rate(config: TrainConfig, t: int) -> float:
    """Learning rate for update number ``t`` (1-based): linear warmup, then decay."""
    opt = config.optimizer
    if opt.warmup_steps and t <= opt.warmup_steps:
        return opt.lr * t / opt.warmup_steps
    progress = min(1.0, (t - opt.warmup_steps) / opt.decay_steps)
    floor = opt.min_lr_ratio
    if opt.decay == "constant":
        factor = 1.0
    elif opt.decay == "linear":
        factor = 1.0 - (1.0 - floor) * progress
    else:
        factor = floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))
    return opt.lr * factor


def loss_and_grads(
    params: dict[str, np.ndarray], xb: np.ndarray, yb: np.ndarray
) -> tuple[float, dict[str, np.ndarray]]:
    """Mean softmax cross-entropy of a batch and its gradient with respect to theta."""
    batch = xb.shape[0]
    hidden = "W1" in params
    if hidden:
        a1 = np.tanh(xb @ params["W1"] + params["b1"])
        logits = a1 @ params["W2"] + params["b2"]
    else:
        logits = xb @ params["W"] + params["b"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    denom = exp.sum(axis=1, keepdims=True)
    rows = np.arange(batch)
    loss = float(np.mean(np.log(denom[:, 0]) - shifted[rows, yb]))
    dlogits = exp / denom
    dlogits[rows, yb] -= 1.0
    dlogits /= batch
    if not hidden:
        return loss, {"W": xb.T @ dlogits, "b": dlogits.sum(axis=0)}
    dz1 = (dlogits @ params["W2"].T) * (1.0 - a1 * a1)
    return loss, {
        "W1": xb.T @ dz1,
        "b1": dz1.sum(axis=0),
        "W2": a1.T @ dlogits,
        "b2": dlogits.sum(axis=0),
    }


def microbatch_loss_and_grads(
    params: dict[str, np.ndarray], xb: np.ndarray, yb: np.ndarray, microbatches: int
) -> tuple[float, dict[str, np.ndarray]]:
    """The batch's mean loss and gradient as the canonical reduction of its ``microbatches``
    equal microbatches (``cairn.distributed.reduce``): what any number of ranks computes."""
    size = xb.shape[0] // microbatches
    parts = [
        loss_and_grads(params, xb[i * size : (i + 1) * size], yb[i * size : (i + 1) * size])
        for i in range(microbatches)
    ]
    scale = 1.0 / microbatches  # a power of two: exact
    loss = tree_sum([p[0] for p in parts]) * scale
    grads = {name: tree_sum([p[1][name] for p in parts]) * scale + 0.0 for name in params}  # +0: no signed zeros
    return loss, grads


def adam_update(
    theta: np.ndarray,
    g: np.ndarray,
    m: np.ndarray,
    v: np.ndarray,
    opt: OptimizerConfig,
    lr: float,
    bc1: float,
    bc2: float,
) -> None:
    """Adam with bias correction and decoupled weight decay, in place and elementwise: the same
    bits on a whole tensor or on any slice of it (a ZeRO-1 rank updates its slice with this)."""
    m *= opt.beta1
    m += (1.0 - opt.beta1) * g
    v *= opt.beta2
    v += (1.0 - opt.beta2) * (g * g)
    update = (m / bc1) / (np.sqrt(v / bc2) + opt.eps)
    if opt.weight_decay:
        update += opt.weight_decay * theta
    theta -= lr * update


def _update_in_place(
    state: TrainState, dataset: Dataset, rng: np.random.Generator, sampler: EpochSampler | None
) -> None:
    config = state.config
    opt = config.optimizer
    # With replacement from the training RNG (v1), or the next batch of the epoch's permutation.
    idx = (
        sampler.batch(state.step)
        if sampler is not None
        else rng.integers(0, dataset.n_examples, size=config.batch_size)
    )
    params, moments1, moments2 = state.params, state.m, state.v
    microbatches = config.distributed.microbatches if config.distributed is not None else 1
    if microbatches == 1:  # the v1 arithmetic
        loss, grads = loss_and_grads(params, dataset.x[idx], dataset.y[idx])
    else:
        loss, grads = microbatch_loss_and_grads(params, dataset.x[idx], dataset.y[idx], microbatches)
    t = state.step + 1
    lr = learning_rate(config, t)
    bc1 = 1.0 - opt.beta1**t
    bc2 = 1.0 - opt.beta2**t
    for name, theta in params.items():
        adam_update(theta, grads[name], moments1[name], moments2[name], opt, lr, bc1, bc2)
    state.step = t
    state.cursor += config.batch_size
    state.history["loss"].append(loss)
    state.history["lr"].append(lr)


def train(
    state: TrainState,
    dataset: Dataset,
    steps: int,
    on_step: StepCallback | None = None,
    *,
    sampler: EpochSampler | None = None,
    after_update: Callable[[TrainState], None] | None = None,
) -> TrainState:
    """Apply ``steps`` updates and return the new state; ``state`` itself is not modified.

    ``on_step`` sees the working state after each update (e.g. to checkpoint every K
    steps); it must copy what it keeps, and may return True to stop early. ``sampler`` draws
    batches epoch by epoch instead of from the RNG; ``after_update`` completes the state of an
    update before ``on_step`` sees it (the trainer's evaluation at epoch ends).
    """
    if steps < 0:
        raise ConfigError("steps", expected=">= 0", found=steps)
    work = state.copy()
    rng = np.random.Generator(np.random.PCG64())
    rng.bit_generator.state = work.rng_state
    for _ in range(steps):
        # Overflow in a diverging run is reported once, as TrainingDivergedError, by the
        # session's finiteness checks (before any commit), not as a stream of RuntimeWarnings.
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            _update_in_place(work, dataset, rng, sampler)
        work.rng_state = dict(rng.bit_generator.state)
        if after_update is not None:
            after_update(work)
        if on_step is not None and on_step(work):
            break
    return work


def advance(state: TrainState, dataset: Dataset) -> TrainState:
    """F: one update. S_{t+1} = F(S_t, D_t)."""
    return train(state, dataset, 1)
