"""Epochs with an exact cursor: a seeded permutation per epoch, drawn without replacement.

Epoch ``e`` visits the training examples in the order ``permutation(seed, e)``; update number
``t`` (0-based) takes batch ``t mod steps_per_epoch`` of epoch ``t div steps_per_epoch``. The
last partial batch of an epoch is dropped, so every batch has ``batch_size`` examples and an
epoch is exactly ``steps_per_epoch`` updates. The cursor ``(epoch, position)`` is therefore a
function of the step, and resuming at any step — mid-epoch included — draws exactly the
batches the uninterrupted run would: the permutation is recomputed from ``(seed, epoch)``,
never carried in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cairn.errors import ConfigError, InvariantError

__all__ = ["DataCursor", "EpochSampler"]

_SAMPLER_DOMAIN = 0x5A3E  # keeps the permutation streams apart from the trainer's other seeds


@dataclass(frozen=True)
class DataCursor:
    """Where the data stream stands: ``position`` batches into ``epoch``."""

    epoch: int
    position: int

    def to_json(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}


class EpochSampler:
    """Batches of indices into ``n_examples`` training examples, epoch by epoch."""

    def __init__(self, n_examples: int, batch_size: int, seed: int) -> None:
        if batch_size > n_examples:
            raise ConfigError("batch_size", expected=f"<= the training split's {n_examples} examples", found=batch_size)
        self.n_examples = n_examples
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch = n_examples // batch_size
        self._cached: tuple[int, np.ndarray] | None = None

    def permutation(self, epoch: int) -> np.ndarray:
        """The visiting order of epoch ``epoch``: a pure function of (seed, epoch)."""
        if self._cached is None or self._cached[0] != epoch:
            seq = np.random.SeedSequence([self.seed, epoch, _SAMPLER_DOMAIN])
            order = np.random.Generator(np.random.PCG64(seq)).permutation(self.n_examples)
            self._cached = (epoch, order)
        return self._cached[1]

    def cursor(self, step: int) -> DataCursor:
        """The cursor after ``step`` updates."""
        epoch, position = divmod(step, self.steps_per_epoch)
        return DataCursor(epoch, position)

    def batch(self, step: int) -> np.ndarray:
        """Example indices of update number ``step + 1`` (the batch drawn after ``step`` updates)."""
        cur = self.cursor(step)
        start = cur.position * self.batch_size
        return self.permutation(cur.epoch)[start : start + self.batch_size]

    def check_cursor(self, step: int, found: object) -> None:
        """Refuse a recorded cursor that is not the one ``step`` implies."""
        want = self.cursor(step).to_json() | {"steps_per_epoch": self.steps_per_epoch}
        if found != want:
            raise InvariantError(
                "data cursor must match the step (epoch, position within it)",
                field="meta.data",
                expected=want,
                found=found,
            )

    def cursor_json(self, step: int) -> dict[str, int]:
        return self.cursor(step).to_json() | {"steps_per_epoch": self.steps_per_epoch}
