"""The servers a benchmark starts for itself, as the tests start them: SeaweedFS (S3 on
loopback) and a Temporal dev server (headless, SQLite file), each in a temporary directory."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from workers.stack.servers import (
    ServerProcess,
    free_port,
    seaweedfs_command,
    temporal_command,
    wait_for_http,
    wait_for_temporal,
)


@contextlib.contextmanager
def seaweedfs(workdir: Path) -> Iterator[str]:
    """A SeaweedFS server; yields its endpoint."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    (workdir / "weed").mkdir(parents=True, exist_ok=True)
    server = ServerProcess("seaweedfs", seaweedfs_command(workdir / "weed", port), workdir / "weed.log").start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        wait_for_http(endpoint + "/", timeout=60, alive=server.alive)
        yield endpoint
    finally:
        server.stop(grace=2.0)


@contextlib.contextmanager
def temporal_server(workdir: Path) -> Iterator[str]:
    """A Temporal dev server; yields its address."""
    port = free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    server = ServerProcess(
        "temporal", temporal_command(port, None, workdir / "temporal.db"), workdir / "temporal.log"
    ).start()
    try:
        wait_for_temporal("127.0.0.1", port, timeout=60, alive=server.alive)
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=5.0)
