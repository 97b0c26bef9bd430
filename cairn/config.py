"""The trainer configuration: one pydantic model, plain JSON on disk.

Every field that changes the arithmetic lives here, so a checkpoint that carries its
config carries everything needed to continue bit for bit. Unknown fields are refused
(a typo must not silently fall back to a default).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from cairn.errors import ConfigError

__all__ = [
    "ModelConfig",
    "DatasetConfig",
    "OptimizerConfig",
    "TrainConfig",
    "load_config",
    "parse_config",
    "config_error_from",
]

PositiveInt = Annotated[int, Field(gt=0)]
NonNegFloat = Annotated[float, Field(ge=0.0)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(_Strict):
    """A one-hidden-layer tanh MLP with a softmax head (``hidden=0``: softmax regression)."""

    kind: Literal["mlp"] = "mlp"
    hidden: Annotated[int, Field(ge=0, le=65536)] = 32
    init_scale: Annotated[float, Field(gt=0.0)] = 1.0
    version: str = "mlp-v1"


class DatasetConfig(_Strict):
    """Where examples come from: generated from a seed, or a user's ``.npy``/``.npz`` file.

    A file dataset is an ``.npz`` with arrays ``x`` (float, N x D) and ``y`` (int, N), or an
    ``.npy`` of shape N x (D + 1) whose last column is the integer label.
    """

    source: Literal["synthetic", "file"] = "synthetic"
    path: str | None = None
    seed: int = 0
    n_examples: Annotated[int, Field(gt=1, le=10_000_000)] = 512
    n_features: Annotated[int, Field(gt=0, le=65536)] = 8
    n_classes: Annotated[int, Field(gt=1, le=4096)] = 3
    noise: NonNegFloat = 0.5
    version: str = "synthetic-v1"

    @model_validator(mode="after")
    def _path_matches_source(self) -> DatasetConfig:
        if self.source == "file" and not self.path:
            raise ValueError("path is required when source is 'file'")
        if self.source == "synthetic" and self.path:
            raise ValueError("path is only allowed when source is 'file'")
        return self


class OptimizerConfig(_Strict):
    """Adam with bias correction, decoupled weight decay and a warmup + decay schedule."""

    kind: Literal["adam"] = "adam"
    lr: Annotated[float, Field(gt=0.0)] = 0.01
    beta1: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    beta2: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.999
    eps: Annotated[float, Field(gt=0.0)] = 1e-8
    weight_decay: NonNegFloat = 0.0
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    decay: Literal["constant", "linear", "cosine"] = "cosine"
    decay_steps: PositiveInt = 1000
    min_lr_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.1


class TrainConfig(_Strict):
    """Everything that defines a training run's arithmetic."""

    seed: int = 0
    batch_size: Annotated[int, Field(gt=0, le=1_000_000)] = 2
    model: ModelConfig = ModelConfig()
    data: DatasetConfig = DatasetConfig()
    optimizer: OptimizerConfig = OptimizerConfig()
    tokenizer_version: str = "none"
    stage: str = "train"

    def canonical_json(self) -> str:
        """Stable text form: sorted keys, no whitespace. Used in fingerprints."""
        return json.dumps(self.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


def config_error_from(exc: ValidationError, where: str) -> ConfigError:
    """Turn pydantic's report into one line naming the first bad field."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "<root>"
    found = first.get("input")
    return ConfigError(
        f"{where}: {loc}: {first['msg']} (found {json.dumps(found, default=str)[:80]})",
    )


def parse_config(data: object, where: str = "config") -> TrainConfig:
    """Validate a decoded JSON object as a TrainConfig, raising ConfigError."""
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error_from(exc, where) from exc


def load_config(path: str | Path) -> TrainConfig:
    """Read a TrainConfig from a JSON file, raising ConfigError with the file and field."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(f"{path}: config file not found") from exc
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read config ({exc.strerror})") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    return parse_config(data, str(path))
