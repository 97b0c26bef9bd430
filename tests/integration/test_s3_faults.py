"""Transient faults on the S3 path, injected at the network level (a flaky proxy in front of
the real SeaweedFS server) and, for multipart parts, at the client call."""

from __future__ import annotations

import http.client
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import latest_committed, load_training
from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig
from cairn.session import TrainingSession
from cairn.stores.s3 import S3Store
from tests.integration.conftest import S3Server

pytestmark = pytest.mark.integration


class FlakyProxy:
    """Forwards to the real server; fails every ``every``-th request with a 503 or a reset."""

    def __init__(self, upstream: str, every: int, mode: str) -> None:
        target = urlparse(upstream)
        proxy = self
        self.count = 0
        self.faults = 0
        self.lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy.lock:
                    proxy.count += 1
                    fault = proxy.count % every == 0
                    proxy.faults += fault
                if fault and mode == "503":
                    payload = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                    self.send_response(503)
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                if fault and mode == "reset":
                    # Drop the connection mid-request, without a response.
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # HEAD carries the object's length without a body.
                length = resp.getheader("Content-Length") if self.command == "HEAD" else str(len(data))
                self.send_header("Content-Length", length or "0")
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(params=["503", "reset"])
def flaky(request: pytest.FixtureRequest, seaweedfs: S3Server) -> Iterator[FlakyProxy]:
    proxy = FlakyProxy(seaweedfs.endpoint, every=4, mode=request.param)
    yield proxy
    proxy.close()


def test_checkpoint_survives_flaky_network(flaky: FlakyProxy, seaweedfs: S3Server, config: TrainConfig) -> None:
    store = S3Store(seaweedfs.bucket, "flaky-" + str(id(flaky)), endpoint_url=flaky.url, part_size=5 << 20)
    session = TrainingSession.fresh("flaky", store, config)
    session.run(9, checkpoint_every=3)
    ref = latest_committed(store, "flaky")
    assert ref is not None and ref.step == 9
    state, _ = load_training(store, ref)
    assert compare_states(state, session.state) == []
    assert flaky.faults > 0  # faults really happened and were retried through
    store.close()


class _PartFaults:
    """Wraps a real client; the first ``fail`` upload_part calls raise a 500."""

    def __init__(self, client: Any, fail: int) -> None:
        self._client = client
        self.remaining = fail
        self.lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def upload_part(self, **kwargs: Any) -> Any:
        from botocore.exceptions import ClientError

        with self.lock:
            fail = self.remaining > 0
            self.remaining -= fail
        if fail:
            raise ClientError(
                {"Error": {"Code": "InternalError"}, "ResponseMetadata": {"HTTPStatusCode": 500}},
                "UploadPart",
            )
        return self._client.upload_part(**kwargs)


def test_multipart_part_retry(s3_store: S3Store) -> None:
    faulty = S3Store(s3_store.bucket, s3_store.prefix, client=_PartFaults(s3_store.client, fail=2), part_size=5 << 20)
    data = np.arange(3 * (5 << 20) // 8, dtype=np.float64)
    faulty.write_object("parts/obj.bin", [memoryview(data).cast("B")], size=data.nbytes)
    out = np.empty_like(data)
    s3_store.read_into("parts/obj.bin", 0, memoryview(out).cast("B"))
    assert np.array_equal(out, data)


def test_failed_multipart_is_aborted_and_invisible(s3_store: S3Store) -> None:
    faulty = S3Store(
        s3_store.bucket,
        s3_store.prefix,
        client=_PartFaults(s3_store.client, fail=10**6),
        part_size=5 << 20,
        part_attempts=2,
    )
    big = np.ones(2 * (5 << 20) // 8)
    with pytest.raises(E.StorageError):
        faulty.write_object("parts/never.bin", [memoryview(big).cast("B")], size=big.nbytes)
    assert not s3_store.exists("parts/never.bin")
    uploads = s3_store.client.list_multipart_uploads(Bucket=s3_store.bucket, Prefix=s3_store.prefix).get("Uploads", [])
    assert not [u for u in uploads if u["Key"].endswith("parts/never.bin")]
