"""Tensors as bytes (``cairn.checkpoint.tensors``): a shape whose element count overflows is refused
before any array is built, by the reader and by ``cairn ckpt verify``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointKind, read_manifest, write_checkpoint
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.reader import read_tensors
from cairn.stores import LocalStore
from tests.conftest import rewrite_manifest
from workers.cli.main import main as cli


@pytest.mark.parametrize("kind", [CheckpointKind.JOURNAL, CheckpointKind.RECEIPT])
def test_a_shape_whose_element_count_overflows_is_refused_before_any_array(
    tmp_path: Path, kind: CheckpointKind
) -> None:
    store = LocalStore(tmp_path / "s")
    content = CheckpointContent(kind=kind, run_id="r", step=1)
    result = write_checkpoint(store, content, {"empty": np.zeros((4, 0))})

    def overflow(body: dict[str, object]) -> None:
        body["tensors"][0]["shape"] = [2**40, 2**40, 0]  # type: ignore[index]

    rewrite_manifest(store, result.ref, overflow)
    with pytest.raises(E.TensorSpecError, match="product of the non-zero dimensions"):
        read_tensors(store, result.ref, read_manifest(store, result.ref, expect_kind=kind))
    assert cli(["ckpt", "verify", str(result.ref)]) == 1
