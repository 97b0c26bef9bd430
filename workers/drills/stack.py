"""The stack a drill runs against, and the servers it may kill and restart.

``EmbeddedStack`` starts its own Temporal dev server (SQLite file, optional Web UI), SeaweedFS
and reservation service on free loopback ports in a state folder, and can SIGKILL and restart
each of them on its own data (same ports, same files). ``EnvStack`` uses the servers named by
the usual settings (TEMPORAL_ADDRESS, AWS_ENDPOINT_URL_S3, CAIRN_RESERVATION_URL) and cannot
restart anything.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from cairn.errors import ConfigError
from workers.stack.servers import (
    ServerProcess,
    free_port,
    seaweedfs_command,
    temporal_command,
    wait_for_http,
    wait_for_temporal,
)

__all__ = ["DrillStack", "EmbeddedStack", "EnvStack", "Restart", "S3_BUCKET"]

REPO = Path(__file__).resolve().parents[2]
S3_BUCKET = "cairn-drill"
SERVICE_CAPACITY = 100_000


@dataclass(frozen=True)
class Restart:
    """A server killed and brought back: when it went down and when it answered again."""

    server: str
    down_at: float
    up_at: float

    @property
    def seconds(self) -> float:
        return self.up_at - self.down_at


@dataclass
class DrillStack:
    temporal_address: str
    namespace: str = "default"
    s3_endpoint: str | None = None
    s3_bucket: str | None = None
    service_url: str | None = None
    web_ui: str | None = None
    restartable: frozenset[str] = frozenset()

    def restart(self, server: str) -> Restart:  # pragma: no cover - overridden
        raise ConfigError("--targets", expected="a stack whose servers the drill started", found=server)

    def close(self) -> None:
        pass


class EnvStack(DrillStack):
    """The servers the environment names; nothing to start, nothing to restart."""

    @classmethod
    def from_env(cls) -> EnvStack:
        address = os.environ.get("TEMPORAL_ADDRESS")
        if not address:
            raise ConfigError("TEMPORAL_ADDRESS", expected="host:port of Temporal (for --stack env)", found="unset")
        return cls(
            temporal_address=address,
            namespace=os.environ.get("TEMPORAL_NAMESPACE", "default"),
            s3_endpoint=os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL"),
            service_url=os.environ.get("CAIRN_RESERVATION_URL"),
        )


@dataclass
class _Server:
    proc: ServerProcess
    ready: Callable[[ServerProcess], None]

    def start(self) -> None:
        self.proc.start()
        try:
            self.ready(self.proc)
        except (TimeoutError, RuntimeError) as exc:
            self.proc.stop()
            raise RuntimeError(f"{self.proc.name} did not come up: {exc}\n{self.proc.log_tail(15)}") from exc


@dataclass
class EmbeddedStack(DrillStack):
    state_dir: Path = field(default_factory=Path)
    servers: dict[str, _Server] = field(default_factory=dict)

    @classmethod
    def start(cls, state_dir: Path, *, web_ui: bool = True, echo: Callable[[str], None] = print) -> EmbeddedStack:
        state_dir.mkdir(parents=True, exist_ok=True)
        logs = state_dir / "logs"
        t_port, s3_port, svc_port = free_port(), free_port(), free_port()
        ui_port = free_port() if web_ui else None
        (state_dir / "seaweedfs").mkdir(exist_ok=True)
        env = {
            "AWS_ACCESS_KEY_ID": os.environ.get("AWS_ACCESS_KEY_ID", "cairn-dev"),
            "AWS_SECRET_ACCESS_KEY": os.environ.get("AWS_SECRET_ACCESS_KEY", "cairn-dev-secret"),
            "AWS_DEFAULT_REGION": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        }
        for key, value in env.items():
            os.environ.setdefault(key, value)
        servers = {
            "temporal": _Server(
                ServerProcess(
                    "temporal", temporal_command(t_port, ui_port, state_dir / "temporal.db"), logs / "temporal.log"
                ),
                lambda p: wait_for_temporal("127.0.0.1", t_port, 90, p.alive),
            ),
            "s3": _Server(
                ServerProcess(
                    "seaweedfs",
                    # One master: a 1 s election (default 10 s) brings it back within seconds of a restart.
                    [*seaweedfs_command(state_dir / "seaweedfs", s3_port), "-master.electionTimeout=1s"],
                    logs / "seaweedfs.log",
                ),
                lambda p: wait_for_http(f"http://127.0.0.1:{s3_port}/", 90, p.alive),
            ),
            "service": _Server(
                ServerProcess(
                    "reservation",
                    [
                        sys.executable,
                        "-m",
                        "workers.stack.reservation",
                        "--port",
                        str(svc_port),
                        "--db",
                        str(state_dir / "reservations.db"),
                        "--capacity",
                        f"FILTER-A={SERVICE_CAPACITY}",
                    ],
                    logs / "reservation.log",
                    cwd=REPO,
                ),
                lambda p: wait_for_http(f"http://127.0.0.1:{svc_port}/health", 30, p.alive),
            ),
        }
        for server in servers.values():
            server.proc.start()  # all three boot in parallel
        stack = cls(
            temporal_address=f"127.0.0.1:{t_port}",
            s3_endpoint=f"http://127.0.0.1:{s3_port}",
            s3_bucket=S3_BUCKET,
            service_url=f"http://127.0.0.1:{svc_port}",
            web_ui=f"http://127.0.0.1:{ui_port}" if ui_port else None,
            restartable=frozenset({"temporal", "s3", "service"}),
            state_dir=state_dir,
            servers=servers,
        )
        try:
            for name, server in servers.items():
                try:
                    server.ready(server.proc)
                except (TimeoutError, RuntimeError) as exc:
                    raise RuntimeError(f"{name} did not come up: {exc}\n{server.proc.log_tail(15)}") from exc
            stack._ensure_bucket()
        except BaseException:
            stack.close()
            raise
        echo(f"embedded stack: Temporal {stack.temporal_address}, S3 {stack.s3_endpoint}, service {stack.service_url}")
        return stack

    def _ensure_bucket(self) -> None:
        from cairn.stores import S3Store

        deadline = time.monotonic() + 30
        while True:
            try:
                S3Store(S3_BUCKET, endpoint_url=self.s3_endpoint).ensure_bucket()
                return
            except Exception:  # noqa: BLE001 - SeaweedFS answers HTTP before its filer is ready
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)

    def restart(self, server: str) -> Restart:
        """SIGKILL the server's process group and start it again on the same ports and data."""
        s = self.servers[server]
        down = time.time()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(s.proc.pid, signal.SIGKILL)
        assert s.proc.proc is not None
        s.proc.proc.wait(timeout=10)
        s.start()
        if server == "s3":
            self._ensure_bucket()
        return Restart(server, down, time.time())

    def close(self) -> None:
        for name in ("service", "s3", "temporal"):
            if name in self.servers:
                self.servers[name].proc.stop(grace=2.0)
