"""The run input's experiment trackers (``TrainingRunInput.trackers``) and the input and result
of the ``export_trackers`` activity (``activities.trackers``)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator

from activities.effect_models import Model
from cairn.checkpoint import RUN_ID_PATTERN
from cairn.trackers import tracking_uri_problem

__all__ = ["TensorBoardSpec", "MLflowSpec", "WandbSpec", "TrackerSpec", "TrackInput", "TrackResult", "MAX_TRACKERS"]

MAX_TRACKERS = 8


def _absolute(value: str) -> str:
    if not value.startswith("/"):
        raise ValueError(f"expected an absolute directory every worker sees, found {value!r}")
    return value


class TensorBoardSpec(Model):
    """TensorBoard event files, one run directory per Cairn run (``LOG_DIR/RUN``)."""

    kind: Literal["tensorboard"]
    log_dir: str
    """An absolute directory every worker sees (``tensorboard --logdir LOG_DIR``)."""

    @field_validator("log_dir")
    @classmethod
    def _log_dir_is_absolute(cls, value: str) -> str:
        return _absolute(value)


class MLflowSpec(Model):
    """An MLflow run per Cairn run (tagged ``cairn.run_id``) in ``experiment``."""

    kind: Literal["mlflow"]
    tracking_uri: str
    """``file:/ABSOLUTE/DIR`` (a local file store every worker sees) or ``http(s)://`` (a tracking server)."""
    experiment: Annotated[str, Field(min_length=1, max_length=256)] = "cairn"
    """The MLflow experiment (created if absent)."""
    run_name: Annotated[str, Field(min_length=1, max_length=256)] | None = None
    """The MLflow run's name; null: the run id."""

    @field_validator("tracking_uri")
    @classmethod
    def _tracking_uri(cls, value: str) -> str:
        problem = tracking_uri_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class WandbSpec(Model):
    """A Weights & Biases run per Cairn run (its id derived from the run id), resumed by every write."""

    kind: Literal["wandb"]
    project: Annotated[str, Field(min_length=1, max_length=128)]
    """The W&B project."""
    dir: str
    """An absolute directory every worker sees: W&B's files (offline runs: ``DIR/wandb/offline-run-*``)."""
    mode: Literal["offline", "online"] = "offline"
    """``offline``: files only, uploaded later with ``wandb sync``; ``online``: to the W&B server (untested here)."""
    entity: str | None = None
    """The W&B entity (team or user); null: the default."""

    @field_validator("dir")
    @classmethod
    def _dir_is_absolute(cls, value: str) -> str:
        return _absolute(value)


TrackerSpec = Annotated[TensorBoardSpec | MLflowSpec | WandbSpec, Field(discriminator="kind")]
"""One experiment tracker of a run, by ``kind``."""


class TrackInput(Model):
    run_id: Annotated[str, Field(pattern=RUN_ID_PATTERN, max_length=128)]
    store: str
    store_id: str | None = None
    trackers: list[TrackerSpec]
    final: bool = False
    """The run has ended: trackers may mark their run finished."""


class TrackResult(Model):
    committed_step: int = 0
    confirmed: dict[str, int] = Field(default_factory=dict)
    """Per sink (``cairn.trackers.sink_id``): the step through which it holds every committed point."""
    points: int = 0
    """Values written by this export, all sinks together."""
