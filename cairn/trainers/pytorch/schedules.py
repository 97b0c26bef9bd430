"""Learning-rate schedules the shipped models share, as ``LambdaLR`` factors."""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["warmup_cosine"]


def warmup_cosine(warmup: int, decay_steps: int, floor: float = 0.1) -> Callable[[int], float]:
    """Linear warmup over ``warmup`` updates, then a cosine decay to ``floor`` (a fraction of the
    base rate) over ``decay_steps``, flat after that."""

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / decay_steps)
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor
