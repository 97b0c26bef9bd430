"""Transient faults on the S3 path, injected at the network level (the drill's fault proxy in
front of the real SeaweedFS server) and, for multipart parts, at the client call."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint import latest_committed
from cairn.checkpoint.compare import compare_states
from cairn.config import TrainConfig
from cairn.session import TrainingSession
from cairn.stores.s3 import S3Store
from cairn.training import load_training
from tests.integration.conftest import S3Server
from workers.drills.faultproxy import FaultPolicy, FaultProxy

pytestmark = pytest.mark.integration


@pytest.fixture(params=["503", "reset"])
def flaky(request: pytest.FixtureRequest, seaweedfs: S3Server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(seaweedfs.endpoint, FaultPolicy(every=4, kinds=(request.param,)))
    yield proxy
    proxy.close()


def test_checkpoint_survives_flaky_network(flaky: FaultProxy, seaweedfs: S3Server, config: TrainConfig) -> None:
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


class _LostCompletion:
    """Wraps a real client; ``complete_multipart_upload`` answers NoSuchUpload, as a retried
    completion does when the first one succeeded and its answer was lost (``really``: the first
    one did complete)."""

    def __init__(self, client: Any, really: bool) -> None:
        self._client = client
        self.really = really

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)

    def complete_multipart_upload(self, **kwargs: Any) -> Any:
        from botocore.exceptions import ClientError

        if self.really:
            self._client.complete_multipart_upload(**kwargs)
        raise ClientError(
            {"Error": {"Code": "NoSuchUpload"}, "ResponseMetadata": {"HTTPStatusCode": 404}}, "CompleteMultipartUpload"
        )


@pytest.mark.parametrize("really", [True, False])
def test_a_completion_whose_answer_was_lost_is_recognised_by_its_etag(s3_store: S3Store, really: bool) -> None:
    client = _LostCompletion(s3_store.client, really)
    lossy = S3Store(s3_store.bucket, s3_store.prefix, client=client, part_size=5 << 20)
    data = np.arange(2 * (5 << 20) // 8 + 3, dtype=np.float64)
    key = f"parts/lost-{really}.bin"
    if really:
        lossy.write_object(key, [memoryview(data).cast("B")], size=data.nbytes)
        out = np.empty_like(data)
        s3_store.read_into(key, 0, memoryview(out).cast("B"))
        assert np.array_equal(out, data)
    else:  # nothing was completed: the write fails, typed, and nothing is there
        with pytest.raises(E.CairnError):
            lossy.write_object(key, [memoryview(data).cast("B")], size=data.nbytes)
        assert not s3_store.exists(key)
