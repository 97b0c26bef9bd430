"""One optimizer update in one process: the loss hook, backward (scaled when a ``GradScaler``
is on), then ``apply_update``: unscale, the after-backward hook, clipping, the optimizer step.
The data-parallel update (``data_parallel.microbatched_update``) ends in the same
``apply_update``, so clipping sees the gradient every world size computes bit for bit."""

from __future__ import annotations

import warnings
from typing import Any

import torch

from cairn.trainers.pytorch.device import place
from cairn.trainers.pytorch.parts import TorchParts
from cairn.trainers.pytorch.streams import Stream

__all__ = ["apply_update", "backward", "solo_update", "step_scheduler", "whole_batch"]


def backward(trainer: TorchParts, loss: torch.Tensor) -> None:
    if trainer.scaler is not None:
        trainer.scaler.scale(loss).backward()  # type: ignore[no-untyped-call]
    else:
        loss.backward()  # type: ignore[no-untyped-call]


def apply_update(trainer: TorchParts, step: int) -> float:
    """The gradients are final (summed over micro-steps and ranks): unscale them (loss scaling),
    call ``after_backward``, clip (value, then norm), step; returns the learning rate used."""
    optimizer, options = trainer.optimizer, trainer.options
    if trainer.scaler is not None:
        trainer.scaler.unscale_(optimizer)
    trainer.after_backward(step)
    trainable = [p for p in trainer.params.values() if p.requires_grad]
    if options.clip_grad_value is not None:
        torch.nn.utils.clip_grad_value_(trainable, options.clip_grad_value)
    if options.clip_grad_norm is not None:
        torch.nn.utils.clip_grad_norm_(trainable, options.clip_grad_norm)
    lr = float(optimizer.param_groups[0]["lr"])
    if trainer.scaler is not None:
        trainer.scaler.step(optimizer)
        trainer.scaler.update()
    else:
        optimizer.step()
    return lr


def whole_batch(trainer: TorchParts, step: int) -> tuple[Any, Any]:
    """The whole batch of update ``step + 1``, on the trainer's device: the sampler's, or the
    training stream's next."""
    train = trainer.splits["train"]
    if isinstance(train, Stream):
        return place(train.next_batch(), trainer.device)
    return place(train.batch(trainer.epoch_sampler.batch(step)), trainer.device)


def solo_update(trainer: TorchParts, step: int) -> tuple[float, float]:
    """Update ``step + 1`` on the whole batch; returns its loss and learning rate."""
    trainer.model.train()
    xb, yb = whole_batch(trainer, step)
    trainer.optimizer.zero_grad(set_to_none=True)
    with trainer.autocast():
        loss = trainer.compute_loss(xb, yb)
    backward(trainer, loss)
    return float(loss.detach()), apply_update(trainer, step)


def step_scheduler(trainer: TorchParts, metric: float | None = None) -> None:
    """The LR scheduler's step (``ReduceLROnPlateau`` on ``metric``). A loss-scaled update that
    skipped its optimizer step makes torch warn that the scheduler stepped first: that is the
    documented behaviour of loss scaling, not the user's mistake."""
    with warnings.catch_warnings():
        if trainer.scaler is not None:
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step\\(\\)` before")
        if metric is None:
            trainer.scheduler.step()
        else:
            trainer.scheduler.step(metric)
