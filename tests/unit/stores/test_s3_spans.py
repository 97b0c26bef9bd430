"""``read_spans``: consecutive spans of an object, one span's memory at a time. The S3 store reads
them with one ranged GET (a compressed restore's frames: one request a run of frames, not one a
frame), and reads on range by range when the stream breaks or the server ignores the range."""

from __future__ import annotations

import numpy as np
import pytest
from botocore.exceptions import ResponseStreamingError

from cairn import errors as E
from cairn.checkpoint import CheckpointOptions, read_manifest, write_checkpoint
from cairn.checkpoint.content import CheckpointContent
from cairn.checkpoint.manifest import CheckpointKind
from cairn.checkpoint.reader import read_tensors
from cairn.stores.memory import MemoryStore
from cairn.stores.s3_retry import InflightLimit
from tests.unit.stores.test_s3_retry import MiB, ScriptedClient, _store, client_error

SIZES = [100_000, 70_000, 1, 250_000, 33_333]


def data() -> bytes:
    return bytes(np.random.default_rng(0).integers(0, 256, sum(SIZES) + 4096, dtype=np.uint8))


def spans_of(store: object, key: str, offset: int) -> list[bytes]:
    buffer = memoryview(bytearray(max(SIZES)))
    return [bytes(v) for v in store.read_spans(key, offset, SIZES, buffer)]  # type: ignore[attr-defined]


def expected(raw: bytes, offset: int) -> list[bytes]:
    out, at = [], offset
    for size in SIZES:
        out.append(raw[at : at + size])
        at += size
    return out


def test_the_base_store_reads_each_span_into_the_one_buffer() -> None:
    store, raw = MemoryStore("spans"), data()
    store.write_object("k/obj.bin", [raw], size=len(raw))
    assert spans_of(store, "k/obj.bin", 17) == expected(raw, 17)


def test_s3_reads_every_span_with_one_ranged_get() -> None:
    client = ScriptedClient(client_error("InternalError", 500), 10**9, ())
    store, raw = _store(client), data()
    client.objects["p/k/obj.bin"] = raw
    assert spans_of(store, "k/obj.bin", 4000) == expected(raw, 4000)
    assert client.gets == 1 and client.body_bytes == sum(SIZES)
    store.close()


def test_a_stream_that_breaks_off_is_read_on_range_by_range() -> None:
    client = ScriptedClient(ResponseStreamingError(error="reset"), 3, ("body",))
    store, raw = _store(client, inflight=InflightLimit(1)), data()  # the stream's slot is freed first
    client.objects["p/k/obj.bin"] = raw
    assert spans_of(store, "k/obj.bin", 5) == expected(raw, 5)
    assert client.failed >= 1 and client.gets > 1
    store.close()


def test_a_server_ignoring_the_range_is_not_read_from_and_the_ranged_reads_refuse_it() -> None:
    client = ScriptedClient(client_error("InternalError", 500), 10**9, ())
    store, raw = _store(client), data()
    client.objects["p/k/obj.bin"] = raw
    client.ignore_range = True
    with pytest.raises(E.StorageError):
        spans_of(store, "k/obj.bin", 0)
    assert client.body_bytes <= SIZES[0] + 1  # the whole object was never taken
    store.close()


def test_a_compressed_restore_asks_s3_once_for_a_run_of_frames() -> None:
    client = ScriptedClient(client_error("InternalError", 500), 10**9, ())
    store = _store(client)
    rng = np.random.default_rng(1)
    tensors = {"w": (rng.standard_normal(3 * MiB) * 0.01).astype(np.float32)}  # 12 MiB, 12 frames
    content = CheckpointContent(kind=CheckpointKind.INFERENCE, run_id="spans", step=1)
    ref = write_checkpoint(store, content, tensors, options=CheckpointOptions(compression="zstd")).ref
    manifest = read_manifest(store, ref, expect_kind=CheckpointKind.INFERENCE)
    entry = manifest.tensors[0]
    assert entry.encoding is not None and len(entry.encoding.frames) == 12
    client.gets = 0
    out = read_tensors(store, ref, manifest, max_workers=4)
    assert out["w"].tobytes() == tensors["w"].tobytes()
    # pieces of the store's 5 MiB part size: 12 MiB logical, about 10 MiB stored, in 3 or fewer
    # requests (one a frame before: 12)
    assert client.gets <= 3, client.gets
    store.close()


def test_a_streaming_get_holds_an_in_flight_slot_until_its_body_is_done() -> None:
    client = ScriptedClient(client_error("InternalError", 500), 10**9, ())
    store, raw = _store(client, inflight=InflightLimit(1)), data()
    client.objects["p/k/obj.bin"] = raw
    spans = store.read_spans("k/obj.bin", 0, SIZES, memoryview(bytearray(max(SIZES))))
    next(spans)  # the body is streaming
    assert store.inflight._busy == 1  # its transfer counts as the request in flight
    rest = [bytes(v) for v in spans]
    assert rest == expected(raw, 0)[1:] and store.inflight._busy == 0
    store.close()


def test_a_buffer_smaller_than_a_span_is_refused_before_any_read() -> None:
    client = ScriptedClient(client_error("InternalError", 500), 10**9, ())
    store = _store(client)
    client.objects["p/k/obj.bin"] = data()
    for s in (store, MemoryStore("small")):
        with pytest.raises(ValueError, match="does not fit"):
            next(s.read_spans("k/obj.bin", 0, SIZES, memoryview(bytearray(10))))
    assert client.gets == 0
    store.close()


def test_an_error_mid_body_that_is_no_broken_stream_is_raised_not_read_around() -> None:
    client = ScriptedClient(ValueError("not a transport fault"), 2, ("body",))
    store, raw = _store(client), data()
    client.objects["p/k/obj.bin"] = raw
    with pytest.raises(ValueError, match="not a transport fault"):
        spans_of(store, "k/obj.bin", 0)
    assert client.gets == 1  # no ranged read went around it
    store.close()
