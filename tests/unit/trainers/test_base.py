"""The trainer interface's shared checks (``cairn.trainers.base``): a non-finite value raises the
typed error alone, without numpy's warnings."""

from __future__ import annotations

import numpy as np
import pytest

from cairn import errors as E


def test_numeric_checks_raise_the_typed_error_alone_without_warnings() -> None:
    """A signalling NaN (or a sum that overflows) must not print numpy's RuntimeWarning before the
    one-line error: the suite turns warnings into errors, so a warning fails this test."""
    from cairn.trainers.base import check_finite

    values = np.array([1.0, 2.0], dtype="<f8")
    values.view(np.uint64)[0] = 0x7FF0000000000001  # a signalling NaN
    with pytest.raises(E.NonFiniteError, match=r"tensors\[x\]"):
        check_finite("x", values)
    check_finite("big", np.full(4, 1e308))  # the sum overflows; every value is finite


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_finite_check_counts_exactly_across_blocks_and_threads(dtype: str) -> None:
    """The 16-bit test runs in blocks through a scratch of each thread's own: values at block
    edges and in a short last block are all counted, with several threads checking at once."""
    from concurrent.futures import ThreadPoolExecutor

    import ml_dtypes

    from cairn.trainers.base import _BITS_BLOCK, check_finite

    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(np.float16)
    n = 3 * _BITS_BLOCK + 123
    arrays = []
    for k in range(8):
        values = np.ones(n, dtype=dt)
        bad = [0, _BITS_BLOCK - 1, _BITS_BLOCK, 2 * _BITS_BLOCK + 7, n - 1][: k % 5 + 1]
        values[bad[0::2]] = np.inf
        values[bad[1::2]] = -np.nan if k % 2 else np.nan
        arrays.append((values, len(bad)))

    def found(item: tuple[np.ndarray, int]) -> str:
        with pytest.raises(E.NonFiniteError) as refused:
            check_finite("x", item[0])
        return str(refused.value)

    with ThreadPoolExecutor(4) as pool:
        messages = list(pool.map(found, arrays * 4))
    assert all(f"{count} non-finite" in m for m, (_, count) in zip(messages, arrays * 4, strict=True)), messages
    check_finite("ok", np.ones(n, dtype=dt))  # and the scratch holds nothing over
