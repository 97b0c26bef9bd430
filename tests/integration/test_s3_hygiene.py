"""S3 hygiene on a real SeaweedFS server: uploads a crashed writer left incomplete are collected
(and young ones kept), small objects are one PutObject, and malformed keys are refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from cairn import errors as E
from cairn.stores.s3 import S3Store
from tests.integration.conftest import S3Server

pytestmark = pytest.mark.integration
MiB = 1 << 20


def _open_uploads(store: S3Store) -> list[str]:
    """Keys (relative to the store) of the incomplete multipart uploads under the store."""
    base = store.prefix + "/"
    resp = store.client.list_multipart_uploads(Bucket=store.bucket, Prefix=base)
    return sorted(u["Key"][len(base) :] for u in resp.get("Uploads", []))


def _start_upload(store: S3Store, key: str) -> None:
    """Begin a multipart upload with one part, as a writer that then crashed would leave it."""
    full = store._key(key)
    upload_id = store.client.create_multipart_upload(Bucket=store.bucket, Key=full)["UploadId"]
    store.client.upload_part(Bucket=store.bucket, Key=full, UploadId=upload_id, PartNumber=1, Body=b"x" * 1024)


@pytest.fixture
def s3_calls(s3_store: S3Store) -> Iterator[list[str]]:
    """The names of the S3 operations ``s3_store`` issues, in order (botocore's event system)."""
    seen: list[str] = []

    def record(model: object, **_: object) -> None:
        seen.append(str(getattr(model, "name", model)))

    s3_store.client.meta.events.register("before-call.s3.*", record)
    yield seen
    s3_store.client.meta.events.unregister("before-call.s3.*", record)


def test_stale_upload_is_aborted(s3_store: S3Store) -> None:
    _start_upload(s3_store, "run/training/000000000004/shard-0.bin")
    _start_upload(s3_store, "other/training/000000000001/shard-0.bin")
    assert len(_open_uploads(s3_store)) == 2
    aborted = s3_store.abort_stale_uploads("run/", older_than_seconds=0)
    assert aborted == ["run/training/000000000004/shard-0.bin"]
    assert _open_uploads(s3_store) == ["other/training/000000000001/shard-0.bin"]  # outside the prefix
    assert s3_store.abort_stale_uploads("", older_than_seconds=0) == ["other/training/000000000001/shard-0.bin"]
    assert _open_uploads(s3_store) == []
    assert not s3_store.exists("run/training/000000000004/shard-0.bin")


def test_young_upload_is_kept(s3_store: S3Store) -> None:
    _start_upload(s3_store, "run/training/000000000004/shard-0.bin")
    assert s3_store.abort_stale_uploads("run/", older_than_seconds=3600) == []
    assert _open_uploads(s3_store) == ["run/training/000000000004/shard-0.bin"]
    # A dry run names what would go, and aborts nothing.
    assert s3_store.stale_uploads("run/", older_than_seconds=0) == ["run/training/000000000004/shard-0.bin"]
    assert s3_store.stale_uploads("run/", older_than_seconds=0, now=0.0) == []  # "now" before it began
    assert _open_uploads(s3_store) == ["run/training/000000000004/shard-0.bin"]
    s3_store.abort_stale_uploads("run/", older_than_seconds=0)


def test_stale_uploads_are_paged_through(s3_store: S3Store, s3_calls: list[str]) -> None:
    keys = [f"run/training/{step:012d}/shard-0.bin" for step in range(5)]
    for key in keys:
        _start_upload(s3_store, key)
    s3_store.client.meta.events.register(
        "before-parameter-build.s3.ListMultipartUploads", lambda params, **_: params.update(MaxUploads=2)
    )
    assert sorted(s3_store.abort_stale_uploads("run/", older_than_seconds=0)) == keys
    assert s3_calls.count("ListMultipartUploads") >= 3  # 2 + 2 + 1
    assert _open_uploads(s3_store) == []


def test_small_write_of_unknown_size_is_one_put(s3_store: S3Store, s3_calls: list[str]) -> None:
    """A pin (40 bytes, size not given) was three multipart requests; a large stream still is."""
    s3_store.write_object("run/pins/best.json", [b'{"kind": "training", ', b'"step": 4}'])
    assert s3_calls == ["PutObject"]
    assert s3_store.read("run/pins/best.json", 1 << 30) == b'{"kind": "training", "step": 4}'
    s3_calls.clear()
    data = bytes(range(256)) * (s3_store.part_size // 256) + b"tail"  # one part and a bit
    s3_store.write_object("run/big.bin", (data[i : i + MiB] for i in range(0, len(data), MiB)))
    assert s3_calls == ["CreateMultipartUpload", "UploadPart", "UploadPart", "CompleteMultipartUpload"]
    assert s3_store.read("run/big.bin", 1 << 30) == data
    assert _open_uploads(s3_store) == []


def _upload_headers(store: S3Store) -> list[dict[str, str]]:
    """The headers of the requests with a body (two parts and a put) an upload of two parts and a
    small put send; the bytes read back."""
    sent: list[tuple[str, dict[str, str]]] = []

    def record(request: Any, **_: object) -> None:
        headers = {k.lower(): v.decode() if isinstance(v, bytes) else str(v) for k, v in request.headers.items()}
        sent.append((request.method, headers))

    store.client.meta.events.register("before-send.s3.*", record)
    try:
        data = bytes(range(256)) * (store.part_size // 256) + b"tail"  # two parts
        store.write_object("run/big.bin", (data[i : i + MiB] for i in range(0, len(data), MiB)))
        store.write_object("run/small.bin", [b"12345"], size=5)
    finally:
        store.client.meta.events.unregister("before-send.s3.*", record)
    assert store.read("run/big.bin", 1 << 30) == data
    assert store.read("run/small.bin", 1 << 30) == b"12345"
    return [headers for method, headers in sent if method == "PUT"]


def test_uploads_carry_a_checksum_and_leave_the_body_out_of_the_signature(s3_store: S3Store) -> None:
    """Parts and puts say UNSIGNED-PAYLOAD (no SHA-256 of every byte on the client, on this http
    endpoint too) and carry the CRC32 of their body in a signed header."""
    bodies = _upload_headers(s3_store)
    assert len(bodies) == 3
    for headers in bodies:
        assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
        assert "x-amz-checksum-crc32" in headers
        assert "x-amz-checksum-crc32" in headers["authorization"]  # the checksum is signed


def test_uploads_without_a_checksum_keep_their_body_signed(
    seaweedfs: S3Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where botocore sends checksums only when required (servers without checksum support), a
    body's SHA-256 stays in the signature: no upload goes out with neither."""
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", "when_required")
    store = seaweedfs.store(part_size=5 << 20, max_concurrency=4)
    try:
        bodies = _upload_headers(store)
    finally:
        store.close()
    assert len(bodies) == 3
    for headers in bodies:
        assert "x-amz-checksum-crc32" not in headers
        assert len(headers["x-amz-content-sha256"]) == 64  # the hex SHA-256 of the body, signed
        assert "x-amz-content-sha256" in headers["authorization"]


def test_small_write_of_known_size_is_one_put(s3_store: S3Store, s3_calls: list[str]) -> None:
    s3_store.write_object("run/a.bin", [b"12345"], size=5)
    s3_store.write_object("run/empty.bin", [])
    assert s3_calls == ["PutObject", "PutObject"]
    assert s3_store.read("run/empty.bin", 1 << 30) == b""


@pytest.mark.parametrize("key", ["../escape", "run//x", "run/./x", "/abs", "a\x00b", "a\nb"])
def test_malformed_keys_are_invalid_not_retryable(s3_store: S3Store, key: str, s3_calls: list[str]) -> None:
    for call in (
        lambda: s3_store.read(key, 1 << 30),
        lambda: s3_store.size(key),
        lambda: s3_store.write_object(key, [b"x"]),
        lambda: s3_store.put_if_absent(key, b"x"),
        lambda: s3_store.delete([key]),
    ):
        with pytest.raises(E.InvalidObjectError):
            call()
    assert s3_calls == []  # refused before anything went on the wire


def test_retention_and_ckpt_gc_abort_a_crashed_writers_upload(s3_store: S3Store) -> None:
    """What a worker killed mid-upload leaves behind is collected by the run's retention (and
    `cairn ckpt gc`), after the grace period — a dry run only names it."""
    from cairn.checkpoint.retention import RetentionPolicy, collect_garbage

    key = "run/training/000000000004/0123456789abcdef/rank000-0000.bin"
    _start_upload(s3_store, key)
    policy = RetentionPolicy(keep_last=1, grace_seconds=0)
    assert collect_garbage(s3_store, "run", policy, dry_run=True).aborted_uploads == [key]
    assert _open_uploads(s3_store) == [key]
    assert collect_garbage(s3_store, "run", policy).aborted_uploads == [key]
    assert _open_uploads(s3_store) == []
