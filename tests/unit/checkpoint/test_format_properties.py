"""Property tests: any tensors round-trip exactly; any corruption of a manifest or a shard is refused."""

from __future__ import annotations

import json

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from cairn import errors as E
from cairn.checkpoint import (
    CheckpointContent,
    CheckpointKind,
    CheckpointOptions,
    read_manifest,
    read_tensors,
    write_checkpoint,
)
from cairn.stores import MemoryStore

DTYPES = st.sampled_from([np.float64, np.float32, np.int64, np.int32, np.uint8, np.bool_])


NAMES = st.text(alphabet="abcdefghij/._", min_size=1, max_size=12)


arrays = DTYPES.flatmap(lambda dt: hnp.arrays(dt, hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)))


tensor_sets = st.dictionaries(NAMES, arrays, min_size=0, max_size=6)


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _write(tensors: dict[str, np.ndarray], shard_bytes: int = 64) -> tuple[MemoryStore, object]:
    store = MemoryStore()
    content = CheckpointContent(kind=CheckpointKind.INFERENCE, run_id="prop", step=3, meta={"note": "x"})
    result = write_checkpoint(store, content, tensors, options=CheckpointOptions(shard_bytes=shard_bytes))
    return store, result.ref


@SETTINGS
@given(tensor_sets, st.integers(min_value=1, max_value=512))
def test_round_trip_is_exact(tensors: dict[str, np.ndarray], shard_bytes: int) -> None:
    store, ref = _write(tensors, shard_bytes)
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.INFERENCE)
    loaded = read_tensors(store, ref, manifest)
    assert set(loaded) == set(tensors)
    for name, arr in tensors.items():
        assert loaded[name].dtype == arr.dtype and loaded[name].shape == arr.shape
        assert loaded[name].tobytes() == np.ascontiguousarray(arr).tobytes()


@SETTINGS
@given(tensor_sets.filter(lambda t: any(a.nbytes for a in t.values())), st.data())
def test_any_shard_corruption_is_refused(tensors: dict[str, np.ndarray], data: st.DataObject) -> None:
    store, ref = _write(tensors)
    manifest = read_manifest(store, ref, expect_kind=None)
    shard = data.draw(st.sampled_from([s for s in manifest.shards if s.bytes]))
    key = f"{ref.prefix}/{shard.key}"
    raw = bytearray(store.read(key, 1 << 30))
    pos = data.draw(st.integers(0, len(raw) - 1))
    raw[pos] ^= data.draw(st.integers(1, 255))
    store.corrupt(key, bytes(raw))
    try:
        read_tensors(store, ref, manifest)
    except E.IntegrityError:
        return
    raise AssertionError("a flipped shard byte was not detected")


@SETTINGS
@given(tensor_sets, st.data())
def test_any_manifest_corruption_is_refused(tensors: dict[str, np.ndarray], data: st.DataObject) -> None:
    store, ref = _write(tensors)
    key = f"{ref.prefix}/manifest.json"
    raw = bytearray(store.read(key, 1 << 30))
    # Corrupt a byte of the JSON, excluding insignificant whitespace and the informational
    # writer block (which is not content and is deliberately outside the fingerprint).
    body = json.loads(raw)
    candidates = [i for i, b in enumerate(raw) if chr(b) not in " \n"]
    pos = data.draw(st.sampled_from(candidates))
    original = raw[pos]
    raw[pos] = data.draw(st.integers(0, 255).filter(lambda b: b != original))
    store.corrupt(key, bytes(raw))
    try:
        parsed = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        parsed = None
    if isinstance(parsed, dict) and _only_writer_changed(parsed, body):
        return  # an equivalent document (e.g. an escaped character) or the informational writer block
    try:
        manifest = read_manifest(store, ref, expect_kind=CheckpointKind.INFERENCE)
        read_tensors(store, ref, manifest)
    except E.CheckpointError:
        return
    raise AssertionError(f"manifest corruption at byte {pos} was not detected")


def _only_writer_changed(a: dict[str, object], b: dict[str, object]) -> bool:
    return {k: v for k, v in a.items() if k != "writer"} == {k: v for k, v in b.items() if k != "writer"}
