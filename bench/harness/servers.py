"""The servers a benchmark starts for itself, as the tests start them: SeaweedFS (S3 on
loopback) and a Temporal dev server (headless, SQLite file), each in a temporary directory; and
SeaweedFS behind a link of a given bandwidth (``seaweedfs_behind_link``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

from workers.stack.servers import (
    ServerProcess,
    free_port,
    seaweedfs_command,
    temporal_command,
    wait_for_http,
    wait_for_temporal,
)

SERVER_PIDS: dict[str, int] = {}
"""The process of each S3 server started here, by endpoint (while it runs): what
``process_cpu_seconds`` reads to tell the server's CPU from the client's."""


def process_cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all its threads) a process has used so far (``/proc``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextlib.contextmanager
def seaweedfs(workdir: Path) -> Iterator[str]:
    """A SeaweedFS server; yields its endpoint (its process: ``SERVER_PIDS``)."""
    with _weed(workdir, "127.0.0.1", lambda argv: argv) as endpoint:
        yield endpoint


@contextlib.contextmanager
def _weed(workdir: Path, address: str, wrap: Callable[[list[str]], list[str]]) -> Iterator[str]:
    """``weed server`` bound to ``address`` (its command line through ``wrap``), until exit."""
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench-secret")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    (workdir / "weed").mkdir(parents=True, exist_ok=True)
    argv = [
        {"-ip=127.0.0.1": f"-ip={address}", "-ip.bind=127.0.0.1": f"-ip.bind={address}"}.get(a, a)
        for a in seaweedfs_command(workdir / "weed", port)
    ]
    server = ServerProcess("seaweedfs", wrap(argv), workdir / "weed.log").start()
    endpoint = f"http://{address}:{port}"
    try:
        wait_for_http(endpoint + "/", timeout=60, alive=server.alive)
        SERVER_PIDS[endpoint] = server.pid
        yield endpoint
    finally:
        SERVER_PIDS.pop(endpoint, None)
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


def _sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, text=True, timeout=30)


def shaped_link_unavailable() -> str | None:
    """Why ``seaweedfs_behind_link`` cannot run here (None: it can): it needs root, ``ip`` and
    ``tc``, and a network namespace with a veth pair it can shape (probed)."""
    if os.geteuid() != 0:
        return "needs root (a network namespace and a veth pair)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"needs {' and '.join(missing)} (iproute2)"
    try:
        with _namespace_link(100.0):
            return None
    except (subprocess.CalledProcessError, OSError, subprocess.TimeoutExpired) as exc:
        detail = getattr(exc, "stderr", "") or str(exc)
        return f"a shaped veth link could not be made: {detail.strip().splitlines()[-1] if detail.strip() else exc}"


@contextlib.contextmanager
def _namespace_link(mb_s: float) -> Iterator[tuple[str, str]]:
    """A network namespace joined to this one by a veth pair whose two ends each send at most
    ``mb_s`` MB/s (``tc`` token bucket): yields (namespace, its address). Removed on exit."""
    tag = f"{os.getpid() % 100000}"
    ns, host_end, ns_end = f"cairn-bench-{tag}", f"cbh{tag}", f"cbn{tag}"
    net = f"10.213.{os.getpid() % 250}"
    rate = f"{mb_s * 8:.0f}mbit"
    try:
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", ns_end)
        _sh("ip", "link", "set", ns_end, "netns", ns)
        _sh("ip", "addr", "add", f"{net}.1/30", "dev", host_end)
        _sh("ip", "link", "set", host_end, "up")
        _sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"{net}.2/30", "dev", ns_end)
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", ns_end, "up")
        _sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        shape = ("qdisc", "add", "dev")
        limit = ("root", "tbf", "rate", rate, "burst", "256kb", "latency", "50ms")
        _sh("tc", *shape, host_end, *limit)  # uploads: this side sends
        _sh("ip", "netns", "exec", ns, "tc", *shape, ns_end, *limit)  # downloads: the server sends
        yield ns, f"{net}.2"
    finally:
        subprocess.run(["ip", "link", "del", host_end], capture_output=True, timeout=30)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)


@contextlib.contextmanager
def seaweedfs_behind_link(workdir: Path, mb_s: float) -> Iterator[str]:
    """A SeaweedFS server in a network namespace of its own, reached over a veth pair shaped to
    ``mb_s`` MB/s each way (``tc`` tbf): a real S3 server behind a real bandwidth limit, as an
    object store across a network is. Its server still runs on this machine's cores. Yields its
    endpoint; ``shaped_link_unavailable`` says why it cannot run."""
    with (
        _namespace_link(mb_s) as (ns, address),
        _weed(workdir, address, lambda a: ["ip", "netns", "exec", ns, *a]) as endpoint,
    ):
        yield endpoint
