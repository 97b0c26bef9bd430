"""The blocked checkpoint layout (``cairn.checkpoint.blocks``): blocks tile every tensor and split
without copying; a distributed config saves format v3 that loads back exactly; a format v2
checkpoint (every block in the manifest, as older releases wrote) still loads back exactly; a
tampered v2 manifest, or a stray entry, is refused before any tensor is read. (Format v3's
rank indexes: ``test_index.py``.)"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cairn.checkpoint import CheckpointKind, CheckpointRef, latest_committed, read_manifest
from cairn.checkpoint.blocks import block_name, check_parts, parts_of, plan_blocks, split_blocks
from cairn.checkpoint.compare import compare_states
from cairn.checkpoint.layout import manifest_key
from cairn.errors import FormatVersionError, IntegrityError, ManifestError, TensorSpecError
from cairn.session import TrainingSession
from cairn.stores import LocalStore
from cairn.training import load_training
from tests.conftest import dist_config, write_v2


def test_blocks_tile_every_tensor_and_split_without_copying() -> None:
    arrays = {"a": np.arange(20.0).reshape(4, 5), "b": np.zeros(0), "c": np.arange(3.0)}
    parts = parts_of(arrays, block_bytes=64)  # 8 float64 per block
    blocks = plan_blocks(parts)
    assert [b.name for b in blocks] == ["a#00000", "a#00001", "a#00002", "b#00000", "c#00000"]
    assert [b.size for b in blocks] == [8, 8, 4, 0, 3]
    views = split_blocks(arrays, parts)
    assert np.shares_memory(views["a#00001"], arrays["a"])
    assert np.array_equal(np.concatenate([views[f"a#{i:05d}"] for i in range(3)]), arrays["a"].reshape(-1))


def _blocked_checkpoint(tmp_path: Path, version: int = 2) -> tuple[LocalStore, CheckpointRef, TrainingSession]:
    """A distributed config's checkpoint at step 6: as it saves now (v3), or the same state
    written as format v2 (as older releases wrote it) under its own run id."""
    store = LocalStore(tmp_path / "store")
    session = TrainingSession.fresh("blocked", store, dist_config())
    session.run(6, checkpoint_every=6)
    ref = latest_committed(store, "blocked")
    assert ref is not None and ref.step == 6
    if version == 2:
        ref = write_v2(store, "blocked-v2", session.state)
    return store, ref, session


def _rewrite_manifest(store: LocalStore, ref: CheckpointRef, edit: object) -> None:
    key = manifest_key(ref.run_id, ref.kind, ref.step)
    body = json.loads(store.read(key, 1 << 30))
    edit(body)  # type: ignore[operator]
    path = store.root / key
    path.chmod(0o644)
    path.write_text(json.dumps(body))


def test_a_distributed_config_saves_format_v3_that_loads_back_exactly(tmp_path: Path) -> None:
    store, ref, session = _blocked_checkpoint(tmp_path, version=3)
    root = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING, expand_index=False)
    assert root.format_version == 3 and root.parts is not None and root.indexes is not None
    assert root.tensors == [] and root.shards == [] and root.parts["theta/W1"].dtype == "<f8"
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING)  # the index read in
    assert manifest.parts is not None
    assert manifest.parts["theta/W1"].shape == [8, 16] and manifest.parts["theta/W1"].block_elems == 8
    assert block_name("theta/W1", 15) in {t.name for t in manifest.tensors}  # 128 values = 16 blocks
    state, _ = load_training(store, ref)
    assert compare_states(state, session.state) == []


def test_a_format_v2_checkpoint_still_loads_back_exactly(tmp_path: Path) -> None:
    store, ref, session = _blocked_checkpoint(tmp_path)
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.TRAINING)
    assert manifest.format_version == 2 and manifest.parts is not None and manifest.indexes is None
    assert manifest.parts["theta/W1"].shape == [8, 16] and manifest.parts["theta/W1"].block_elems == 8
    assert block_name("theta/W1", 15) in {t.name for t in manifest.tensors}  # 128 values = 16 blocks
    state, _ = load_training(store, ref)
    assert compare_states(state, session.state) == []


@pytest.mark.parametrize(
    ("edit", "error", "field"),
    [
        (lambda b: b.update(total_bytes=b["total_bytes"] - b["tensors"].pop(3)["length"]), TensorSpecError, "tensors"),
        (lambda b: b["parts"]["theta/W1"].update(shape=[16, 8]), IntegrityError, "fingerprint"),  # same tiling
        (lambda b: b["parts"]["theta/W1"].update(shape=[8, 17]), TensorSpecError, None),  # blocks do not tile
        (lambda b: b.pop("parts"), ManifestError, None),  # v2 without parts
        (lambda b: b.update(format_version=3), ManifestError, None),  # v3 without indexes
        (lambda b: b.update(format_version=4), FormatVersionError, "format_version"),
    ],
)
def test_a_tampered_blocked_manifest_is_refused_before_any_tensor_is_read(
    tmp_path: Path, edit: object, error: type[Exception], field: str | None
) -> None:
    store, ref, session = _blocked_checkpoint(tmp_path)
    _rewrite_manifest(store, ref, edit)
    with pytest.raises(error) as caught:
        load_training(store, ref)
    if field is not None:
        assert getattr(caught.value, "field", None) == field


def test_a_blocked_checkpoint_with_a_stray_entry_is_refused(tmp_path: Path) -> None:
    store, ref, _ = _blocked_checkpoint(tmp_path)
    manifest = read_manifest(store, ref, expect_kind=None)
    stray = manifest.tensors[0].model_copy(update={"name": "ghost#00000"})
    forged = manifest.model_copy(update={"tensors": [*manifest.tensors, stray]})
    with pytest.raises(TensorSpecError, match="outside every declared tensor"):
        check_parts(forged)
