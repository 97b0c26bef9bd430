"""Lossless compression of checkpoint bytes (``cairn.checkpoint.codec``, ``.compression``): the
same state has one fingerprint whatever the codec, every read path restores it bit for bit, a
corrupt stored frame and a frame that decodes to other bytes are both refused with typed
errors, no frame inflates past its declared size, and ``auto`` compresses only where the store
is slower than the codec."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import CheckpointKind, CheckpointOptions, Limits, copy_checkpoint, read_manifest, verify_tensors
from cairn.checkpoint.codec import FRAME_BYTES, FRAME_OVERHEAD, MAX_FRAME_BYTES, decode_frame, encode_frame
from cairn.checkpoint.commit import write_checkpoint
from cairn.checkpoint.compression import RESAMPLE_SAVES, decide, forget_measurements, last_choice, record_write
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.manifest import Manifest, TensorEntry
from cairn.checkpoint.reader import read_logical, stream_logical
from cairn.checkpoint.ref import CheckpointRef
from cairn.checkpoint.reuse import referenced_of
from cairn.stores import LocalStore
from tests.conftest import refused_within_bounds, rewrite_manifest

pytestmark = pytest.mark.usefixtures("no_signing_key")

ZSTD = CheckpointOptions(compression="zstd")
OFF = CheckpointOptions(compression="off")


@pytest.fixture(autouse=True)
def _fresh_measurements() -> Iterator[None]:
    forget_measurements()
    yield
    forget_measurements()


def _state(seed: int = 0) -> dict[str, np.ndarray]:
    """Trained-like values (small normal weights; moments), every dtype a checkpoint holds, a
    tensor of several frames, tensors too small to encode and an empty one."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((1200, 1100)) * 0.02).astype(np.float32)  # 5.3 MB: several frames
    return {
        "theta/w": w,
        "adam.v/w": (w * w * 1e-3).astype(np.float32),
        "theta/bf16": w[:300].astype(ml_dtypes.bfloat16),
        "theta/f16": w[300:400].astype(np.float16),
        "theta/f64": w[:40].astype(np.float64),
        "ids": np.arange(40_000, dtype=np.int64),
        "mask": rng.random(100_000) > 0.5,
        "small": np.ones(7, np.float32),
        "empty": np.zeros((0, 3), np.float32),
    }


def _save(
    store: LocalStore, run_id: str, tensors: dict[str, np.ndarray], options: CheckpointOptions, **kw: Any
) -> CheckpointRef:
    content = CheckpointContent(kind=CheckpointKind.TRAINING, run_id=run_id, step=kw.pop("step", 1))
    return write_checkpoint(store, content, tensors, options=options, **kw).ref


def _manifest(store: LocalStore, ref: CheckpointRef) -> Manifest:
    return read_manifest(store, ref, expect_kind=None, options=OFF)


def _same(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert set(got) == set(want)
    for name, arr in want.items():
        assert got[name].dtype == arr.dtype and got[name].shape == arr.shape, name
        assert got[name].tobytes() == arr.tobytes(), name


@pytest.mark.parametrize("block_bytes", [None, 1 << 20], ids=["v1", "blocked"])
def test_a_compressed_checkpoint_restores_bit_exact_with_the_raw_ones_fingerprint(
    local_store: LocalStore, block_bytes: int | None
) -> None:
    state = _state()
    raw = _save(local_store, "raw", state, OFF, block_bytes=block_bytes)
    packed = _save(local_store, "packed", state, ZSTD, block_bytes=block_bytes)
    m_raw, m_packed = _manifest(local_store, raw), _manifest(local_store, packed)
    assert m_packed.fingerprint == m_raw.fingerprint  # one state, one fingerprint, whatever the codec
    assert m_packed.total_bytes == m_raw.total_bytes  # logical bytes
    encoded = [t for t in m_packed.tensors if t.encoding is not None]
    assert {t.name.split("#")[0] for t in encoded} >= {"theta/w", "adam.v/w", "ids"}
    assert all(t.encoding is None for t in m_packed.tensors if t.length < 64 << 10)  # too small to pay
    assert all(t.encoding is None for t in m_raw.tensors)
    stored, logical = sum(s.bytes for s in m_packed.shards), sum(s.bytes for s in m_raw.shards)
    assert stored < 0.9 * logical, (stored, logical)
    if block_bytes is None:
        frames = next(t for t in m_packed.tensors if t.name == "theta/w").encoding
        assert frames is not None and frames.frame_bytes == FRAME_BYTES
        assert len(frames.frames) == -(-state["theta/w"].nbytes // FRAME_BYTES) > 1
    _same(read_logical(local_store, packed, m_packed), state)
    verify_tensors(local_store, packed, m_packed, value_check=lambda name, chunk: None)
    buffer = np.empty(1 << 20, np.uint8)
    for name in ("theta/w", "theta/bf16", "empty"):
        got = b"".join(bytes(c) for c in stream_logical(local_store, packed, m_packed, name, buffer))
        assert got == state[name].tobytes(), name


def test_a_raw_entry_is_written_exactly_as_before() -> None:
    """Checkpoints saved before the codec, and raw entries now, have no ``encoding`` key: the
    same bytes, the same manifest schema, read as before."""
    entry = TensorEntry(name="a", dtype="<f4", shape=[2], shard="s", offset=0, length=8, checksum="blake3:" + "0" * 64)
    assert "encoding" not in json.loads(entry.model_dump_json())
    assert entry.stored_length == 8


def _entry_shard(store: LocalStore, ref: CheckpointRef, name: str) -> tuple[TensorEntry, Path]:
    entry = next(t for t in _manifest(store, ref).tensors if t.name == name)
    return entry, store.root / ref.prefix / entry.shard


def test_a_corrupt_stored_frame_is_refused_before_it_is_decoded_on_every_read_path(
    local_store: LocalStore, tmp_path: Path
) -> None:
    state = _state()
    ref = _save(local_store, "bad", state, ZSTD)
    entry, path = _entry_shard(local_store, ref, "theta/w")
    assert entry.encoding is not None
    data = bytearray(path.read_bytes())
    data[entry.offset + entry.encoding.frames[0].bytes // 2] ^= 0x01  # inside frame 0's payload
    path.write_bytes(bytes(data))
    manifest = _manifest(local_store, ref)
    where = "tensors[theta/w].encoding.frames[0]"
    reads = {
        "restore": lambda: read_logical(local_store, ref, manifest),
        "verify": lambda: verify_tensors(local_store, ref, manifest),
        "stream": lambda: list(stream_logical(local_store, ref, manifest, "theta/w", np.empty(1 << 20, np.uint8))),
        "copy": lambda: copy_checkpoint(local_store, ref, LocalStore(tmp_path / "copy"), options=OFF),
    }
    for what, read in reads.items():
        err = refused_within_bounds(read, E.IntegrityError)
        assert err.field == f"{where}.checksum", (what, err)
        assert "stored frame bytes do not match their checksum" in str(err), what


def test_a_frame_that_decodes_to_other_bytes_is_refused_by_the_logical_checksum(local_store: LocalStore) -> None:
    """Stored bytes that match their frame checksums but decode to another state (a writer's
    bug, or frames swapped by hand): the logical checksum refuses them."""
    state, other = _state(0), _state(1)
    ref = _save(local_store, "a", state, ZSTD)
    alien = _save(local_store, "b", other, ZSTD)
    mine, path = _entry_shard(local_store, ref, "theta/w")
    theirs, alien_path = _entry_shard(local_store, alien, "theta/w")
    assert mine.encoding is not None and theirs.encoding is not None
    frames = alien_path.read_bytes()[theirs.offset : theirs.offset + theirs.stored_length]
    key = f"{ref.prefix}/alien-shard.bin"
    local_store.write_object(key, [frames], size=len(frames))

    def swap(body: dict[str, Any]) -> None:
        body["shards"].append({"key": "alien-shard.bin", "rank": 0, "bytes": len(frames)})
        for t in body["tensors"]:
            if t["name"] == "theta/w":
                t.update(shard="alien-shard.bin", offset=0, encoding=theirs.encoding.model_dump())  # type: ignore[union-attr]

    rewrite_manifest(local_store, ref, swap)
    manifest = _manifest(local_store, ref)
    err = refused_within_bounds(lambda: read_logical(local_store, ref, manifest), E.IntegrityError)
    assert err.field == "tensors[theta/w].checksum" and "do not match their checksum" in str(err)
    err = refused_within_bounds(lambda: verify_tensors(local_store, ref, manifest), E.IntegrityError)
    assert err.field == "tensors[theta/w].checksum"


def test_a_frame_cannot_inflate_past_its_declared_logical_size(local_store: LocalStore) -> None:
    """A frame whose own header declares more bytes than the manifest gives it (a zip bomb: 64
    MiB of zeros encode to a few KiB) is refused from its header, before it is decoded."""
    ref = _save(local_store, "bomb", {"z": np.ones(1 << 16, np.float32)}, ZSTD)  # 256 KiB: one frame
    bomb, frame = encode_frame(memoryview(np.zeros(MAX_FRAME_BYTES, np.uint8)), 4)
    assert len(bomb) < 1 << 20
    key = f"{ref.prefix}/bomb.bin"
    local_store.write_object(key, [bomb], size=len(bomb))

    def plant(body: dict[str, Any]) -> None:
        body["shards"].append({"key": "bomb.bin", "rank": 0, "bytes": len(bomb)})
        (t,) = body["tensors"]
        t.update(shard="bomb.bin", offset=0)
        t["encoding"]["frames"] = [frame.model_dump()]

    rewrite_manifest(local_store, ref, plant)
    manifest = _manifest(local_store, ref)
    err = refused_within_bounds(lambda: read_logical(local_store, ref, manifest), E.IntegrityError)
    assert err.field == "tensors[z].encoding.frames[0]" and "header disagrees" in str(err)
    assert f"found {MAX_FRAME_BYTES} / {len(bomb)}" in str(err)


@pytest.mark.parametrize(
    ("change", "error", "field"),
    [
        (lambda enc, t: enc.update(codec="gzip"), E.ManifestError, "codec"),
        (lambda enc, t: enc.update(frame_bytes=MAX_FRAME_BYTES + 16), E.SizeLimitError, "encoding.frame_bytes"),
        (lambda enc, t: enc.update(frame_bytes=FRAME_BYTES - 2), E.TensorSpecError, "encoding.frame_bytes"),
        (lambda enc, t: enc.update(frame_bytes=1024), E.SizeLimitError, "encoding.frame_bytes"),
        (lambda enc, t: enc["frames"].append(enc["frames"][0]), E.TensorSpecError, "encoding.frames"),
        (
            lambda enc, t: enc["frames"][0].update(bytes=t["length"] + FRAME_OVERHEAD + 1),
            E.SizeLimitError,
            "encoding.frames[0].bytes",
        ),
    ],
    ids=[
        "unknown-codec",
        "frame-too-large",
        "partial-elements",
        "frames-too-small-to-bound-their-count",
        "extra-frame",
        "stored-larger-than-it-can-be",
    ],
)
def test_an_encoding_outside_what_this_build_writes_is_refused_from_the_manifest(
    local_store: LocalStore, change: Any, error: type[E.CairnError], field: str
) -> None:
    ref = _save(local_store, "forged", {"x": np.ones(1 << 17, np.float32)}, ZSTD)

    def forge(body: dict[str, Any]) -> None:
        (t,) = body["tensors"]
        change(t["encoding"], t)
        body["shards"][0]["bytes"] += 1 << 20  # room, so the bound under test is the one that fires
        with open(local_store.root / ref.prefix / body["shards"][0]["key"], "ab") as f:
            f.write(b"\0" * (1 << 20))

    rewrite_manifest(local_store, ref, forge)
    err = refused_within_bounds(lambda: _manifest(local_store, ref), error)
    assert field in str(err), err


def test_incremental_saves_reference_compressed_blocks_and_restore_them(local_store: LocalStore) -> None:
    state = _state()
    first = _save(local_store, "inc", state, ZSTD, block_bytes=1 << 20, incremental=True, step=1)
    changed = dict(state, **{"theta/bf16": (state["theta/bf16"].astype(np.float32) + 1).astype(ml_dtypes.bfloat16)})
    second = _save(local_store, "inc", changed, ZSTD, block_bytes=1 << 20, incremental=True, step=2)
    manifest = _manifest(local_store, second)
    linked = {k for r in manifest.indexes or [] for k in r.linked}
    reused = [t for t in manifest.tensors if t.shard in linked]
    assert reused and any(t.encoding is not None for t in reused)  # compressed blocks referenced as stored
    assert referenced_of(manifest).referenced_bytes > 0
    _same(read_logical(local_store, second, manifest), changed)
    _same(read_logical(local_store, first, _manifest(local_store, first)), state)


def test_a_copy_of_a_compressed_checkpoint_keeps_its_frames_and_fingerprint(
    local_store: LocalStore, tmp_path: Path
) -> None:
    state = _state()
    ref = _save(local_store, "copied", state, ZSTD, block_bytes=1 << 20)
    dest = LocalStore(tmp_path / "dest")
    result = copy_checkpoint(local_store, ref, dest, options=OFF)
    source, copy = _manifest(local_store, ref), _manifest(dest, result.ref)
    assert copy.fingerprint == source.fingerprint
    assert sum(s.bytes for s in copy.shards) == sum(s.bytes for s in source.shards)  # moved as stored
    assert {t.name: t.encoding for t in copy.tensors} == {t.name: t.encoding for t in source.tensors}
    _same(read_logical(dest, result.ref, copy), state)


def test_the_options_and_the_environment_take_only_known_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(E.ConfigError, match=r"checkpoint.compression.*off \| zstd \| auto.*gzip"):
        CheckpointOptions(compression="gzip")
    monkeypatch.setenv("CAIRN_COMPRESSION", "fast")
    with pytest.raises(E.ConfigError, match="CAIRN_COMPRESSION"):
        CheckpointOptions.from_env()
    monkeypatch.setenv("CAIRN_COMPRESSION", "AUTO")
    assert CheckpointOptions.from_env().compression == "auto"
    monkeypatch.delenv("CAIRN_COMPRESSION")
    assert CheckpointOptions.from_env().compression == "off"


def test_auto_compresses_only_where_the_store_is_slower_than_the_codec() -> None:
    state = _state()
    first = decide("auto", "s3://slow", state)
    assert not first.compress and first.store_mb_s is None and "not measured" in first.why
    assert first.codec_mb_s and first.ratio and first.ratio > 1.1  # the sample is measured at once
    record_write("s3://slow", 40_000_000, 2.0)  # 20 MB/s: a network store
    slow = decide("auto", "s3://slow", state)
    assert slow.compress and slow.store_mb_s == pytest.approx(20.0), slow
    assert last_choice("s3://slow") == slow
    record_write("file:///fast", 40_000_000_000, 1.0)  # 40 GB/s: faster than any codec here
    fast = decide("auto", "file:///fast", state)
    assert not fast.compress and "estimated save" in fast.why, fast
    noise = {"r": np.random.default_rng(3).integers(0, 256, 8 << 20, dtype=np.uint8)}  # incompressible
    record_write("s3://noise", 40_000_000, 2.0)
    assert not decide("auto", "s3://noise", noise).compress
    assert decide("zstd", "file:///fast", state).compress and not decide("off", "s3://slow", state).compress


def test_an_auto_save_to_a_slow_store_is_written_compressed(local_store: LocalStore) -> None:
    """The decision reaches the shards: once the store measured slow, ``auto`` writes frames."""
    state = _state()
    auto = CheckpointOptions(compression="auto")
    first = _manifest(local_store, _save(local_store, "auto", state, auto, step=1))
    assert all(t.encoding is None for t in first.tensors)  # bandwidth unknown: raw, measured
    record_write(local_store.url, 1 << 30, 100.0)  # as if the disk took 10 MB/s
    second = _manifest(local_store, _save(local_store, "auto", state, auto, step=2))
    assert any(t.encoding is not None for t in second.tensors)
    choice = last_choice(local_store.url)
    assert choice is not None and choice.compress and choice.mode == "auto"
    _same(read_logical(local_store, _ref(local_store, 2), second), state)


def _ref(store: LocalStore, step: int) -> CheckpointRef:
    return CheckpointRef(store.url, "auto", CheckpointKind.TRAINING, step)


def test_frames_are_encoded_and_decoded_with_the_interpreter_lock_released() -> None:
    """What lets a save's encoding thread run beside its writer and hashing threads: the binding
    holds the lock through every call unless ``set_releasegil`` says otherwise."""
    import blosc2

    data = np.arange(1 << 16, dtype=np.float32)
    stored, frame = encode_frame(memoryview(data).cast("B"), 4)
    out = np.empty_like(data)
    decode_frame(memoryview(stored), memoryview(out).cast("B"), frame, "t")
    assert np.array_equal(out, data)
    assert blosc2.set_releasegil(True) is True  # returns the setting it replaces


def test_frames_hold_whole_elements_of_every_width() -> None:
    assert all(FRAME_BYTES % width == 0 for width in (1, 2, 4, 8, 16))


@pytest.mark.parametrize("flip", [False, True], ids=["uploaded", "a-flipped-byte-is-never-uploaded"])
def test_the_local_tier_uploads_frames_as_stored_each_checked(tmp_path: Path, flip: bool) -> None:
    from cairn.checkpoint import latest_committed
    from tests.unit.checkpoint.test_tier import _tier, _uploader

    durable = LocalStore(tmp_path / "durable")
    node, tiered = _tier(tmp_path, durable)
    state = _state()
    content = CheckpointContent(kind=CheckpointKind.TRAINING, run_id="tiered", step=1)
    local = write_checkpoint(tiered, content, state, options=ZSTD).manifest
    entry = next(t for t in local.tensors if t.name == "theta/w")
    assert entry.encoding is not None
    if flip:  # inside the tensor's last frame, on the node's disk
        path = tiered.local.root / f"tiered/training/{1:012d}" / entry.shard
        data = bytearray(path.read_bytes())
        data[entry.offset + entry.stored_length - 100] ^= 0x01
        path.write_bytes(bytes(data))
    _uploader(node).drain()
    if flip:
        assert latest_committed(durable, "tiered") is None and node.stats.discarded == 1
        return
    ref = latest_committed(durable, "tiered")
    assert ref is not None
    uploaded = _manifest(durable, ref)
    assert uploaded.fingerprint == local.fingerprint
    assert sum(s.bytes for s in uploaded.shards) == sum(s.bytes for s in local.shards)  # as stored
    _same(read_logical(durable, ref, uploaded), state)


def test_a_junk_frame_list_is_refused_at_its_first_junk_frame(local_store: LocalStore) -> None:
    """A forged list of 300,000 empty frames: one error, in bounded memory, not one per field
    of every frame (which took gigabytes before ``fail_fast``)."""
    ref = _save(local_store, "junk", {"x": np.ones(1 << 17, np.float32)}, ZSTD)

    def junk(body: dict[str, Any]) -> None:
        body["tensors"][0]["encoding"]["frames"] = [{}] * 300_000

    rewrite_manifest(local_store, ref, junk)
    options = CheckpointOptions(compression="off", limits=Limits(max_manifest_bytes=64 << 20))
    err = refused_within_bounds(
        lambda: read_manifest(local_store, ref, expect_kind=None, options=options), E.ManifestError
    )
    assert "encoding.frames.0.bytes" in str(err), err


def test_a_blocked_save_of_large_blocks_commits_compressed(local_store: LocalStore) -> None:
    """Each frame adds its record to its block's index entry: the index bound counts frames, so
    blocks of many frames commit (they were refused as an oversized index before)."""
    w = (np.random.default_rng(0).standard_normal(12 << 20) * 0.02).astype(np.float32)  # 48 MiB
    ref = _save(local_store, "big", {"w": w}, ZSTD, block_bytes=64 << 20)  # one block of 48 frames
    manifest = _manifest(local_store, ref)
    assert [len(t.encoding.frames) for t in manifest.tensors if t.encoding] == [48]
    _same(read_logical(local_store, ref, manifest), {"w": w})


def test_auto_saves_raw_now_and_then_to_measure_the_store_again() -> None:
    """The store is measured by raw saves only, so after ``RESAMPLE_SAVES`` compressed saves one
    is raw; a store that became fast is then seen as fast."""
    state = _state()
    record_write("s3://slow", 40_000_000, 2.0)
    choices = [decide("auto", "s3://slow", state) for _ in range(RESAMPLE_SAVES + 2)]
    assert [c.compress for c in choices] == [True] * RESAMPLE_SAVES + [False, True]
    assert "re-measures the store" in choices[RESAMPLE_SAVES].why


def test_a_compressed_restore_holds_little_beyond_the_state(local_store: LocalStore) -> None:
    """Frames are read in runs into buffers of their own, at most ``max_workers`` at once and
    5% of the state (at least 4 MiB) in flight: a 64 MiB restore peaks within 10% of it."""
    import tracemalloc

    w = (np.random.default_rng(0).standard_normal(16 << 20) * 0.02).astype(np.float32)  # 64 MiB
    ref = _save(local_store, "rss", {"w": w}, ZSTD)
    manifest = _manifest(local_store, ref)
    tracemalloc.start()
    try:
        got = read_logical(local_store, ref, manifest)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    _same(got, {"w": w})
    assert w.nbytes <= peak <= 1.1 * w.nbytes, peak / w.nbytes


class _CountingStore(LocalStore):
    """A local store that counts its reads: plain ranged reads and runs of frames."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.reads: list[tuple[str, int, int]] = []

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self.reads.append(("read_into", offset, len(out)))
        super().read_into(key, offset, out)

    def read_spans(self, key: str, offset: int, sizes: Any, buffer: memoryview) -> Any:
        self.reads.append(("read_spans", offset, sum(sizes)))
        return super().read_spans(key, offset, sizes, buffer)


def test_a_compressed_shard_stores_its_small_tensors_together_and_a_restore_reads_them_at_once(
    tmp_path: Path,
) -> None:
    """Small tensors (stored raw) named between encoded ones lie back to back from the shard's
    start, so a restore reads them all with one request — not one request each behind every
    encoded tensor's odd-sized bytes — and hands each over aligned, even one stored at an odd
    offset (the float64 after 7 float32s)."""
    rng = np.random.default_rng(3)
    big = {f"{k}/big": (rng.standard_normal(50_000) * 0.02).astype(np.float32) for k in "bdf"}
    small = {
        "a/small": np.ones(7, np.float32),
        "c/small": np.arange(5, dtype=np.float64),
        "e/small": np.arange(3, dtype=np.int64),
        "g/small": np.ones(9, np.float16),
        "h/small": np.arange(11, dtype=np.int32),
    }
    state = {**big, **small}
    store = _CountingStore(tmp_path / "store")
    ref = _save(store, "small-first", state, ZSTD)
    for where, at in [(store, ref), (copied := LocalStore(tmp_path / "copy"), copy_checkpoint(store, ref, copied).ref)]:
        entries = {e.name: e for e in _manifest(where, at).tensors}  # a copy keeps the order
        assert all(entries[n].encoding is not None for n in big)
        raw = sorted((entries[n] for n in small), key=lambda e: e.offset)
        assert raw[0].offset == 0
        assert all(a.offset + a.length == b.offset for a, b in zip(raw, raw[1:], strict=False))
    manifest = _manifest(store, ref)
    entries = {e.name: e for e in manifest.tensors}
    assert entries["c/small"].offset % 8 != 0  # stored unaligned, as in a raw shard
    store.reads.clear()
    got = read_logical(store, ref, manifest)
    _same(got, state)
    assert all(got[n].ctypes.data % got[n].itemsize == 0 for n in small)
    small_bytes = sum(a.nbytes for a in small.values())
    assert [r for r in store.reads if r[1] < small_bytes] == [("read_into", 0, small_bytes)], store.reads
    runs = sorted((o, n) for kind, o, n in store.reads if kind == "read_spans")
    assert runs == sorted((entries[n].offset, entries[n].stored_length) for n in big)
