"""What crosses the process boundary between a gang's supervisor and its ranks, typed: the job
(``job.json``, written once by the supervisor) and a rank's result (``result.json``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_serializer

from cairn.checkpoint.compression import CompressionChoice
from cairn.config import TrainConfig, config_error_from
from cairn.distributed.reduce import ReductionOrder
from cairn.jsonio import load_json_file
from cairn.runs.outcome import SegmentOutcome

__all__ = ["GangJob", "RankResult"]


class _Boundary(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def write(self, path: Path) -> None:
        path.write_text(self.model_dump_json())

    @classmethod
    def read(cls, path: Path, what: str) -> Any:
        data = load_json_file(path, what=what)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            raise config_error_from(exc, what, cls) from None


class GangJob(_Boundary):
    """One segment of a data-parallel run, for every rank of the gang."""

    run_id: str
    store: str
    """The store's URL, as every node opens it."""
    config: TrainConfig
    target_step: int = Field(ge=0)
    checkpoint_every: int = Field(ge=1)
    resume_from: str | None = None
    """A checkpoint to restore instead of the run's latest committed one."""
    config_from_checkpoint: bool = False
    """``config`` came from an untrusted checkpoint: its trainer is imported only if trusted."""
    tolerate_numerics: bool = False
    """Resume a bit-exact state computed under another numerics profile (``--tolerance``)."""
    throttle_seconds_per_step: float = Field(default=0.0, ge=0)
    incremental: bool | None = None
    """Incremental saves (``CheckpointOptions.incremental``); None: the ranks' ``CAIRN_INCREMENTAL``."""
    compression: Literal["off", "zstd", "auto"] | None = None
    """``CheckpointOptions.compression``; None: the ranks' ``CAIRN_COMPRESSION``."""
    collective_timeout_seconds: float = Field(default=120.0, gt=0)
    reduction: ReductionOrder = "tree"
    """How microbatch sums are ordered: the canonical tree; ``rank-order`` is the naive left fold
    (its bits depend on the world size; it exists to show that the tree matters)."""

    @field_serializer("config")
    def _config_as_stored(self, config: TrainConfig) -> dict[str, Any]:
        return config.to_json()


class RankResult(_Boundary, SegmentOutcome):
    """How a segment ended, the same on every rank (local rank 0 writes it)."""

    interrupted: bool = False
    world_size: int
    reduction: ReductionOrder = "tree"
    compression: CompressionChoice | None = None
    """This rank's latest compression decision (each rank decides for its own shards)."""
