"""Tensors as bytes: the dtypes a checkpoint may hold, zero-copy byte views, and checksums.

Tensors are raw C-order little-endian bytes. Each has a BLAKE3 checksum (``blake3:<hex>``),
computed while its bytes stream out on save and while they stream in on load.
"""

from __future__ import annotations

import math

import numpy as np
from blake3 import blake3

from cairn.errors import IntegrityError, TensorSpecError

__all__ = [
    "ALLOWED_DTYPES",
    "CHECKSUM_PREFIX",
    "HASH_CHUNK",
    "CHECK_CHUNK",
    "MAX_DIM",
    "MAX_ELEMENTS",
    "require_shape",
    "as_le_contiguous",
    "byte_view",
    "tensor_checksum",
    "require_checksum",
]

ALLOWED_DTYPES = frozenset({"<f8", "<f4", "<f2", "<i8", "<i4", "<i2", "|i1", "<u8", "<u4", "|u1", "|b1"})
CHECKSUM_PREFIX = "blake3:"
HASH_CHUNK = 8 << 20
CHECK_CHUNK = 1 << 20  # verify in cache-sized chunks
MAX_DIM = 1 << 40
"""No single dimension of a tensor may exceed this, even when another dimension is 0."""
MAX_ELEMENTS = 1 << 48
"""No tensor may have more elements than this — counting its non-zero dimensions, so a shape like
``[2**40, 2**40, 0]`` (0 elements, but past what numpy can index) is refused too."""


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
    if out.dtype.byteorder == ">":
        out = out.astype(out.dtype.newbyteorder("<"))
    if out.dtype.str not in ALLOWED_DTYPES:
        raise TensorSpecError(field="dtype", expected=sorted(ALLOWED_DTYPES), found=out.dtype.str)
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
