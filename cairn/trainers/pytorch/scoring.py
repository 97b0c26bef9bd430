"""How one batch's output is scored against its targets by default: the loss (cross-entropy over
the last axis) and the metrics (accuracy) for classification ``N x C`` and sequences
``B x T x V``; targets equal to ``IGNORE_INDEX`` are not scored."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional

__all__ = ["IGNORE_INDEX", "default_loss", "default_metrics", "scored"]

IGNORE_INDEX = -100
"""Targets equal to this are not scored (``cross_entropy``'s default ``ignore_index``)."""


def scored(output: Any, target: Any) -> bool:
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
    if output.ndim > 2 and scored(output, target):
        return functional.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))
    return functional.cross_entropy(output, target)


def default_metrics(output: Any, target: Any) -> dict[str, tuple[float, float]]:
    """``{name: (total, count)}`` for one batch: the accuracy of the last axis' argmax for
    classification and sequence outputs (targets equal to ``IGNORE_INDEX`` not counted)."""
    if not scored(output, target):
        return {}
    mask = target != IGNORE_INDEX
    correct = ((output.argmax(dim=-1) == target) & mask).sum()
    return {"accuracy": (float(correct), float(mask.sum()))}
