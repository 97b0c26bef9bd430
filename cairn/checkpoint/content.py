"""A checkpoint's content: everything but its tensors' bytes and layout — and its fingerprint.

This module is the one place that says which fields are content (``CONTENT_FIELDS``): the
manifest is built from them, the fingerprint is computed over them (plus each tensor's name,
dtype, shape and checksum), and a reader recomputes the fingerprint from the same list.

The fingerprint is a sha256 identifier, **not** a signature: anyone can recompute it for
forged content. It leaves out the run id, the shard layout, the writer and ``lineage.parent``
(provenance, not content), so a retried save of the same state converges on one identity and
a resumed run's final checkpoint has the same fingerprint as the uninterrupted one. A history
kept in segments is covered as the tensors ``history/KEY`` it used to be (float64, its length,
the BLAKE3 of all its values), not by its segments: how a history is cut depends on when
earlier saves ran, and a state's identity must not — nor change with the form it is stored in.

``check_content`` refuses, before any byte is written, what a reader would refuse: NaN or
infinity (no JSON form), content that is not plain JSON or is past the reader's bounds, and
tensors past ``Limits``. So every commit that succeeds reads back to the same fingerprint.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from cairn.checkpoint.blocks import base_name
from cairn.checkpoint.manifest import (
    BLOCKED_FORMAT_VERSION,
    FORMAT_VERSION,
    INDEXED_FORMAT_VERSION,
    CheckpointKind,
    HistoryRef,
    Manifest,
    TensorEntry,
)
from cairn.checkpoint.options import Limits
from cairn.errors import InvariantError, SizeLimitError, TensorSpecError
from cairn.jsonio import JsonLimits, parse_json
from cairn.state import Lineage

__all__ = [
    "HISTORY_PREFIX",
    "CheckpointContent",
    "CONTENT_FIELDS",
    "TensorIndex",
    "index_of",
    "check_content",
    "non_finite_path",
]

TensorIndex = tuple[str, str, list[int], str]
"""(name, dtype, shape, checksum): what the fingerprint covers of one tensor."""
HISTORY_PREFIX = "history/"
"""Checkpoint tensors under this prefix are the state's history (float64, one value per entry)."""


@dataclass
class CheckpointContent:
    """Everything in a checkpoint except its tensors and layout."""

    kind: CheckpointKind
    run_id: str
    step: int
    cursor: int = 0
    config: dict[str, Any] | None = None
    lineage: Lineage | None = None
    rng: dict[str, Any] | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    history: HistoryRef | None = None
    """A training state's history as run-level segments (None: none, or in its tensors)."""

    @classmethod
    def of(cls, manifest: Manifest) -> CheckpointContent:
        """The content a manifest declares (to recompute its fingerprint)."""
        return cls(**{name: getattr(manifest, name) for name in CONTENT_FIELDS})

    def manifest_fields(self) -> dict[str, Any]:
        """The manifest's content fields, as keyword arguments for ``Manifest``."""
        return {name: getattr(self, name) for name in CONTENT_FIELDS}

    def fingerprint(
        self, tensors: Iterable[TensorIndex], parts: dict[str, Any] | None = None, index: dict[str, Any] | None = None
    ) -> str:
        """sha256 over the content and the tensor index (and, for a blocked checkpoint, its
        ``parts``: ``cairn.checkpoint.blocks.parts_json``); see the module docstring. A v3
        checkpoint gives no tensors but ``index``: its block count and index digest
        (``cairn.checkpoint.index.index_summary``), which cover every block entry."""
        version = FORMAT_VERSION if parts is None else BLOCKED_FORMAT_VERSION
        body: dict[str, Any] = {
            "format_version": INDEXED_FORMAT_VERSION if index is not None else version,
            "kind": str(self.kind),
            "step": self.step,
            "cursor": self.cursor,
            "config": self.config,
            "lineage": None if self.lineage is None else self.lineage.fingerprint_json(),
            "rng": self.rng,
            "meta": self.meta,
            "tensors": sorted([n, d, list(s), c] for n, d, s, c in [*tensors, *self._history_index()]),
        }
        if parts is not None:
            body["parts"] = parts
        if index is not None:
            body["index"] = index
        try:
            text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
        except ValueError:  # NaN or infinity somewhere: it has no JSON form and would not round-trip
            path, value = non_finite_path(body) or ("content", None)
            raise InvariantError(
                "checkpoint content must be finite JSON", field=path, expected="a finite number", found=value
            ) from None
        return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

    def _history_index(self) -> list[TensorIndex]:
        """A history in segments, as the tensors it is the same content as (``history/KEY``)."""
        series = {} if self.history is None else self.history.series
        return [(HISTORY_PREFIX + k, "<f8", [s.length], s.digest) for k, s in series.items()]


CONTENT_FIELDS = tuple(f.name for f in fields(CheckpointContent))


def index_of(entries: Iterable[TensorEntry]) -> list[TensorIndex]:
    return [(e.name, e.dtype, list(e.shape), e.checksum) for e in entries]


def non_finite_path(value: Any, path: str = "") -> tuple[str, float] | None:
    """(dotted path, value) of the first NaN or infinity inside a JSON-like value, else None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (path or "value", value)
    if isinstance(value, dict):
        items: list[tuple[str, Any]] = [(f"{path}.{k}" if path else str(k), v) for k, v in value.items()]
    elif isinstance(value, list | tuple):
        items = [(f"{path}[{i}]", v) for i, v in enumerate(value)]
    else:
        return None
    for sub_path, sub in items:
        found = non_finite_path(sub, sub_path)
        if found is not None:
            return found
    return None


def check_content(content: CheckpointContent, tensors: Mapping[str, np.ndarray], limits: Limits) -> None:
    """Refuse, before anything is written, what a reader would refuse: content the manifest
    cannot carry faithfully, and tensors over the read bounds (``Limits``)."""
    where = f"{content.run_id}/{content.kind}/{content.step}"
    names = list(tensors)
    for name in names:
        if not 1 <= len(name) <= 256:
            raise TensorSpecError(field="tensors", expected="names of 1 to 256 characters", found=name[:80])
    logical = len({base_name(n) for n in names})  # a blocked save's entries are blocks of fewer tensors
    if logical > limits.max_tensors:
        raise SizeLimitError(field="tensors", expected=f"<= {limits.max_tensors} tensors", found=logical)
    if len(names) > limits.max_blocks:
        raise SizeLimitError(field="tensors", expected=f"<= {limits.max_blocks} blocks", found=len(names))
    total = sum(int(a.nbytes) for a in tensors.values())
    if total > limits.max_total_bytes:
        raise SizeLimitError(field="total_bytes", expected=f"<= {limits.max_total_bytes}", found=total)
    deep = [n for n, a in tensors.items() if a.ndim > limits.max_ndim]
    if deep:
        raise TensorSpecError(field=f"tensors[{deep[0]}].shape", expected=f"<= {limits.max_ndim} dims", found=None)
    body = {
        "config": content.config,
        "lineage": None if content.lineage is None else content.lineage.model_dump(mode="json"),
        "rng": content.rng,
        "meta": content.meta,
        "tensors": names,
        "history": None if content.history is None else content.history.model_dump(mode="json"),
    }
    found = non_finite_path(body)
    if found is not None:
        raise InvariantError(
            "checkpoint content must be finite JSON", field=found[0], expected="a finite number", found=found[1]
        )
    try:
        text = json.dumps(body, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvariantError(f"{where}: checkpoint content is not plain JSON ({exc})") from None
    # The reader's bounds, applied at write time: what commits can always be read back.
    parse_json(
        text.encode(),
        where=f"{where} content",
        error=InvariantError,
        limits=JsonLimits(max_bytes=limits.max_manifest_bytes),
    )
