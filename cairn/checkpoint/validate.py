"""Checks of a training checkpoint against what its model declares, before a byte of its tensors
is read: the tensor set (names, dtypes, shapes: ``TensorSpec``), the history's lengths, and the
bounds the checkpoint is read under, sized by the declared elements. Given the specs and the
history's expected lengths, never a trainer: ``cairn.trainers.validate`` asks the run's trainer
for them and adds what only a trainer knows (config, lineage, invariants).

Format-level rules (size bounds, format version, kind, schema, layout, checksums, signature,
fingerprint) live in ``cairn.checkpoint.reader``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

import numpy as np
from pydantic import ValidationError

from cairn.checkpoint.blocks import logical_specs
from cairn.checkpoint.history import check_history_ref
from cairn.checkpoint.manifest import HistoryRef, Manifest
from cairn.checkpoint.options import Limits
from cairn.checkpoint.tensors import TensorSpec, dtype_tag
from cairn.checkpoint.training import history_name, is_history
from cairn.config import TrainConfig, config_error_from
from cairn.errors import InvariantError, ManifestError, SizeLimitError, TensorSpecError
from cairn.state import HISTORY_KEYS

__all__ = [
    "WIDEST_ITEMSIZE",
    "history_specs",
    "declared_bounds",
    "check_declared_size",
    "check_tensor_specs",
    "check_history_lengths",
    "manifest_config",
]

F8 = dtype_tag(np.float64)
WIDEST_ITEMSIZE = 8
"""Bytes per element of the widest dtype a checkpoint may hold (``ALLOWED_DTYPES``)."""


def _history_rule(key: str) -> str:
    return "len(history) must equal step" if key in HISTORY_KEYS else "one value per evaluation"


def history_specs(history: Mapping[str, int]) -> dict[str, TensorSpec]:
    """The ``history/KEY`` tensors of a checkpoint that holds its history as tensors (no segments)."""
    return {history_name(k): TensorSpec(F8, (n,)) for k, n in history.items()}


def declared_bounds(specs: Mapping[str, TensorSpec], ceiling: Limits, *, block: int, sized_by: str) -> Limits:
    """The bounds a checkpoint holding exactly ``specs`` is read under (never above the
    ``ceiling``): at most as many bytes as the declared elements take in the widest dtype a
    checkpoint may hold (8 bytes), and at most as many blocks as they make in ``block``-byte
    blocks. Python integers: a manifest that claims more is refused before anything is
    allocated, and one declared at 2 TB is read."""
    per_block = max(1, block // WIDEST_ITEMSIZE)
    elements = {name: math.prod(spec.shape) for name, spec in specs.items()}
    blocks = sum(max(1, -(-n // per_block)) for n in elements.values())
    return replace(
        ceiling,
        max_total_bytes=min(ceiling.max_total_bytes, WIDEST_ITEMSIZE * sum(elements.values())),
        max_blocks=min(ceiling.max_blocks, blocks),
        sized_by=sized_by,
    )


def check_declared_size(manifest: Manifest, bounds: Limits) -> None:
    """The manifest's total size within the declared bounds (``read_manifest``'s, if it was not
    given them)."""
    if manifest.total_bytes > bounds.max_total_bytes:
        raise SizeLimitError(
            field="total_bytes",
            expected=f"<= {bounds.max_total_bytes} ({bounds.sized_by})",
            found=manifest.total_bytes,
        )


def check_tensor_specs(manifest: Manifest, specs: Mapping[str, TensorSpec]) -> None:
    """Exactly the tensors ``specs`` names, each of its dtype and shape (a history tensor of
    another length breaks an invariant: one value per step, or per evaluation)."""
    have = logical_specs(manifest)
    missing = sorted(set(specs) - set(have))
    if missing:
        raise TensorSpecError("missing tensors", field="tensors", expected=missing, found=sorted(have)[:20])
    extra = sorted(set(have) - set(specs))
    if extra:
        raise TensorSpecError("unexpected tensors", field="tensors", expected=sorted(specs)[:20], found=extra)
    for name, spec in specs.items():
        got_dtype, got_shape = have[name]
        if got_dtype != spec.dtype:
            raise TensorSpecError(field=f"tensors[{name}].dtype", expected=spec.dtype, found=got_dtype)
        if got_shape != spec.shape and is_history(name):
            raise InvariantError(
                _history_rule(name[8:]),
                field=f"tensors[{name}].shape",
                expected=list(spec.shape),
                found=list(got_shape),
            )
        if got_shape != spec.shape:
            raise TensorSpecError(field=f"tensors[{name}].shape", expected=list(spec.shape), found=list(got_shape))


def check_history_lengths(ref: HistoryRef, want: Mapping[str, int]) -> None:
    """Exactly the expected history keys, each of its expected length, tiled by its segments."""
    missing, extra = sorted(set(want) - set(ref.series)), sorted(set(ref.series) - set(want))
    if missing or extra:
        raise TensorSpecError(
            "missing history" if missing else "unexpected history",
            field="history.series",
            expected=sorted(want),
            found=sorted(ref.series),
        )
    for name, n in want.items():
        if ref.series[name].length != n:
            raise InvariantError(
                _history_rule(name),
                field=f"history.series[{name}].length",
                expected=n,
                found=ref.series[name].length,
            )
    check_history_ref(ref)


def manifest_config(manifest: Manifest) -> TrainConfig:
    """The checkpoint's own config, parsed (no trainer is imported)."""
    if manifest.config is None:
        raise ManifestError(field="config", expected="the full trainer config", found=None)
    try:
        return TrainConfig.model_validate(manifest.config)
    except ValidationError as exc:
        raise ManifestError(str(config_error_from(exc, "manifest config", TrainConfig))) from exc
