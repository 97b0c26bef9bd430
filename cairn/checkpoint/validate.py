"""Training-state rules: what a training checkpoint must satisfy before it replaces a run's state.

Format-level rules (size bounds, format version, kind, schema, layout, checksums, signature,
fingerprint) live in ``cairn.checkpoint.format``; this module adds what makes the bytes a
*training state* for *this run*:

- config: parses as a TrainConfig and matches the run on every identity field
  (``IDENTITY_FIELDS``: model shapes and version, dataset, seed, batch size, tokenizer);
- lineage: agrees with the checkpoint's own config (model version, tokenizer version, dataset
  version), and its dataset content hash equals the run's dataset;
- tensor set: exactly theta, Adam m and v (shaped like theta), loss/lr history, all float64;
- values: all finite, v >= 0;
- invariants: cursor == step * batch_size, len(history) == step, RNG state well formed.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pydantic import ValidationError

from cairn.checkpoint.manifest import Manifest
from cairn.config import TrainConfig, config_error_from
from cairn.errors import (
    IncompatibleConfigError,
    InvariantError,
    ManifestError,
    NonFiniteError,
    TensorSpecError,
)
from cairn.state import HISTORY_KEYS, param_shapes, rng_state_problem

__all__ = [
    "IDENTITY_FIELDS",
    "expected_tensors",
    "check_training_manifest",
    "check_training_values",
    "check_config_compatible",
]

IDENTITY_FIELDS = ("seed", "batch_size", "model", "data", "tokenizer_version")
F8 = np.dtype("<f8").str


def expected_tensors(config: TrainConfig, step: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Tensor name -> (dtype, shape) that a training checkpoint at ``step`` must hold."""
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for name, shape in param_shapes(config, config.data.n_features).items():
        for group in ("theta", "adam.m", "adam.v"):
            out[f"{group}/{name}"] = (F8, shape)
    for key in HISTORY_KEYS:
        out[f"history/{key}"] = (F8, (step,))
    return out


def _first_difference(a: Any, b: Any, path: str) -> tuple[str, Any, Any] | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            diff = _first_difference(a.get(key), b.get(key), f"{path}.{key}")
            if diff:
                return diff
        return None
    return None if a == b else (path, a, b)


def check_config_compatible(run: TrainConfig, found: TrainConfig) -> None:
    """Refuse a checkpoint whose identity fields differ from the run's config."""
    run_d, found_d = run.model_dump(mode="json"), found.model_dump(mode="json")
    for name in IDENTITY_FIELDS:
        diff = _first_difference(run_d[name], found_d[name], f"config.{name}")
        if diff:
            path, want, got = diff
            raise IncompatibleConfigError(
                "checkpoint belongs to a different run configuration",
                field=path,
                expected=want,
                found=got,
            )


def check_training_manifest(
    manifest: Manifest,
    *,
    run_config: TrainConfig | None = None,
    dataset_hash: str | None = None,
) -> TrainConfig:
    """Metadata rules, checked before any tensor bytes are read. Returns the checkpoint's config."""
    if manifest.config is None:
        raise ManifestError(field="config", expected="the full trainer config", found=None)
    try:
        config = TrainConfig.model_validate(manifest.config)
    except ValidationError as exc:
        raise ManifestError(str(config_error_from(exc, "manifest config", TrainConfig))) from exc
    if run_config is not None:
        check_config_compatible(run_config, config)
    lineage = manifest.lineage
    if lineage is None:
        raise ManifestError(field="lineage", expected="dataset and model versions", found=None)
    if dataset_hash is not None and lineage.dataset_hash != dataset_hash:
        raise IncompatibleConfigError(
            "checkpoint was trained on different data",
            field="lineage.dataset_hash",
            expected=dataset_hash,
            found=lineage.dataset_hash,
        )
    for field, in_config, in_lineage in (
        ("model_version", config.model.version, lineage.model_version),
        ("tokenizer_version", config.tokenizer_version, lineage.tokenizer_version),
        ("dataset_version", config.data.version, lineage.dataset_version),
    ):
        if in_config != in_lineage:
            raise InvariantError(
                "lineage disagrees with the checkpoint's config",
                field=f"lineage.{field}",
                expected=in_config,
                found=in_lineage,
            )
    problem = rng_state_problem(manifest.rng)
    if problem:
        raise InvariantError("RNG state is malformed", field=problem[0], expected=problem[1], found=problem[2])
    if manifest.cursor != manifest.step * config.batch_size:
        raise InvariantError(
            "data cursor must equal step x batch_size",
            field="cursor",
            expected=manifest.step * config.batch_size,
            found=manifest.cursor,
        )
    want = expected_tensors(config, manifest.step)
    have = {t.name: (t.dtype, tuple(t.shape)) for t in manifest.tensors}
    missing = sorted(set(want) - set(have))
    if missing:
        raise TensorSpecError("missing tensors", field="tensors", expected=missing, found=sorted(have))
    extra = sorted(set(have) - set(want))
    if extra:
        raise TensorSpecError("unexpected tensors", field="tensors", expected=sorted(want), found=extra)
    for name, (dtype, shape) in want.items():
        got_dtype, got_shape = have[name]
        if got_dtype != dtype:
            raise TensorSpecError(field=f"tensors[{name}].dtype", expected=dtype, found=got_dtype)
        if got_shape != shape and name.startswith("history/"):
            raise InvariantError(
                "len(history) must equal step",
                field=f"tensors[{name}].shape",
                expected=list(shape),
                found=list(got_shape),
            )
        if got_shape != shape:
            raise TensorSpecError(field=f"tensors[{name}].shape", expected=list(shape), found=list(got_shape))
    return config


def check_training_values(name: str, values: np.ndarray) -> None:
    """Value rules for (a chunk of) one tensor: finite everywhere, Adam's v >= 0."""
    # A sum over values with any NaN/inf is NaN/inf: one cheap pass proves the common case;
    # the exact (allocating) test runs only when the sum is not finite (or overflowed).
    if not np.isfinite(values.sum()) and not np.isfinite(values).all():
        bad = int(values.size - np.count_nonzero(np.isfinite(values)))
        raise NonFiniteError(
            "tensor holds NaN or infinity", field=f"tensors[{name}]", expected="finite", found=f"{bad} non-finite"
        )
    if name.startswith("adam.v/") and values.size and values.min() < 0:
        raise InvariantError(
            "Adam second moment must be >= 0", field=f"tensors[{name}]", expected=">= 0", found=float(values.min())
        )
