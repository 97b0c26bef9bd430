"""Bit-for-bit comparison of two training states, field by field."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cairn.checkpoint.tensors import is_floating
from cairn.state import Lineage, TrainState

__all__ = ["FieldDiff", "compare_states", "LINEAGE_COMPARED"]

LINEAGE_COMPARED = tuple(name for name in Lineage.model_fields if name not in ("parent", "numerics"))
"""Lineage fields that are part of a state; ``parent`` and ``numerics`` are provenance (which
checkpoint a run resumed from, which numerics profile computed it): ``ckpt compare`` reports a
difference of profiles beside the state's differences, as the likely cause."""


@dataclass(frozen=True)
class FieldDiff:
    field: str
    detail: str
    max_abs_diff: float | None = None

    def to_json(self) -> dict[str, object]:
        return {"field": self.field, "detail": self.detail, "max_abs_diff": self.max_abs_diff}


_GROUP_NAMES = {"adam.m": "m", "adam.v": "v"}


def _field_name(tensor: str) -> str:
    """``theta/W1`` -> ``theta.W1``, ``adam.m/W1`` -> ``m.W1``, ``param/fc.weight`` -> ``param.fc.weight``."""
    head, _, tail = tensor.partition("/")
    return f"{_GROUP_NAMES.get(head, head)}.{tail}" if tail else head


def _array_diff(name: str, a: np.ndarray, b: np.ndarray, rtol: float = 0.0, atol: float = 0.0) -> FieldDiff | None:
    if a.shape != b.shape or a.dtype != b.dtype:
        return FieldDiff(name, f"shape/dtype {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
    # Compare bit patterns, so -0.0 vs 0.0 and NaN payloads count as differences too.
    if a.tobytes() == b.tobytes():
        return None
    exact = not (is_floating(a.dtype) or a.dtype.kind == "c")
    fa, fb = (a, b) if exact else (a.astype(np.float64), b.astype(np.float64))
    diff = float(np.max(np.abs(fa.astype(np.float64) - fb.astype(np.float64)))) if a.size else 0.0
    if (rtol or atol) and not exact and np.allclose(fa, fb, rtol=rtol, atol=atol, equal_nan=False):
        return None
    bits_a = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, -1)
    bits_b = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, -1)
    n = int(np.count_nonzero(np.any(bits_a != bits_b, axis=1)))
    within = f" (beyond rtol={rtol:g}, atol={atol:g})" if (rtol or atol) and not exact else ""
    return FieldDiff(name, f"{n} of {a.size} elements differ{within}", diff)


def compare_states(a: TrainState, b: TrainState, *, rtol: float = 0.0, atol: float = 0.0) -> list[FieldDiff]:
    """Every state field: every tensor (theta, optimizer moments, buffers, RNG tensors), t,
    RNG, cursor, trainer state (``meta``), history, config and lineage (except its ``parent``).
    Empty list = identical — bit for bit, or within ``rtol``/``atol`` for floating-point
    tensors and history when a tolerance is given (a run under the tolerance contract)."""
    diffs: list[FieldDiff] = []
    for name in sorted(set(a.tensors) | set(b.tensors)):
        field = _field_name(name)
        if name not in a.tensors or name not in b.tensors:
            diffs.append(FieldDiff(field, "present in only one state"))
            continue
        d = _array_diff(field, a.tensors[name], b.tensors[name], rtol, atol)
        if d:
            diffs.append(d)
    if a.step != b.step:
        diffs.append(FieldDiff("t", f"{a.step} vs {b.step}", float(abs(a.step - b.step))))
    if a.rng_state != b.rng_state:
        diffs.append(FieldDiff("rng", "RNG states differ"))
    if a.cursor != b.cursor:
        diffs.append(FieldDiff("cursor", f"{a.cursor} vs {b.cursor}", float(abs(a.cursor - b.cursor))))
    for key in sorted(set(a.meta) | set(b.meta)):
        if a.meta.get(key) != b.meta.get(key):
            diffs.append(FieldDiff(f"meta.{key}", "trainer state differs"))
    for key in sorted(set(a.history) | set(b.history)):
        ha = np.asarray(a.history.get(key, []), dtype=np.float64)
        hb = np.asarray(b.history.get(key, []), dtype=np.float64)
        d = _array_diff(f"history.{key}", ha, hb, rtol, atol)
        if d:
            diffs.append(d)
    if a.config != b.config:
        diffs.append(FieldDiff("config", "configs differ"))
    for name in LINEAGE_COMPARED:
        va, vb = getattr(a.lineage, name), getattr(b.lineage, name)
        if va != vb:
            diffs.append(FieldDiff(f"lineage.{name}", f"{va!r} vs {vb!r}"))
    return diffs
