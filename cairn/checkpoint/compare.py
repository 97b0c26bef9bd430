"""Bit-for-bit comparison of two training states, field by field."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cairn.state import Lineage, TrainState

__all__ = ["FieldDiff", "compare_states", "LINEAGE_COMPARED"]

LINEAGE_COMPARED = tuple(name for name in Lineage.model_fields if name != "parent")
"""Lineage fields that are part of a state; ``parent`` is provenance (which checkpoint a run
resumed from) and differs between a resumed run and an uninterrupted one by design."""


@dataclass(frozen=True)
class FieldDiff:
    field: str
    detail: str
    max_abs_diff: float | None = None

    def to_json(self) -> dict[str, object]:
        return {"field": self.field, "detail": self.detail, "max_abs_diff": self.max_abs_diff}


def _array_diff(name: str, a: np.ndarray, b: np.ndarray) -> FieldDiff | None:
    if a.shape != b.shape or a.dtype != b.dtype:
        return FieldDiff(name, f"shape/dtype {a.dtype}{list(a.shape)} vs {b.dtype}{list(b.shape)}")
    # Compare bit patterns, so -0.0 vs 0.0 and NaN payloads count as differences too.
    if a.tobytes() == b.tobytes():
        return None
    diff = float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))) if a.size else 0.0
    bits_a = np.ascontiguousarray(a).view(np.uint8).reshape(a.size, -1)
    bits_b = np.ascontiguousarray(b).view(np.uint8).reshape(b.size, -1)
    n = int(np.count_nonzero(np.any(bits_a != bits_b, axis=1)))
    return FieldDiff(name, f"{n} of {a.size} elements differ", diff)


def compare_states(a: TrainState, b: TrainState) -> list[FieldDiff]:
    """Every state field: theta, m, v, t, RNG, cursor, history, config and lineage (except its
    ``parent``). Empty list = identical."""
    diffs: list[FieldDiff] = []
    for group, da, db in (("theta", a.params, b.params), ("m", a.m, b.m), ("v", a.v, b.v)):
        for name in sorted(set(da) | set(db)):
            if name not in da or name not in db:
                diffs.append(FieldDiff(f"{group}.{name}", "present in only one state"))
                continue
            d = _array_diff(f"{group}.{name}", da[name], db[name])
            if d:
                diffs.append(d)
    if a.step != b.step:
        diffs.append(FieldDiff("t", f"{a.step} vs {b.step}", float(abs(a.step - b.step))))
    if a.rng_state != b.rng_state:
        diffs.append(FieldDiff("rng", "RNG states differ"))
    if a.cursor != b.cursor:
        diffs.append(FieldDiff("cursor", f"{a.cursor} vs {b.cursor}", float(abs(a.cursor - b.cursor))))
    for key in sorted(set(a.history) | set(b.history)):
        ha = np.asarray(a.history.get(key, []), dtype=np.float64)
        hb = np.asarray(b.history.get(key, []), dtype=np.float64)
        d = _array_diff(f"history.{key}", ha, hb)
        if d:
            diffs.append(d)
    if a.config != b.config:
        diffs.append(FieldDiff("config", "configs differ"))
    for name in LINEAGE_COMPARED:
        va, vb = getattr(a.lineage, name), getattr(b.lineage, name)
        if va != vb:
            diffs.append(FieldDiff(f"lineage.{name}", f"{va!r} vs {vb!r}"))
    return diffs
