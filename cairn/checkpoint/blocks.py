"""Blocked tensors (formats v2 and v3): fixed-size 1-D blocks, whatever the number of writers.

A distributed save cuts every logical tensor (C order, flattened) into blocks of
``block_elems`` elements — the last one shorter, an empty tensor one empty block — and stores
each block as its own tensor entry named ``NAME#IIIII`` with its own BLAKE3 checksum. The block
size is part of the run's config (``distributed.block_bytes``), never derived from the world
size, so the same state saved by 1, 2 or 4 ranks has the same entries, checksums and
fingerprint, and a rank reads or writes exactly the blocks it owns (ranged reads on S3).

``Manifest.parts`` records each logical tensor's shape and block size; ``check_parts`` proves
before anything is allocated that the blocks tile every declared tensor exactly (names, count,
lengths, one dtype), and the fingerprint covers ``parts``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from cairn.checkpoint.manifest import Manifest, PartSpec
from cairn.checkpoint.tensors import dtype_from_tag, dtype_tag, require_shape
from cairn.errors import TensorSpecError

__all__ = [
    "Block",
    "block_name",
    "base_name",
    "block_elems_for",
    "parts_of",
    "plan_blocks",
    "split_blocks",
    "check_parts",
    "check_part_specs",
    "block_count",
    "block_range",
    "logical_specs",
    "parts_json",
]

SEPARATOR = "#"


def block_name(name: str, index: int) -> str:
    return f"{name}{SEPARATOR}{index:05d}"


def base_name(entry: str) -> str:
    """The logical tensor a block entry belongs to (the entry itself when not a block)."""
    head, sep, _ = entry.rpartition(SEPARATOR)
    return head if sep else entry


def block_elems_for(dtype: np.dtype[Any] | str, block_bytes: int) -> int:
    """Elements of ``dtype`` (a numpy dtype, or a manifest's dtype tag) in a block of ``block_bytes``."""
    itemsize = (dtype_from_tag(dtype) if isinstance(dtype, str) else np.dtype(dtype)).itemsize
    return max(1, block_bytes // itemsize)


def _count(n_elems: int, block_elems: int) -> int:
    return max(1, -(-n_elems // block_elems))


@dataclass(frozen=True)
class Block:
    """One block: entry name, logical tensor, and its element range ``[start, stop)`` in the
    flattened tensor."""

    name: str
    tensor: str
    index: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def parts_of(arrays: Mapping[str, np.ndarray], block_bytes: int, *, indexed: bool = True) -> dict[str, PartSpec]:
    """The blocked layout of ``arrays`` at ``block_bytes`` per block: format v3's (each part
    names its dtype), or with ``indexed=False`` format v2's."""
    return {
        name: PartSpec(
            shape=list(a.shape),
            block_elems=block_elems_for(a.dtype, block_bytes),
            dtype=dtype_tag(a.dtype) if indexed else None,
        )
        for name, a in sorted(arrays.items())
    }


def block_count(spec: PartSpec) -> int:
    """How many blocks ``spec`` is cut into (an empty tensor is one empty block)."""
    return _count(math.prod(spec.shape), spec.block_elems)


def block_range(spec: PartSpec, index: int) -> tuple[int, int]:
    """Element range ``[start, stop)`` of block ``index`` of ``spec``."""
    start = index * spec.block_elems
    return start, min(math.prod(spec.shape), start + spec.block_elems)


def plan_blocks(parts: Mapping[str, PartSpec]) -> list[Block]:
    """Every block of ``parts``, by tensor name then index: the one order every rank agrees on."""
    out: list[Block] = []
    for name in sorted(parts):
        spec = parts[name]
        n = math.prod(spec.shape)
        for i in range(_count(n, spec.block_elems)):
            start = i * spec.block_elems
            out.append(Block(block_name(name, i), name, i, start, min(n, start + spec.block_elems)))
    return out


def split_blocks(
    arrays: Mapping[str, np.ndarray], parts: Mapping[str, PartSpec], only: Collection[str] | None = None
) -> dict[str, np.ndarray]:
    """Block entry name -> 1-D view into ``arrays`` (no copy for C-contiguous arrays);
    ``only``: just these logical tensors."""
    out: dict[str, np.ndarray] = {}
    for block in plan_blocks(parts):
        if only is not None and block.tensor not in only:
            continue
        flat = np.ascontiguousarray(arrays[block.tensor]).reshape(-1)
        out[block.name] = flat[block.start : block.stop]
    return out


def parts_json(parts: Mapping[str, PartSpec] | None) -> dict[str, Any] | None:
    """``parts`` as the fingerprint covers it."""
    if parts is None:
        return None
    return {name: spec.model_dump(mode="json") for name, spec in sorted(parts.items())}


def check_part_specs(parts: Mapping[str, PartSpec]) -> None:
    """Every part's name, shape and (when given) dtype tag are well formed."""
    for name, spec in parts.items():
        where = f"parts[{name}]"
        if not 1 <= len(name) <= 240 or SEPARATOR in name:
            raise TensorSpecError(
                field="parts", expected=f"names of 1 to 240 characters without {SEPARATOR!r}", found=name[:80]
            )
        require_shape(spec.shape, f"{where}.shape", max_ndim=8)
        if spec.dtype is not None:
            dtype_from_tag(spec.dtype, f"{where}.dtype")


def check_parts(manifest: Manifest) -> None:
    """The blocks of a v2 manifest tile its declared tensors exactly; nothing else is listed.
    (A v3 root lists no blocks: its parts are checked here, its rank indexes by
    ``cairn.checkpoint.index``.)"""
    parts = manifest.parts
    if parts is None:
        return
    check_part_specs(parts)
    if manifest.indexes is not None:
        return
    entries = {t.name: t for t in manifest.tensors}
    expected: set[str] = set()
    for name, spec in parts.items():
        where = f"parts[{name}]"
        n = math.prod(spec.shape)
        count = _count(n, spec.block_elems)
        if count > len(manifest.tensors):  # before building names: a forged count cannot allocate
            raise TensorSpecError(
                "blocks missing",
                field=f"{where}.block_elems",
                expected=f">= {count} blocks",
                found=len(manifest.tensors),
            )
        dtypes: set[str] = set()
        for i in range(count):
            bname = block_name(name, i)
            entry = entries.get(bname)
            if entry is None:
                raise TensorSpecError("a block of a declared tensor is missing", field="tensors", expected=bname)
            want = min(n, (i + 1) * spec.block_elems) - i * spec.block_elems
            if entry.shape != [want]:
                raise TensorSpecError(field=f"tensors[{bname}].shape", expected=[want], found=entry.shape)
            dtypes.add(entry.dtype)
            expected.add(bname)
        if len(dtypes) != 1:
            raise TensorSpecError("blocks of one tensor disagree on dtype", field=f"{where}", found=sorted(dtypes))
    stray = sorted(set(entries) - expected)
    if stray:
        raise TensorSpecError("entries outside every declared tensor", field="tensors", found=stray[:10])


def logical_specs(manifest: Manifest) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Logical tensor name -> (dtype tag, shape), for v1 (the entries) and v2/v3 (the parts) alike."""
    if manifest.parts is None:
        return {t.name: (t.dtype, tuple(t.shape)) for t in manifest.tensors}
    if manifest.indexes is not None:
        return {name: (str(spec.dtype), tuple(spec.shape)) for name, spec in manifest.parts.items()}
    dtype_of = {base_name(t.name): t.dtype for t in manifest.tensors}
    return {name: (dtype_of[name], tuple(spec.shape)) for name, spec in manifest.parts.items()}
