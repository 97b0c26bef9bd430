"""The S3 store's retry policy (``cairn.stores.s3_retry``): which failures are retried, the
backoff schedule (capped exponential, full jitter), the in-flight bound, and the store applying
them to every request — parts and ranged GETs included — against a scripted client."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from cairn import errors as E
from cairn.stores.s3 import S3Store
from cairn.stores.s3_retry import (
    Fault,
    InflightLimit,
    RetryPolicy,
    call_with_retries,
    classify,
    inflight_from_env,
)
from cairn.stores.s3_stream import STREAM_READ_BYTES

MiB = 1 << 20


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


@pytest.mark.parametrize(
    ("exc", "fault"),
    [
        (client_error("SlowDown", 503), Fault.THROTTLED),
        (client_error("", 503), Fault.THROTTLED),
        (client_error("TooManyRequests", 429), Fault.THROTTLED),
        (client_error("Throttling", 400), Fault.THROTTLED),
        (client_error("RequestTimeout", 400), Fault.TRANSIENT),
        (client_error("InternalError", 500), Fault.TRANSIENT),
        (client_error("", 502), Fault.TRANSIENT),
        (client_error("", 504), Fault.TRANSIENT),
        (EndpointConnectionError(endpoint_url="http://x"), Fault.TRANSIENT),
        (ConnectionClosedError(endpoint_url="http://x"), Fault.TRANSIENT),
        (ReadTimeoutError(endpoint_url="http://x"), Fault.TRANSIENT),
        (ResponseStreamingError(error="connection reset by peer"), Fault.TRANSIENT),
        (client_error("NoSuchKey", 404), None),
        (client_error("PreconditionFailed", 412), None),
        (client_error("ConditionalRequestConflict", 409), None),
        (client_error("AccessDenied", 403), None),
        (NoCredentialsError(), None),
    ],
)
def test_what_is_retried(exc: BaseException, fault: Fault | None) -> None:
    assert classify(exc) is fault


def test_the_backoff_is_capped_exponential_with_full_jitter() -> None:
    policy = RetryPolicy(attempts=20, base_s=0.05, throttle_base_s=1.0, cap_s=8.0)
    for fault, base in ((Fault.THROTTLED, 1.0), (Fault.TRANSIENT, 0.05)):
        ceilings = [policy.ceiling(n, fault) for n in range(1, 20)]
        assert ceilings[0] == base  # the first retry waits at most the base
        assert all(a <= b for a, b in zip(ceilings, ceilings[1:], strict=False))  # monotone
        assert max(ceilings) == 8.0 and ceilings[-1] == 8.0  # capped, and stays at the cap
        assert all(b == min(8.0, 2 * a) for a, b in zip(ceilings, ceilings[1:], strict=False))  # doubling
    # full jitter: anywhere in [0, ceiling], the whole range reached
    assert policy.delay(4, Fault.THROTTLED, rand=lambda: 0.0) == 0.0
    assert policy.delay(4, Fault.THROTTLED, rand=lambda: 1.0) == 8.0
    assert policy.delay(3, Fault.THROTTLED, rand=lambda: 0.5) == 2.0
    waits = [policy.delay(6, Fault.THROTTLED) for _ in range(2000)]
    assert all(0.0 <= w <= 8.0 for w in waits)
    assert min(waits) < 1.0 and max(waits) > 7.0  # spread over the range, not a fixed step
    assert policy.ceiling(10**6, Fault.THROTTLED) == 8.0  # no overflow, however many attempts


def test_retries_sleep_the_schedule_and_stop_at_the_attempts() -> None:
    slept: list[float] = []
    failures = iter([client_error("SlowDown", 503)] * 3)

    def request() -> str:
        exc = next(failures, None)
        if exc is not None:
            raise exc
        return "ok"

    policy = RetryPolicy(attempts=4, cap_s=1.5)
    assert call_with_retries(request, policy, InflightLimit(1), sleep=slept.append, rand=lambda: 1.0) == "ok"
    assert slept == [1.0, 1.5, 1.5]  # throttled base 1 s, doubled, capped

    slept.clear()
    with pytest.raises(ClientError):  # the last failure is raised, after attempts - 1 waits
        call_with_retries(_always(client_error("", 500)), RetryPolicy(attempts=3), InflightLimit(1), sleep=slept.append)
    assert len(slept) == 2
    slept.clear()
    with pytest.raises(ClientError):  # an answer, not a fault: at once
        call_with_retries(_always(client_error("NoSuchKey", 404)), RetryPolicy(), InflightLimit(1), sleep=slept.append)
    assert slept == []


def _always(exc: BaseException) -> Any:
    def request() -> None:
        raise exc

    return request


def test_settings_from_the_environment() -> None:
    assert RetryPolicy.from_env({}) == RetryPolicy()
    policy = RetryPolicy.from_env({"CAIRN_S3_MAX_ATTEMPTS": "3", "CAIRN_S3_BACKOFF_CAP_S": "2.5"})
    assert (policy.attempts, policy.cap_s) == (3, 2.5)
    for bad in ({"CAIRN_S3_MAX_ATTEMPTS": "0"}, {"CAIRN_S3_MAX_ATTEMPTS": "2.5"}, {"CAIRN_S3_BACKOFF_CAP_S": "inf"}):
        with pytest.raises(E.ConfigError):
            RetryPolicy.from_env(bad)
    assert inflight_from_env({}) == 64
    assert inflight_from_env({"CAIRN_S3_MAX_INFLIGHT": "16"}) == 16
    host = {"CAIRN_S3_MAX_INFLIGHT_HOST": "64", "LOCAL_WORLD_SIZE": "8"}
    assert inflight_from_env(host) == 8  # the host's budget shared by its 8 ranks
    assert inflight_from_env({**host, "CAIRN_S3_MAX_INFLIGHT": "4"}) == 4
    assert inflight_from_env({"CAIRN_S3_MAX_INFLIGHT_HOST": "4", "LOCAL_WORLD_SIZE": "8"}) == 1
    with pytest.raises(E.ConfigError):
        inflight_from_env({"CAIRN_S3_MAX_INFLIGHT": "none"})


class ScriptedClient:
    """Answers S3 calls from memory; every ``fail_every``-th call of a listed operation raises
    ``failure`` (or, with ``fail_at``, the calls of those numbers); tracks the calls in flight at
    once and the largest single body read."""

    def __init__(self, failure: BaseException, fail_every: int, ops: tuple[str, ...], hold_s: float = 0.0) -> None:
        self.failure, self.fail_every, self.ops, self.hold_s = failure, fail_every, ops, hold_s
        self.objects: dict[str, bytes] = {}
        self.parts: dict[tuple[str, int], bytes] = {}
        self.calls: dict[str, int] = {}
        self.part_calls: dict[int, int] = {}
        self.failed = 0
        self.busy = self.peak = 0
        self.lock = threading.Lock()
        self.ignore_range = False
        self.short_bodies = 0
        self.body_bytes = 0
        self.gets = 0
        self.fail_at: set[int] | None = None
        self.largest_read = 0
        self.open_bodies = 0

    def _enter(self, op: str) -> None:
        with self.lock:
            self.calls[op] = self.calls.get(op, 0) + 1
            self.busy += 1
            self.peak = max(self.peak, self.busy)
            count = self.calls[op]
            fail = op in self.ops and (count % self.fail_every == 0 if self.fail_at is None else count in self.fail_at)
            self.failed += fail
        try:
            time.sleep(self.hold_s)
            if fail:
                raise self.failure
        finally:
            with self.lock:
                self.busy -= 1

    def put_object(self, Bucket: str, Key: str, Body: bytes, **_: Any) -> dict[str, Any]:  # noqa: N803
        self._enter("put_object")
        self.objects[Key] = bytes(Body)
        return {}

    def create_multipart_upload(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        self._enter("create_multipart_upload")
        return {"UploadId": "u1"}

    def upload_part(self, Bucket: str, Key: str, UploadId: str, PartNumber: int, Body: bytes) -> dict[str, Any]:  # noqa: N803
        with self.lock:
            self.part_calls[PartNumber] = self.part_calls.get(PartNumber, 0) + 1
        self._enter("upload_part")
        self.parts[(Key, PartNumber)] = bytes(Body)
        return {"ETag": f"e{PartNumber}"}

    def complete_multipart_upload(self, Bucket: str, Key: str, UploadId: str, MultipartUpload: Any) -> dict[str, Any]:  # noqa: N803
        self._enter("complete_multipart_upload")
        numbers = [p["PartNumber"] for p in MultipartUpload["Parts"]]
        self.objects[Key] = b"".join(self.parts[(Key, n)] for n in numbers)
        return {}

    def abort_multipart_upload(self, **_: Any) -> dict[str, Any]:
        return {}

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:  # noqa: N803
        if Key not in self.objects:
            raise ClientError({"Error": {"Code": "404"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, "HeadObject")
        return {"ContentLength": len(self.objects[Key])}

    def get_object(self, Bucket: str, Key: str, Range: str | None = None) -> dict[str, Any]:  # noqa: N803
        if Key not in self.objects:
            missing = {"Error": {"Code": "NoSuchKey"}, "ResponseMetadata": {"HTTPStatusCode": 404}}
            raise ClientError(missing, "GetObject")
        data = self.objects[Key]
        if Range is not None:
            first, last = (int(x) for x in Range.removeprefix("bytes=").split("-"))
            data = data[first : last + 1]

        if self.ignore_range:
            data = self.objects[Key]
        declared = len(data)
        if self.short_bodies > 0:
            self.short_bodies -= 1
            data = data[: len(data) // 2]  # the connection ended early; Content-Length said more
        client = self
        with self.lock:
            self.gets += 1
            self.open_bodies += 1

        class Body:
            at = 0  # a stream: each read goes on from the last

            def read(self, amt: int | None = None) -> bytes:
                client._enter("body")  # the body read is part of the request: retried as one
                chunk = data[self.at :] if amt is None else data[self.at : self.at + amt]
                self.at += len(chunk)
                client.body_bytes += len(chunk)
                client.largest_read = max(client.largest_read, len(chunk))
                return chunk

            def close(self) -> None:
                with client.lock:
                    client.open_bodies -= 1

        return {"Body": Body(), "ContentLength": declared}


FAST = RetryPolicy(attempts=6, base_s=0.001, throttle_base_s=0.001, cap_s=0.004)


def _store(client: ScriptedClient, **options: Any) -> S3Store:
    return S3Store("bucket", "p", client=client, part_size=5 * MiB, max_concurrency=4, retry=FAST, **options)


def test_throttled_parts_and_puts_are_retried_and_the_object_is_whole() -> None:
    client = ScriptedClient(
        client_error("SlowDown", 503), 2, ("upload_part", "put_object", "complete_multipart_upload")
    )
    store = _store(client)
    big = bytes(range(256)) * (6 * MiB // 256) * 3  # 18 MiB: 4 parts
    store.write_object("k/big.bin", [big], size=len(big))
    store.write_object("k/small.bin", [b"small"], size=5)
    store.write_object("k/small2.bin", [b"small2"], size=6)
    assert client.objects["p/k/big.bin"] == big
    assert client.objects["p/k/small2.bin"] == b"small2"
    assert client.failed >= 3
    store.close()


def test_ranged_gets_retry_a_body_cut_mid_read() -> None:
    client = ScriptedClient(ResponseStreamingError(error="reset"), 3, ("body",))
    client.fail_at = {3, 30}  # two bodies cut midway (each range is read in many pieces)
    store = _store(client)
    data = bytes(range(256)) * (12 * MiB // 256)
    client.objects["p/k/obj.bin"] = data
    out = bytearray(len(data))
    store.read_into("k/obj.bin", 0, memoryview(out))
    assert bytes(out) == data and client.failed == 2
    assert store.read("k/obj.bin", 1 << 30) == data
    store.close()


def test_part_attempts_bound_the_parts_retries() -> None:
    client = ScriptedClient(client_error("InternalError", 500), 1, ("upload_part",))
    store = _store(client, part_attempts=2)
    with pytest.raises(E.StorageError):
        store.write_object("k/never.bin", [b"\0" * (6 * MiB)], size=6 * MiB)
    assert max(client.part_calls.values()) == 2  # no part was tried more than twice
    store.close()


def test_requests_in_flight_stay_under_the_bound() -> None:
    """Two stores share one bound, as every store of a process shares ``process_limit()``."""
    client = ScriptedClient(client_error("SlowDown", 503), 5, ("upload_part",), hold_s=0.01)
    limit = InflightLimit(3)
    stores = [_store(client, inflight=limit) for _ in range(2)]
    big = b"\1" * (5 * MiB * 8)
    threads = [
        threading.Thread(target=s.write_object, args=(f"k/{i}-{j}.bin", [big], len(big)))
        for i, s in enumerate(stores)
        for j in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(client.objects[f"p/k/{i}-{j}.bin"] == big for i in range(2) for j in range(2))
    assert client.peak <= 3 and limit.peak == client.peak
    assert client.peak == 3  # the bound was reached: 4 uploads x 4 workers wanted more
    for s in stores:
        s.close()


def test_a_read_over_its_bound_is_refused_from_content_length_without_reading_the_body() -> None:
    client = ScriptedClient(client_error("InternalError", 500), 10**9, ())
    store = _store(client)
    client.objects["p/k/latest.json"] = b"\0" * (8 * MiB)
    with pytest.raises(E.SizeLimitError) as info:
        store.read("k/latest.json", 4096)
    assert info.value.field == "k/latest.json" and client.body_bytes == 0
    store.close()


def test_a_body_shorter_than_its_content_length_is_retried() -> None:
    client = ScriptedClient(client_error("InternalError", 500), 10**9, ())
    store = _store(client)
    client.objects["p/k/pin.json"] = b'{"kind": "training", "step": 4}'
    client.short_bodies = 2
    assert store.read("k/pin.json", 4096) == b'{"kind": "training", "step": 4}'
    assert client.calls["body"] == 3 and client.short_bodies == 0
    store.close()


def test_a_server_ignoring_range_cannot_make_a_ranged_read_take_the_object() -> None:
    client = ScriptedClient(client_error("InternalError", 500), 10**9, ())
    store = _store(client)
    client.objects["p/k/shard.bin"] = b"\1" * (4 * MiB)
    client.ignore_range = True
    with pytest.raises(E.StorageError):
        store.read_into("k/shard.bin", 0, memoryview(bytearray(16)))
    assert client.body_bytes <= 17
    store.close()


def test_a_ranged_read_fills_its_buffer_a_piece_at_a_time() -> None:
    """A range is never taken as one more object beside the buffer it goes into (a transient
    second copy of every part a restore reads); a server that ignored the range is found by the
    one byte past it and refused."""
    client = ScriptedClient(client_error("InternalError", 500), 10**9, ())
    store = _store(client)
    data = bytes(range(256)) * (12 * MiB // 256)
    client.objects["p/k/obj.bin"] = data
    out = bytearray(len(data) - 7)
    store.read_into("k/obj.bin", 7, memoryview(out))
    assert bytes(out) == data[7:] and 0 < client.largest_read <= STREAM_READ_BYTES
    client.ignore_range, client.body_bytes = True, 0
    small = bytearray(1000)
    with pytest.raises(E.StorageError, match="1000 bytes at 5"):
        store.read_into("k/obj.bin", 5, memoryview(small))
    assert client.body_bytes <= 1001  # the whole object was never read
    store.close()


def test_a_ranged_body_cut_short_is_retried_and_every_body_is_closed() -> None:
    """A ranged GET whose body ends early (the connection closed, Content-Length said more) is
    read again, whatever the HTTP library makes of it; every body is closed, a failed one too."""
    client = ScriptedClient(ResponseStreamingError(error="reset"), 3, ("body",))
    client.fail_at = {2}  # one body broken mid-read
    store = _store(client)
    data = bytes(range(256)) * (3 * MiB // 256)
    client.objects["p/k/obj.bin"] = data
    client.short_bodies = 2
    out = bytearray(len(data))
    store.read_into("k/obj.bin", 0, memoryview(out))
    assert bytes(out) == data and client.short_bodies == 0 and client.failed == 1
    # GET 1: short and broken at its second read; GET 2: short, ends early; GET 3: whole
    assert client.gets == 3 and client.open_bodies == 0
    store.close()
