"""The trainer configuration: one pydantic model, plain JSON on disk.

Every field that changes the arithmetic lives here, so a checkpoint that carries its
config carries everything needed to continue bit for bit. Unknown fields are refused
(a typo must not silently fall back to a default; the error suggests the closest valid name).

Values are refused before anything is allocated or computed when they cannot make sense:

- every float is finite (no NaN/inf), and ``optimizer.lr <= 10``, ``optimizer.eps <= 1``,
  ``optimizer.weight_decay <= 10``, ``model.init_scale <= 1000``, ``data.noise <= 1e6``;
- seeds are integers in ``[0, 2**63)``;
- the model has at most ``MAX_PARAMETERS`` (2**27) parameters: theta, Adam's m and v and a
  gradient are float64 copies of it, so ~4 GiB at the bound (a 65536 x 65536 layer is refused);
- a synthetic dataset has at most ``MAX_DATASET_ELEMENTS`` (2**28, 2 GiB of float64) values
  in ``x`` (10**7 examples x 65536 features is refused);
- a batch's widest activation (``batch_size x max(n_features, hidden, n_classes)``) has at
  most ``MAX_BATCH_ELEMENTS`` (2**26, 512 MiB) values.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_serializer, model_validator

from cairn.config_files import apply_overrides, load_document
from cairn.errors import ConfigError

__all__ = [
    "ModelConfig",
    "DatasetConfig",
    "OptimizerConfig",
    "TrainConfig",
    "TrainerSpec",
    "InitFrom",
    "DistributedConfig",
    "BUILTIN_TRAINER",
    "load_config",
    "parse_config",
    "config_error_from",
    "MAX_PARAMETERS",
    "MAX_DATASET_ELEMENTS",
    "MAX_BATCH_ELEMENTS",
]

MAX_PARAMETERS = 1 << 27
"""Parameter count bound: theta, m, v and a gradient at 1 GiB of float64 each."""
MAX_DATASET_ELEMENTS = 1 << 28
"""Synthetic ``x`` bound: n_examples x n_features values (2 GiB of float64)."""
MAX_BATCH_ELEMENTS = 1 << 26
"""Widest per-batch matrix bound: batch_size x max(n_features, hidden, n_classes) (512 MiB)."""

PositiveInt = Annotated[int, Field(gt=0)]
Seed = Annotated[int, Field(ge=0, lt=1 << 63)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class ModelConfig(_Strict):
    """A one-hidden-layer tanh MLP with a softmax head (``hidden=0``: softmax regression)."""

    kind: Literal["mlp"] = "mlp"
    """The model family: only ``mlp``."""
    hidden: Annotated[int, Field(ge=0, le=65536)] = 32
    """Hidden units of the tanh layer; ``0``: no hidden layer (softmax regression)."""
    init_scale: Annotated[float, Field(gt=0.0, le=1000.0, allow_inf_nan=False)] = 1.0
    """Initial weight matrices are normal with standard deviation ``init_scale / sqrt(fan_in)``; biases start at 0."""
    version: str = "mlp-v1"
    """A label for the model's version, carried into the lineage (``model_version``)."""


class DatasetConfig(_Strict):
    """Where examples come from: generated from a seed, or a user's ``.npy``/``.npz`` file.

    A file dataset is an ``.npz`` with arrays ``x`` (float, N x D) and ``y`` (int, N), or an
    ``.npy`` of shape N x (D + 1) whose last column is the integer label.
    """

    source: Literal["synthetic", "file"] = "synthetic"
    """``synthetic``: Gaussian blobs generated from ``seed``, ``n_examples``, ``n_features``, ``n_classes`` and
    ``noise``; ``file``: the examples in ``path``."""
    path: str | None = None
    """The ``.npz`` or ``.npy`` file (loaded without pickle); required with ``source: file``, refused otherwise."""
    seed: Seed = 0
    """Seeds the synthetic data and the permutation that picks the held-out splits."""
    n_examples: Annotated[int, Field(gt=1, le=10_000_000)] = 512
    """Examples generated (``synthetic``; a file holds its own number)."""
    n_features: Annotated[int, Field(gt=0, le=65536)] = 8
    """Features per example; a file's ``x`` must have exactly this many columns."""
    n_classes: Annotated[int, Field(gt=1, le=4096)] = 3
    """Classes; a file's labels must lie in ``[0, n_classes)``."""
    noise: Annotated[float, Field(ge=0.0, le=1e6, allow_inf_nan=False)] = 0.5
    """Standard deviation of the Gaussian noise around each class centre (``synthetic``)."""
    version: str = "synthetic-v1"
    """A label for the dataset's version, carried into the lineage (``dataset_version``)."""
    sampling: Literal["replacement", "epoch"] = "replacement"
    """``replacement``: each batch draws indices from the training RNG (the v1 behaviour);
    ``epoch``: a seeded permutation per epoch, without replacement (``cairn.sampler``)."""
    val_fraction: Annotated[float, Field(ge=0.0, lt=0.5, allow_inf_nan=False)] = 0.0
    """Share of the examples held out for validation (evaluated at every epoch end)."""
    test_fraction: Annotated[float, Field(ge=0.0, lt=0.5, allow_inf_nan=False)] = 0.0
    """Share held out as the final test split (``cairn eval --split test``; exposures are counted)."""

    @model_validator(mode="after")
    def _path_matches_source(self) -> DatasetConfig:
        if self.source == "file" and not self.path:
            raise ValueError("path is required when source is 'file'")
        if self.source == "synthetic" and self.path:
            raise ValueError("path is only allowed when source is 'file'")
        elements = self.n_examples * self.n_features
        if self.source == "synthetic" and elements > MAX_DATASET_ELEMENTS:
            raise ValueError(
                "synthetic dataset too large: n_examples x n_features = "
                f"{self.n_examples} x {self.n_features} values ({elements * 8 / 2**30:.1f} GiB of float64) "
                f"(expected <= {MAX_DATASET_ELEMENTS}, found {elements})"
            )
        return self


class OptimizerConfig(_Strict):
    """Adam with bias correction, decoupled weight decay and a warmup + decay schedule."""

    kind: Literal["adam"] = "adam"
    """The optimizer: only ``adam``."""
    lr: Annotated[float, Field(gt=0.0, le=10.0, allow_inf_nan=False)] = 0.01
    """Peak learning rate: reached at the end of warmup, then decayed by ``decay``."""
    beta1: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)] = 0.9
    """Decay rate of Adam's first-moment (mean) estimate."""
    beta2: Annotated[float, Field(ge=0.0, lt=1.0, allow_inf_nan=False)] = 0.999
    """Decay rate of Adam's second-moment (uncentred variance) estimate."""
    eps: Annotated[float, Field(gt=0.0, le=1.0, allow_inf_nan=False)] = 1e-8
    """Added to the denominator of Adam's update for numerical stability."""
    weight_decay: Annotated[float, Field(ge=0.0, le=10.0, allow_inf_nan=False)] = 0.0
    """Decoupled weight decay: ``weight_decay x theta`` is added to every parameter's Adam update (then scaled
    by the learning rate)."""
    warmup_steps: Annotated[int, Field(ge=0)] = 0
    """Updates of linear warmup from 0 to ``lr``; ``0``: none."""
    decay: Literal["constant", "linear", "cosine"] = "cosine"
    """The schedule after warmup: ``constant`` keeps ``lr``; ``linear``, ``cosine``: down to ``min_lr_ratio x lr``."""
    decay_steps: PositiveInt = 1000
    """Updates after warmup over which the rate decays; it stays at the floor after them."""
    min_lr_ratio: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.1
    """The floor of the decay, as a fraction of ``lr``."""


class DistributedConfig(_Strict):
    """Data-parallel arithmetic that does not depend on the number of ranks (``cairn.distributed``).

    Each update's batch is split into ``microbatches`` equal microbatches (a power of two that
    divides ``batch_size``); their gradients are summed in one fixed binary-tree order over the
    microbatch index, whichever rank computed them, so every world size that divides
    ``microbatches`` gives the same bits. ``block_bytes`` is the checkpoint block size (format
    v2): a property of the run, never of the world size, so checkpoints of the same state saved
    by any number of ranks are identical. The world size itself is not part of the config.
    """

    microbatches: Annotated[int, Field(ge=1, le=1024)] = 1
    """Equal microbatches per update: a power of two dividing ``batch_size``, and a multiple of the world size."""
    block_bytes: Annotated[int, Field(ge=64, le=1 << 30)] = 1 << 20
    """Checkpoint block size in bytes (a multiple of 8), the same whatever the world size."""
    strategy: Literal["replicated", "fsdp"] = "replicated"
    """``replicated`` (the whole state on every rank) or ``fsdp`` (PyTorch adapter, sharded by FSDP2)."""
    param_dtype: Literal["bfloat16"] | None = None
    """``fsdp`` only: the dtype FSDP2 computes in (gradients reduced in float32); None: the model's."""

    @model_serializer(mode="wrap")
    def _omit_defaults_added_later(self, handler: Any) -> Any:
        """Left out at their defaults: a replicated run's config hashes as before FSDP existed."""
        body = handler(self)
        for name, default in (("strategy", "replicated"), ("param_dtype", None)):
            if body.get(name, default) == default:
                body.pop(name, None)
        return body

    @model_validator(mode="after")
    def _power_of_two(self) -> DistributedConfig:
        m = self.microbatches
        if m & (m - 1):
            raise ValueError(f"microbatches must be a power of two (expected 1, 2, 4, 8, ..., found {m})")
        if self.block_bytes % 8:
            raise ValueError(f"block_bytes must be a multiple of 8 (found {self.block_bytes})")
        if self.param_dtype is not None and self.strategy != "fsdp":
            raise ValueError(f"param_dtype is an fsdp setting (strategy is {self.strategy!r})")
        return self


MLP_SECTIONS = ("model", "data", "optimizer")
"""Config sections of the built-in MLP; another trainer takes its settings in ``trainer.options``."""
TRAINER_PATH = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
BUILTIN_TRAINER = "cairn.trainers.mlp:MLPTrainer"


class TrainerSpec(_Strict):
    """Which trainer runs the arithmetic, by import path, and its own config section.

    ``options`` is validated by the trainer's own pydantic model when the trainer is loaded.
    """

    factory: Annotated[str, Field(pattern=TRAINER_PATH, max_length=256)]
    """``package.module:Factory`` (a ``cairn.trainers.Trainer`` subclass or a function returning one)."""
    options: dict[str, Any] = Field(default_factory=dict)
    """The trainer's own settings, validated by its ``Options`` model (``cairn schema config --trainer FACTORY``)."""


class InitFrom(_Strict):
    """Start a new stage from existing weights: weights only, not a resume. Exactly one source:

    - ``checkpoint``: another run's checkpoint. The new run's config may differ from the
      reference's only in ``may_change`` (top-level config fields; ``stage`` and ``init_from``
      itself always may). The reference's fingerprint is recorded in the lineage.
    - ``safetensors``: a safetensors file or a Hugging Face directory (``save_pretrained``'s
      layout, sharded or not) holding exactly the model's weights under their ``state_dict``
      names. Its content hash is recorded in the lineage; ``may_change`` does not apply.
    - ``dcp``: a PyTorch Distributed Checkpoint directory, the model's weights under ``model.`` or
      at the top level (TorchTitan); weights only, as ``safetensors`` (its optimizer state unread).
    """

    checkpoint: Annotated[str, Field(min_length=1, max_length=2048)] | None = None
    """Another run's checkpoint, ``STORE/RUN_ID/KIND/STEP`` (e.g. ``runs/demo/training/000000000040``)."""
    safetensors: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    """A safetensors file or a Hugging Face directory holding exactly the model's weights."""
    dcp: Annotated[str, Field(min_length=1, max_length=4096)] | None = None
    """A PyTorch Distributed Checkpoint directory holding the model's weights (its optimizer state is not read)."""
    may_change: list[Literal["seed", "batch_size", "data", "optimizer", "trainer", "tokenizer_version"]] = [
        "optimizer",
        "data",
    ]
    """Top-level config fields the new stage may change from the ``checkpoint``'s config (``stage`` and
    ``init_from`` always may); unused with ``safetensors`` and ``dcp``."""

    @model_validator(mode="after")
    def _one_source(self) -> InitFrom:
        if [self.checkpoint, self.safetensors, self.dcp].count(None) != 2:
            raise ValueError("init_from needs exactly one of checkpoint, safetensors or dcp")
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_source(self, handler: Any) -> Any:
        """Unset sources are left out: an ``init_from`` dumps (and hashes) as before they existed."""
        body = handler(self)
        for name in ("checkpoint", "safetensors", "dcp"):
            if body.get(name) is None:
                body.pop(name, None)
        return body


class TrainConfig(_Strict):
    """Everything that defines a training run's arithmetic.

    Resuming with a different ``trainer``, ``seed``, ``batch_size``, ``model``, ``data``,
    ``tokenizer_version``, ``init_from`` or ``distributed`` is refused; ``optimizer`` and ``stage`` may change.
    """

    seed: Seed = 0
    """Seeds the initial weights and the training RNG (PCG64)."""
    batch_size: Annotated[int, Field(gt=0, le=1_000_000)] = 2
    """Examples drawn per update; the data cursor advances by this much per step."""
    model: ModelConfig = ModelConfig()
    """The built-in MLP's model (another trainer takes its settings in ``trainer.options``)."""
    data: DatasetConfig = DatasetConfig()
    """The built-in MLP's dataset and its held-out splits."""
    optimizer: OptimizerConfig = OptimizerConfig()
    """The built-in MLP's optimizer and learning-rate schedule."""
    tokenizer_version: str = "none"
    """A label for the tokenizer's version, carried into the lineage."""
    stage: str = "train"
    """The stage's name (``train``, ``finetune``, ...), carried into the lineage as its stage contract."""
    trainer: TrainerSpec | None = None
    """The trainer and its options; null: the built-in numpy MLP (``cairn.trainers.mlp:MLPTrainer``)."""
    init_from: InitFrom | None = None
    """Start a new stage from existing weights; null: from the seeded random initialisation."""
    distributed: DistributedConfig | None = None
    """Data-parallel training over any world size dividing ``microbatches``; null: a single process."""

    @property
    def trainer_path(self) -> str:
        return self.trainer.factory if self.trainer is not None else BUILTIN_TRAINER

    @property
    def builtin_trainer(self) -> bool:
        return self.trainer_path == BUILTIN_TRAINER

    @model_validator(mode="after")
    def _mlp_sections_only_for_the_mlp(self) -> TrainConfig:
        if self.builtin_trainer:
            return self
        for name in MLP_SECTIONS:
            if getattr(self, name) != type(getattr(self, name))():
                raise ValueError(
                    f"'{name}' configures the built-in MLP; trainer {self.trainer_path!r} takes its settings "
                    f"in trainer.options (found a '{name}' section)"
                )
        return self

    @model_validator(mode="after")
    def _microbatches_divide_the_batch(self) -> TrainConfig:
        m = self.distributed.microbatches if self.distributed is not None else 1
        if self.batch_size % m:
            raise ValueError(
                f"distributed.microbatches must divide batch_size (expected a divisor of {self.batch_size}, found {m})"
            )
        return self

    @model_validator(mode="after")
    def _fits_in_memory(self) -> TrainConfig:
        d, h, c = self.data.n_features, self.model.hidden, self.data.n_classes
        params = d * c + c if h == 0 else d * h + h + h * c + c
        if params > MAX_PARAMETERS:
            raise ValueError(
                "model too large: data.n_features x model.hidden + model.hidden x data.n_classes (+ biases) = "
                f"{params} parameters; theta, m and v alone would need {3 * params * 8 / 2**30:.1f} GiB "
                f"(expected <= {MAX_PARAMETERS}, found {params})"
            )
        widest = self.batch_size * max(d, h, c)
        if widest > MAX_BATCH_ELEMENTS:
            raise ValueError(
                f"batch too large: batch_size x max(n_features, hidden, n_classes) = {widest} values per "
                f"activation matrix (expected <= {MAX_BATCH_ELEMENTS}, found {widest})"
            )
        return self

    def to_json(self) -> dict[str, Any]:
        """The config as it is stored in checkpoints and hashed into run ids and fingerprints.

        Fields added after format v1 are left out while they hold their default, so a v1
        config keeps its identity (run id, fingerprint) and v1 checkpoints read unchanged.
        """
        body = self.model_dump(mode="json")
        if not self.builtin_trainer:
            for name in MLP_SECTIONS:  # at their defaults (checked), and meaningless to this trainer
                body.pop(name)
        for path, default in _V1_OMITTED_AT_DEFAULT:
            *parents, leaf = path
            node = body
            for part in parents:
                node = node.get(part, {})
            if node.get(leaf, default) == default:
                node.pop(leaf, None)
        return body

    def canonical_json(self) -> str:
        """Stable text form: sorted keys, no whitespace. Used in fingerprints."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))


_V1_OMITTED_AT_DEFAULT: tuple[tuple[tuple[str, ...], object], ...] = (
    (("trainer",), None),
    (("init_from",), None),
    (("distributed",), None),
    (("data", "sampling"), "replacement"),
    (("data", "val_fraction"), 0.0),
    (("data", "test_fraction"), 0.0),
)


def _models_in(annotation: object) -> list[type[BaseModel]]:
    """The pydantic models an annotation holds (``X``, ``X | None``, ``list[X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in get_args(annotation) for m in _models_in(arg)]


def _field_names_at(model: object, loc: tuple[int | str, ...]) -> list[str]:
    """Valid field names of the model(s) found by walking ``model``'s fields along ``loc``."""
    models = _models_in(model)
    for part in loc:
        if isinstance(part, str):
            matched = [m.model_fields[part] for m in models if part in m.model_fields]
            if matched:
                models = [x for f in matched for x in _models_in(f.annotation)]
                continue
        # A list index, a dict key or a union member's tag: still at the same models.
    return sorted({name for m in models for name in m.model_fields})


def _suggestion(model: object, loc: tuple[int | str, ...]) -> str | None:
    if not loc or not isinstance(loc[-1], str):
        return None
    close = difflib.get_close_matches(loc[-1], _field_names_at(model, loc[:-1]), n=1, cutoff=0.6)
    return close[0] if close else None


def config_error_from(exc: ValidationError, where: str, model: object = None) -> ConfigError:
    """Turn pydantic's report into one line naming the first bad field.

    ``<where>: <loc>: <msg> (found <value>)``. ``model`` is the model class (or type hint)
    that was validated; with it, an unknown field gets the closest valid name at its location
    (``checkpoint.evry: Extra inputs are not permitted — did you mean 'every'?``), and a
    required field reported missing because it was misspelled is reported as the misspelling.
    """
    errors = exc.errors()
    first = errors[0]
    if model is not None and first["type"] == "missing":
        for other in errors:
            other_loc = tuple(other["loc"])
            if (
                other["type"] == "extra_forbidden"
                and other_loc[:-1] == first["loc"][:-1]
                and _suggestion(model, other_loc) == first["loc"][-1]
            ):
                first = other
                break
    loc_parts = tuple(first["loc"])
    loc = ".".join(str(p) for p in loc_parts)
    found = first.get("input")
    if first["type"] == "value_error" and "error" in first.get("ctx", {}):
        msg = str(first["ctx"]["error"])  # our own validators' messages, without "Value error, "
        detail = "" if isinstance(found, dict | list) else f" (found {json.dumps(found, default=str)[:80]})"
    else:
        msg = first["msg"]
        detail = f" (found {json.dumps(found, default=str)[:80]})"
    if first["type"] == "extra_forbidden" and model is not None:
        suggestion = _suggestion(model, loc_parts)
        if suggestion is not None:
            msg = f"{msg} — did you mean {suggestion!r}?"
    error = ConfigError(f"{where}: {loc}: {msg}{detail}" if loc else f"{where}: {msg}{detail}")
    error.field, error.found = loc or None, found
    return error


def parse_config(data: object, where: str = "config") -> TrainConfig:
    """Validate a decoded JSON object as a TrainConfig, raising ConfigError."""
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        raise config_error_from(exc, where, TrainConfig) from exc


def load_config(path: str | Path, sets: Sequence[str] = ()) -> TrainConfig:
    """Read a TrainConfig from a JSON, YAML or TOML file (by extension), with ``sets``
    (``a.b.c=VALUE``) applied, raising ConfigError with the file, line and field.

    A JSON file must be a regular file of at most 16 MiB of UTF-8 JSON, nested at most 64 deep
    (see ``cairn.jsonio``; YAML and TOML: ``cairn.config_files``); anything else is refused
    before it is parsed.
    """
    doc = load_document(path, what="config file")
    data = apply_overrides(doc.data, sets, TrainConfig)
    doc = doc.with_sets(sets)
    try:
        return TrainConfig.model_validate(data)
    except ValidationError as exc:
        error = config_error_from(exc, str(path), TrainConfig)
        raise config_error_from(exc, doc.where(error.field), TrainConfig) from exc
