"""Evaluation for any model: the validation loss from the setup's loss function, and metrics from
a hook whose defaults follow the output's shape (classification ``N x C``, sequences
``B x T x V``: token accuracy, and perplexity = exp(loss)); other outputs report loss only."""

from __future__ import annotations

import math
import random
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.nn import functional

from cairn.errors import TrainerCodeError
from cairn.trainers.pytorch.device import place

if TYPE_CHECKING:
    from cairn.trainers.pytorch.trainer import TorchTrainer

__all__ = ["IGNORE_INDEX", "METRIC_NAME", "MAX_METRICS", "default_loss", "default_metrics", "evaluate_split"]

IGNORE_INDEX = -100
"""Targets equal to this are not scored (``cross_entropy``'s default ``ignore_index``)."""
METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
MAX_METRICS = 16


def _scored(output: Any, target: Any) -> bool:
    """Class scores over the last axis of ``output`` for every integer target (``N x C`` with
    ``N``, ``B x T x V`` with ``B x T``)."""
    return (
        isinstance(output, torch.Tensor)
        and isinstance(target, torch.Tensor)
        and not target.is_floating_point()
        and output.ndim == target.ndim + 1
        and output.shape[:-1] == target.shape
    )


def default_loss(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over the last axis: ``N x C`` classification as ``cross_entropy`` has it,
    and ``B x T x V`` sequences as the mean over every scored token."""
    if output.ndim > 2 and _scored(output, target):
        return functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return functional.cross_entropy(output, target)


def default_metrics(output: Any, target: Any) -> dict[str, tuple[float, float]]:
    """``{name: (total, count)}`` for one batch: the accuracy of the last axis' argmax for
    classification and sequence outputs (targets equal to ``IGNORE_INDEX`` not counted)."""
    if not _scored(output, target):
        return {}
    mask = target != IGNORE_INDEX
    correct = ((output.argmax(dim=-1) == target) & mask).sum()
    return {"accuracy": (float(correct), float(mask.sum()))}


def _weight(target: Any, output: Any) -> float:
    """What one batch's mean loss averages over: its scored targets."""
    if _scored(output, target):
        return float((target != IGNORE_INDEX).sum())
    if isinstance(target, torch.Tensor):
        return float(target.numel())
    return 1.0


def evaluate_split(trainer: TorchTrainer, split: str) -> dict[str, float]:
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
    trainer: TorchTrainer, step: int, metrics: dict[str, float], history: dict[str, list[float]]
) -> None:
    """Append an evaluation after update ``step`` to ``history`` (``val_step``, ``val_loss``, one
    ``val_<name>`` per metric). The first evaluation fixes the metric names; later ones must
    name the same."""
    names = tuple(sorted(k for k in metrics if k != "loss"))
    if trainer._metric_names is None:
        trainer._metric_names = names
        for name in names:
            history.setdefault(f"val_{name}", [])
    elif names != trainer._metric_names:
        raise TrainerCodeError(
            f"evaluation after update {step}: metrics are {list(names)}, earlier evaluations "
            f"recorded {list(trainer._metric_names)} (metrics() must name the same metrics every time)"
        )
    history["val_step"].append(float(step))
    history["val_loss"].append(metrics["loss"])
    for name in names:
        history[f"val_{name}"].append(metrics[name])
