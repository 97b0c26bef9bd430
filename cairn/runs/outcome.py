"""How a training segment ended: the fields every runner of a segment reports, stated once.

``SegmentOutcome`` is the common base of the segment activity's result
(``activities.inputs.TrainSegmentResult``) and a gang rank's (``cairn.gang.job.RankResult``):
each inherits these fields and adds its own, so both stay flat JSON. ``SegmentOutcome.of``
reads the state's part (step, cursor, the last loss and evaluation) in one place.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel

from cairn.state import TrainState

__all__ = ["SegmentOutcome"]


class SegmentOutcome(BaseModel):
    step: int
    cursor: int
    checkpoint: str
    fingerprint: str
    loss: float | None
    val_loss: float | None = None
    val_accuracy: float | None = None
    """The latest evaluation on the validation split (at an epoch end), if the trainer has one."""
    resumed_from_step: int

    @classmethod
    def of(cls, state: TrainState, **fields: Any) -> Self:
        """The outcome of a segment that ended at ``state`` (the other fields as given)."""
        return cls(
            step=state.step,
            cursor=state.cursor,
            loss=state.last("loss"),
            val_loss=state.last("val_loss"),
            val_accuracy=state.last("val_accuracy"),
            **fields,
        )
