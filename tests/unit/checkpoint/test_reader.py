"""Reading a checkpoint (``cairn.checkpoint.reader``): memory bounds and safe keys on the read path,
and streaming verification (whole elements per chunk; a forged 58 GiB checkpoint verified in
bounded memory)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointContent, CheckpointKind, CheckpointRef, read_manifest, write_checkpoint
from cairn.checkpoint import reader as fmt
from cairn.stores import LocalStore, MemoryStore
from cairn.trainers.base import check_finite as check_training_values
from tests.conftest import refused_within_bounds, rewrite_manifest

pytestmark = pytest.mark.usefixtures("no_signing_key")
"""The code under test signs and verifies only with the key a test configures itself."""


INFERENCE = CheckpointKind.INFERENCE


def _inference(store: MemoryStore | LocalStore, tensors: dict[str, np.ndarray], run: str = "forge") -> CheckpointRef:
    content = CheckpointContent(kind=INFERENCE, run_id=run, step=1)
    return write_checkpoint(store, content, tensors).ref


def _load(store: MemoryStore | LocalStore, ref: CheckpointRef) -> None:
    manifest = read_manifest(store, ref, expect_kind=INFERENCE)
    fmt.read_tensors(store, ref, manifest)


@pytest.mark.parametrize("shape", [[2**62, 0], [0, 2**70], [2**41, 0, 3]])
def test_absurd_shapes_are_refused_before_allocating(memory_store: MemoryStore, shape: list[int]) -> None:
    ref = _inference(memory_store, {"empty": np.zeros((0, 3))})
    rewrite_manifest(memory_store, ref, lambda m: m["tensors"][0].update(shape=shape))
    with pytest.raises(E.TensorSpecError) as info:
        _load(memory_store, ref)
    assert info.value.field == "tensors[empty].shape"


UNSAFE_KEYS = ["../escape.bin", "a/../../b.bin", "./a.bin", "a//b.bin", "/abs.bin", "a\x00b", "a\nb", "a\\b", "", "a/"]


@pytest.mark.parametrize("key", UNSAFE_KEYS)
def test_unsafe_shard_keys_are_content_errors(local_store: LocalStore, key: str) -> None:
    ref = _inference(local_store, {"w": np.arange(3.0)})

    def evil(m: dict[str, Any]) -> None:
        m["shards"][0]["key"] = key
        for t in m["tensors"]:
            t["shard"] = key

    rewrite_manifest(local_store, ref, evil)
    with pytest.raises(E.ManifestError) as info:
        _load(local_store, ref)
    assert not info.value.retryable and "shard" in str(info.value)


def test_a_shard_listed_twice_is_refused(memory_store: MemoryStore) -> None:
    ref = _inference(memory_store, {"w": np.arange(3.0)})
    rewrite_manifest(memory_store, ref, lambda m: m["shards"].append(dict(m["shards"][0])))
    with pytest.raises(E.ManifestError):
        _load(memory_store, ref)


def test_a_deeply_nested_manifest_is_a_manifest_error(memory_store: MemoryStore) -> None:
    ref = _inference(memory_store, {"w": np.arange(3.0)})
    key = f"{ref.prefix}/manifest.json"
    raw = memory_store.read(key, 1 << 30)
    memory_store.corrupt(key, raw[:-2] + b', "deep": ' + b"[" * 100_000 + b"]" * 100_000 + b"}")
    with pytest.raises(E.ManifestError, match="nested too deep"):
        read_manifest(memory_store, ref, expect_kind=INFERENCE)


TENSORS = {
    "a": np.arange(10, dtype="<f8"),
    "b": np.arange(7, dtype="<i4"),
    "c": np.zeros((0, 4)),
    "d": np.array(3.5),
    "e": np.linspace(0, 1, 15, dtype=np.float32).reshape(3, 5),
    "f": np.arange(5, dtype=np.uint8),
}


@pytest.mark.parametrize("chunk_bytes", [1, 12, 24, 8 << 20])
def test_verify_tensors_streams_whole_elements(memory_store: MemoryStore, chunk_bytes: int) -> None:
    ref = _inference(memory_store, TENSORS)
    manifest = read_manifest(memory_store, ref, expect_kind=INFERENCE)
    seen: dict[str, list[np.ndarray]] = {}

    def record(name: str, chunk: np.ndarray) -> None:
        assert chunk.ndim == 1 and chunk.dtype == TENSORS[name].dtype
        assert chunk.nbytes <= max(chunk_bytes, 8)
        seen.setdefault(name, []).append(chunk.copy())

    fmt.verify_tensors(memory_store, ref, manifest, value_check=record, chunk_bytes=chunk_bytes)
    for name, arr in TENSORS.items():
        got = np.concatenate(seen[name]) if name in seen else np.empty(0, arr.dtype)
        assert got.tobytes() == arr.tobytes(), name


def test_verify_tensors_refuses_corruption_and_bad_values(memory_store: MemoryStore) -> None:
    ref = _inference(memory_store, {"theta/w": np.array([1.0, np.nan, 2.0]), "x": np.arange(4.0)})
    manifest = read_manifest(memory_store, ref, expect_kind=INFERENCE)
    with pytest.raises(E.NonFiniteError):
        fmt.verify_tensors(memory_store, ref, manifest, value_check=check_training_values, chunk_bytes=8)
    shard = f"{ref.prefix}/{manifest.shards[0].key}"
    raw = bytearray(memory_store.read(shard, 1 << 30))
    raw[-1] ^= 0x40
    memory_store.corrupt(shard, bytes(raw))
    with pytest.raises(E.IntegrityError, match="checksum"):
        fmt.verify_tensors(memory_store, ref, manifest)


def _forge_huge(store: LocalStore, *, shard_size: int) -> CheckpointRef:
    """A checkpoint whose manifest declares a 58 GiB tensor in a sparse shard file."""
    ref = _inference(store, {"a": np.arange(4.0)})
    huge = 58 << 30
    key = "zz/huge.bin"

    def forge(m: dict[str, Any]) -> None:
        m["shards"].append({"key": key, "rank": 0, "bytes": huge})
        m["tensors"].append(
            {
                "name": "huge",
                "dtype": "<f8",
                "shape": [huge // 8],
                "shard": key,
                "offset": 0,
                "length": huge,
                "checksum": "blake3:" + "0" * 64,
            }
        )
        m["total_bytes"] = sum(t["length"] for t in m["tensors"])

    rewrite_manifest(store, ref, forge)
    path = store.root / ref.prefix / key
    path.parent.mkdir(parents=True)
    with path.open("wb") as f:
        f.truncate(shard_size)  # sparse: no disk used
    return ref


@pytest.mark.parametrize("fault", ["bad-checksum-first", "missing-bytes"])
def test_verify_a_forged_58_gib_checkpoint_in_bounded_memory(local_store: LocalStore, fault: str) -> None:
    ref = _forge_huge(local_store, shard_size=(58 << 30) if fault == "bad-checksum-first" else 1 << 20)
    manifest = read_manifest(local_store, ref, expect_kind=INFERENCE)  # within the 64 GiB bound
    if fault == "bad-checksum-first":
        small = next(s for s in manifest.shards if s.key != "zz/huge.bin")
        path = local_store.root / ref.prefix / small.key
        path.write_bytes(b"\xff" * path.stat().st_size)
    err = refused_within_bounds(lambda: fmt.verify_tensors(local_store, ref, manifest), E.IntegrityError)
    assert ("tensors[a].checksum" if fault == "bad-checksum-first" else "shards[zz/huge.bin].bytes") in str(err)


def test_small_tensors_stored_at_odd_offsets_are_read_together_and_handed_over_aligned(
    memory_store: MemoryStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A raw shard packs tensors back to back, so a float64 after seven float32s lies at an odd
    offset: it is read with its neighbours in one request, then copied into an aligned array."""
    state = {
        "a": np.arange(7, dtype=np.float32),
        "b": np.arange(5, dtype=np.float64) / 3,
        "c": np.arange(3, dtype=np.int64),
        "d": np.arange(9, dtype=np.int16),
    }
    content = CheckpointContent(kind=CheckpointKind.TRAINING, run_id="odd", step=1)
    ref = write_checkpoint(memory_store, content, state).ref
    manifest = read_manifest(memory_store, ref, expect_kind=None)
    assert {e.name: e.offset for e in manifest.tensors}["b"] == 28
    reads: list[int] = []
    plain = memory_store.read_into
    monkeypatch.setattr(
        memory_store, "read_into", lambda key, offset, out: (reads.append(len(out)), plain(key, offset, out))[1]
    )
    got = fmt.read_tensors(memory_store, ref, manifest, value_check=check_training_values)
    assert reads == [sum(a.nbytes for a in state.values())]
    for name, want in state.items():
        assert got[name].dtype == want.dtype and got[name].tobytes() == want.tobytes(), name
        assert got[name].ctypes.data % want.itemsize == 0 and got[name].flags.aligned, name


def test_many_small_tensors_at_odd_offsets_restore_within_the_state_plus_ten_percent(
    local_store: LocalStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 3-byte mask puts every float32 after it at an odd offset: six hundred of them are read
    in runs of at most ``UNALIGNED_RUN_BYTES`` through a transient buffer each, every tensor
    copied out, so the restore neither peaks nor ends holding much beyond the state (no run kept
    alive beside the copies), in few requests."""
    import tracemalloc

    from cairn.checkpoint.placement import UNALIGNED_RUN_BYTES

    rng = np.random.default_rng(5)
    state = {"a/mask": np.array([True, False, True])}
    state.update({f"w/{k:04d}": rng.standard_normal(15_360).astype(np.float32) for k in range(600)})
    nbytes = sum(a.nbytes for a in state.values())
    content = CheckpointContent(kind=CheckpointKind.TRAINING, run_id="odd-many", step=1)
    ref = write_checkpoint(local_store, content, state).ref
    manifest = read_manifest(local_store, ref, expect_kind=None)
    reads: list[int] = []
    plain = local_store.read_into
    monkeypatch.setattr(
        local_store, "read_into", lambda key, offset, out: (reads.append(len(out)), plain(key, offset, out))[1]
    )
    tracemalloc.start()
    try:
        got = fmt.read_tensors(local_store, ref, manifest, value_check=check_training_values)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    for name, want in state.items():
        assert got[name].tobytes() == want.tobytes() and got[name].flags.aligned, name

    def owner(a: np.ndarray) -> np.ndarray:  # the allocation an array keeps alive
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a

    held = {id(o): o.nbytes for o in map(owner, got.values())}
    assert sum(held.values()) <= 1.1 * nbytes, sum(held.values()) / nbytes
    assert nbytes <= peak <= 1.1 * nbytes, peak / nbytes
    assert max(reads) <= UNALIGNED_RUN_BYTES and len(reads) <= len(state) // 3, (max(reads), len(reads))
