"""Tensors as bytes: the dtypes a checkpoint may hold, what a tensor must be (``TensorSpec``),
zero-copy byte views, and checksums.

Tensors are raw C-order little-endian bytes. Each has a BLAKE3 checksum (``blake3:<hex>``),
computed while its bytes stream out on save and while they stream in on load.

A manifest names each tensor's dtype by its tag (``dtype_tag``/``dtype_from_tag``, the one
mapping): numpy's little-endian string (``<f4``, ``<f2``, ``|u1``, ...), and ``bfloat16`` for
bfloat16 (``ml_dtypes``), whose numpy string ``<V2`` would not say what its bytes are.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
from blake3 import blake3
from numpy.typing import DTypeLike

from cairn.errors import IntegrityError, TensorSpecError

__all__ = [
    "TensorSpec",
    "ALLOWED_DTYPES",
    "BFLOAT16",
    "BFLOAT16_TAG",
    "dtype_tag",
    "dtype_from_tag",
    "is_floating",
    "CHECKSUM_PREFIX",
    "HASH_CHUNK",
    "CHECK_CHUNK",
    "MAX_DIM",
    "require_in_shard",
    "MAX_ELEMENTS",
    "require_shape",
    "as_le_contiguous",
    "byte_view",
    "tensor_checksum",
    "require_checksum",
]

BFLOAT16_TAG = "bfloat16"
BFLOAT16: np.dtype[Any]
"""bfloat16, little-endian: stored natively, 2 bytes an element (``ml_dtypes``, loaded when this
name or a bfloat16 tag is first used: its import takes half a second)."""


@functools.cache
def _bfloat16() -> np.dtype[Any]:
    import ml_dtypes  # on first use: its import takes half a second, which every command paid before

    dtype: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16).newbyteorder("<")
    return dtype


def __getattr__(name: str) -> np.dtype[Any]:
    if name == "BFLOAT16":
        return _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ALLOWED_DTYPES = frozenset({"<f8", "<f4", "<f2", BFLOAT16_TAG, "<i8", "<i4", "<i2", "|i1", "<u8", "<u4", "|u1", "|b1"})
"""The dtype tags a checkpoint may hold."""
CHECKSUM_PREFIX = "blake3:"
HASH_CHUNK = 8 << 20
CHECK_CHUNK = 1 << 20  # verify in cache-sized chunks
MAX_DIM = 1 << 40
"""No single dimension of a tensor may exceed this, even when another dimension is 0."""
MAX_ELEMENTS = 1 << 48
"""No tensor may have more elements than this — counting its non-zero dimensions, so a shape like
``[2**40, 2**40, 0]`` (0 elements, but past what numpy can index) is refused too."""


@dataclass(frozen=True)
class TensorSpec:
    """What one state tensor must be: its dtype tag (``dtype_tag``: numpy's little-endian string
    such as ``<f4``, or ``bfloat16``) and shape."""

    dtype: str
    shape: tuple[int, ...]


def dtype_tag(dtype: DTypeLike) -> str:
    """The manifest's tag for ``dtype``: ``bfloat16`` for little-endian bfloat16, numpy's dtype
    string (``<f4``, ``<f2``, ...) for any other dtype (which may not be an allowed one)."""
    dt = np.dtype(dtype)
    # Only ml_dtypes makes a dtype of that name, so it is loaded already when one is asked about.
    return BFLOAT16_TAG if dt.name == BFLOAT16_TAG and dt == _bfloat16() else dt.str


def dtype_from_tag(tag: str, field: str = "dtype") -> np.dtype[Any]:
    """The numpy dtype a manifest's tag names; a tag outside ``ALLOWED_DTYPES`` (unknown, or a
    dtype a checkpoint may not hold) is refused with ``TensorSpecError`` naming ``field``."""
    if tag not in ALLOWED_DTYPES:
        raise TensorSpecError(field=field, expected=sorted(ALLOWED_DTYPES), found=tag)
    return _bfloat16() if tag == BFLOAT16_TAG else np.dtype(tag)


def is_floating(dtype: DTypeLike) -> bool:
    """Whether values of ``dtype`` are floating point (numpy's floats, and bfloat16)."""
    dt = np.dtype(dtype)
    return dt.kind == "f" or (dt.name == BFLOAT16_TAG and dt.type is _bfloat16().type)


def require_shape(shape: list[int], field: str, *, max_ndim: int, max_elements: int = MAX_ELEMENTS) -> None:
    """Refuse, before any array is built, a shape past the bounds: the number of dimensions, each
    dimension, and the product of its non-zero dimensions (numpy's own limit on any shape)."""
    if len(shape) > max_ndim or any(not isinstance(d, int) or not 0 <= d <= MAX_DIM for d in shape):
        raise TensorSpecError(field=field, expected=f"<= {max_ndim} dims, each in [0, {MAX_DIM}]", found=shape)
    if math.prod(d for d in shape if d) > max_elements:  # Python ints: no overflow
        raise TensorSpecError(
            "the product of the non-zero dimensions is past the bound",
            field=field,
            expected=f"<= {max_elements} elements",
            found=shape,
        )


def as_le_contiguous(arr: np.ndarray) -> np.ndarray:
    """``arr`` itself when it is already C-contiguous little-endian (no copy), else a copy."""
    out = arr if arr.flags.c_contiguous else arr.copy(order="C")  # keeps 0-d arrays 0-d
    little = out.dtype.newbyteorder("<")
    if out.dtype != little:
        out = out.astype(little)
    dtype_from_tag(dtype_tag(out.dtype))  # refuses a dtype a checkpoint may not hold
    return out


def byte_view(arr: np.ndarray) -> memoryview:
    """The bytes of a C-contiguous array, without copying."""
    return memoryview(arr.reshape(-1).view(np.uint8))  # type: ignore[arg-type]  # ndarray is a buffer


def tensor_checksum(arr: np.ndarray) -> str:
    """BLAKE3 of the tensor's bytes: cryptographic (so a signed manifest covers the data) and
    several times faster than sha256, which keeps verification off the restore's critical path."""
    h = blake3()
    view = byte_view(arr if arr.flags.c_contiguous else arr.copy(order="C"))
    for start in range(0, len(view), HASH_CHUNK):
        h.update(view[start : start + HASH_CHUNK])
    return CHECKSUM_PREFIX + h.hexdigest()


def require_checksum(name: str, expected: str, hasher: blake3) -> None:
    """Refuse a tensor whose streamed bytes do not hash to the manifest's checksum."""
    found = CHECKSUM_PREFIX + hasher.hexdigest()
    if found != expected:
        raise IntegrityError(
            "tensor bytes do not match their checksum",
            field=f"tensors[{name}].checksum",
            expected=expected,
            found=found,
        )


def require_in_shard(field: str, shard_key: str, offset: int, length: int, shard_sizes: Mapping[str, int]) -> None:
    """Refuse an entry whose shard is not listed, or whose bytes run past its shard's end
    (``field``: the entry, e.g. ``tensors[NAME]``)."""
    size = shard_sizes.get(shard_key)
    if size is None:
        raise TensorSpecError(field=f"{field}.shard", expected=sorted(shard_sizes)[:10], found=shard_key)
    if offset + length > size:
        raise TensorSpecError(
            "tensor runs past the end of its shard",
            field=f"{field}.offset",
            expected=f"offset + length <= {size}",
            found=offset + length,
        )
