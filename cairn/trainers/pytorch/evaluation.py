"""Evaluation for any model: the validation loss from the setup's loss function, and metrics from
a hook whose defaults follow the output's shape (classification ``N x C``, sequences
``B x T x V``: token accuracy, and perplexity = exp(loss)); other outputs report loss only."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from cairn.errors import TrainerCodeError
from cairn.trainers.pytorch.device import place
from cairn.trainers.pytorch.parts import TorchParts
from cairn.trainers.pytorch.scoring import IGNORE_INDEX, default_loss, default_metrics, scored

__all__ = [
    "IGNORE_INDEX",
    "METRIC_NAME",
    "MAX_METRICS",
    "default_loss",
    "default_metrics",
    "evaluate_split",
    "record_evaluation",
]

METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MAX_METRICS = 16


def _weight(target: Any, output: Any) -> float:
    """What one batch's mean loss averages over: its scored targets."""
    if scored(output, target):
        return float((target != IGNORE_INDEX).sum())
    if isinstance(target, torch.Tensor):
        return float(target.numel())
    return 1.0


def evaluate_split(trainer: TorchParts, split: str) -> dict[str, float]:
    """Loss and metrics of the live model on ``split`` (eval mode, no grad, the run's RNG
    streams untouched). Runs inside the trainer's ``user_code``."""
    data = trainer.splits[split]
    model = trainer.model
    was_training = model.training
    model.eval()
    loss_sum, weight, sequence = 0.0, 0.0, False
    sums: dict[str, list[float]] = {}
    cuda = trainer.device.type == "cuda"
    forked = torch.random.fork_rng(devices=[trainer.device] if cuda else [], device_type="cuda" if cuda else None)
    with torch.no_grad(), forked:
        np_state, py_state = np.random.get_state(), random.getstate()
        for batch in data.eval_batches(trainer.options.eval_batch_size):
            xb, yb = place(batch, trainer.device)
            with trainer.autocast():
                out = trainer.forward(xb)
                loss = trainer.setup.loss_fn(out, yb)
            w = _weight(yb, out)
            if not w:
                continue  # nothing scored in this batch (every target ignored)
            loss_sum += float(loss) * w
            weight += w
            sequence = sequence or (isinstance(out, torch.Tensor) and out.ndim >= 3)
            for name, (total, count) in _checked(trainer.metrics(out, yb)).items():
                acc = sums.setdefault(name, [0.0, 0.0])
                acc[0] += total
                acc[1] += count
        np.random.set_state(np_state)
        random.setstate(py_state)
    model.train(was_training)
    mean = loss_sum / weight if weight else 0.0
    result = {"loss": mean, **{name: total / count if count else 0.0 for name, (total, count) in sums.items()}}
    if sequence and "perplexity" not in result:
        result["perplexity"] = math.exp(min(mean, 700.0))
    bad = sorted(k for k, v in result.items() if not math.isfinite(v))
    if bad:  # a checkpoint's history must be finite: refuse it here, not at the next restore
        raise TrainerCodeError(f"evaluation on {split}: {', '.join(bad)} not finite ({result})"[:300])
    return result


def _checked(metrics: Any) -> Mapping[str, tuple[float, float]]:
    if not isinstance(metrics, Mapping) or len(metrics) > MAX_METRICS:
        raise TrainerCodeError(f"metrics(): expected a mapping of at most {MAX_METRICS} names, found {metrics!r}"[:300])
    for name, value in metrics.items():
        if not (isinstance(name, str) and METRIC_NAME.match(name)) or name == "loss":
            raise TrainerCodeError(
                f"metrics(): expected names matching {METRIC_NAME.pattern} (not 'loss'), found {name!r}"
            )
        if not (isinstance(value, tuple) and len(value) == 2):
            raise TrainerCodeError(f"metrics(): {name} expected a (total, count) pair, found {value!r}"[:300])
    return {name: (float(total), float(count)) for name, (total, count) in metrics.items()}


def record_evaluation(
    known: tuple[str, ...] | None, step: int, metrics: dict[str, float], history: dict[str, list[float]]
) -> tuple[str, ...]:
    """Append an evaluation after update ``step`` to ``history`` (``val_step``, ``val_loss``, one
    ``val_<name>`` per metric); returns the metric names. The first evaluation (``known`` None)
    fixes them; later ones must name the ``known`` ones."""
    names = tuple(sorted(k for k in metrics if k != "loss"))
    if known is None:
        for name in names:
            history.setdefault(f"val_{name}", [])
    elif names != known:
        raise TrainerCodeError(
            f"evaluation after update {step}: metrics are {list(names)}, earlier evaluations "
            f"recorded {list(known)} (metrics() must name the same metrics every time)"
        )
    history["val_step"].append(float(step))
    history["val_loss"].append(metrics["loss"])
    for name in names:
        history[f"val_{name}"].append(metrics[name])
    return names
