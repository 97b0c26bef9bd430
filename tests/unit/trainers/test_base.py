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
