"""Many writers on S3, against the real SeaweedFS: a save meets bursts of 503 SlowDown (the
fault proxy answers them with AWS's XML body) and completes; ``StartAfter`` listings and the
latest pointer find the latest checkpoint in a few requests."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from cairn.checkpoint import CheckpointContent, CheckpointKind, CheckpointOptions, read_manifest, write_checkpoint
from cairn.checkpoint.latest import advance_latest, latest_committed
from cairn.checkpoint.layout import checkpoint_prefix, manifest_key, steps_after
from cairn.checkpoint.reader import read_tensors
from cairn.checkpoint.ref import CheckpointRef
from cairn.stores.s3 import S3Store
from cairn.stores.s3_retry import InflightLimit, RetryPolicy
from tests.conftest import stamped_manifest
from tests.integration.conftest import S3Server
from workers.drills.faultproxy import FaultPolicy, FaultProxy

pytestmark = pytest.mark.integration

INFERENCE = CheckpointKind.INFERENCE
UNSIGNED = CheckpointOptions(shard_bytes=1 << 20)


@pytest.fixture
def proxy(seaweedfs: S3Server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(seaweedfs.endpoint)
    yield proxy
    proxy.close()


def _prefix() -> str:
    return f"thr-{uuid.uuid4().hex[:10]}"


def test_a_save_with_many_shards_completes_through_bursts_of_slowdown(proxy: FaultProxy, seaweedfs: S3Server) -> None:
    prefix = _prefix()
    limit = InflightLimit(6)
    fast = RetryPolicy(throttle_base_s=0.05)  # the schedule's shape, not its scale, is under test here
    store = S3Store(seaweedfs.bucket, prefix, endpoint_url=proxy.url, part_size=5 << 20, inflight=limit, retry=fast)
    rng = np.random.default_rng(7)
    tensors = {f"layer{i}": rng.random((1 << 20) // 8) for i in range(8)}  # eight 1 MiB shards
    tensors["embedding"] = rng.random((12 << 20) // 8)  # one 12 MiB shard: a multipart upload of 3 parts
    proxy.set_policy(FaultPolicy(every=6, burst=3, kinds=("503",)))  # every 6th request opens a burst of 3
    result = write_checkpoint(store, CheckpointContent(kind=INFERENCE, run_id="thr", step=1), tensors, options=UNSIGNED)
    proxy.set_policy(FaultPolicy())
    assert result.created and len(result.manifest.shards) >= 9
    assert proxy.injected["503"] >= 3 * 3  # several bursts hit the save, each retried through
    assert limit.peak <= 6
    direct = seaweedfs.store(prefix)
    manifest = read_manifest(direct, result.ref, expect_kind=INFERENCE, options=UNSIGNED)
    back = read_tensors(direct, result.ref, manifest)
    assert set(back) == set(tensors) and all(np.array_equal(back[k], v) for k, v in tensors.items())
    store.close()
    direct.close()


def test_start_after_on_s3_is_the_full_listing_filtered(seaweedfs: S3Server) -> None:
    store = seaweedfs.store(_prefix())
    keys = [
        f"{checkpoint_prefix('run', 'training', s)}/{name}" for s in (1, 2, 10, 11) for name in ("a/b.bin", "m.json")
    ]
    for key in [*keys, "run/training/latest.json", "run/pins/x.json"]:
        store.write_object(key, [b"x"])
    # Bounds that name no "directory": SeaweedFS skips a whole folder whose path equals the
    # bound (S3 would list the keys below it); ``steps_after`` never names one (13 digits).
    bounds = (None, steps_after("run", "training", 2), steps_after("run", "training", 10), "run/training/z", "a")
    for bound in bounds:
        everything = sorted(o.key for o in store.list("run/training/"))
        assert sorted(o.key for o in store.list("run/training/", start_after=bound)) == [
            k for k in everything if bound is None or k > bound
        ]
    store.close()


def test_latest_on_s3_takes_three_requests(proxy: FaultProxy, seaweedfs: S3Server) -> None:
    """1,050 committed steps (more than one listing page): with the pointer, ``latest`` is the
    pointer's GET, the manifest's GET (it is judged: ``cairn.checkpoint.committed``) and one
    ``StartAfter`` listing."""
    prefix = _prefix()
    direct = seaweedfs.store(prefix)
    steps = range(1, 1051)
    with ThreadPoolExecutor(max_workers=16) as pool:
        list(
            pool.map(
                lambda s: direct.put_if_absent(
                    manifest_key("run", INFERENCE, s), stamped_manifest("run", INFERENCE, s)
                ),
                steps,
            )
        )
    store = S3Store(seaweedfs.bucket, prefix, endpoint_url=proxy.url)
    before = proxy.count
    assert latest_committed(store, "run", INFERENCE) == CheckpointRef(store.url, "run", INFERENCE, 1050)
    unpointed = proxy.count - before  # the pointer's 404, then every page of the run
    assert advance_latest(direct, CheckpointRef(store.url, "run", INFERENCE, 1050), "f")
    before = proxy.count
    assert latest_committed(store, "run", INFERENCE) == CheckpointRef(store.url, "run", INFERENCE, 1050)
    assert proxy.count - before == 3
    assert unpointed >= 3
    store.close()
    direct.close()
