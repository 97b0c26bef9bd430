"""Checkpoint content (``cairn.checkpoint.content``): the fingerprint has no form for non-finite values."""

from __future__ import annotations

import math

import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointContent, CheckpointKind

INFERENCE = CheckpointKind.INFERENCE


def test_fingerprint_has_no_form_for_non_finite_values() -> None:
    with pytest.raises(E.InvariantError) as info:
        CheckpointContent(kind=INFERENCE, run_id="nf", step=0, meta={"x": math.inf}).fingerprint([])
    assert info.value.field == "meta.x"
