"""A loopback HTTP proxy in front of an S3 server that injects storage faults on purpose.

The drill's workers and the S3 fault tests reach the store through it. A seeded ``FaultPolicy``
picks the requests that fail: ``503`` (SlowDown), ``reset`` (dropped without a response), ``cut``
(half the body, then the connection closes) or ``latency`` (held up to ``latency_s``), alone or
in bursts (``burst``: the requests right after a pick fail the same way, as a throttled prefix
does); an unreachable upstream is answered 503. ``arm_manifest_kill(callback)`` hands the next checkpoint
manifest PUT's peer port to ``callback`` and drops the request: shards written, commit not.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import random
import re
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlparse

__all__ = ["FAULT_KINDS", "FaultPolicy", "FaultProxy", "pid_of_connection"]

FAULT_KINDS = ("503", "reset", "cut", "latency")
_MANIFEST_PUT = re.compile(r"/training/(?P<step>[0-9]+)/manifest\.json$")


@dataclass(frozen=True)
class FaultPolicy:
    """Which requests fail, and how. ``every`` (every N-th request) is for tests; ``rate`` is
    a seeded probability per request."""

    rate: float = 0.0
    every: int = 0
    kinds: tuple[str, ...] = FAULT_KINDS
    latency_s: float = 0.3
    seed: int = 0
    burst: int = 1
    """Requests that fail in a row from each pick (the picked one included)."""

    def __post_init__(self) -> None:
        unknown = [k for k in self.kinds if k not in FAULT_KINDS]
        if unknown or not self.kinds:
            raise ValueError(f"fault kinds must be among {FAULT_KINDS}, found {self.kinds}")
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"fault rate must be in [0, 1], found {self.rate}")
        if self.burst < 1:
            raise ValueError(f"fault burst must be >= 1, found {self.burst}")


def pid_of_connection(peer_port: int, candidates: Iterable[int]) -> int | None:
    """Which of ``candidates`` holds the loopback TCP connection from ``peer_port`` (Linux:
    /proc/net/tcp gives the socket's inode, a process's fd table holds it)."""
    inode = None
    with contextlib.suppress(OSError), open("/proc/net/tcp") as fh:
        for line in fh.readlines()[1:]:
            fields = line.split()
            if int(fields[1].split(":")[1], 16) == peer_port:
                inode = fields[9]
                break
    if inode is None:
        return None
    target = f"socket:[{inode}]"
    for pid in candidates:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return pid
    return None


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients killed mid-request (on purpose) reset their connections: not worth a traceback."""


class FaultProxy:
    """Forwards every request to ``upstream``; fails the ones its policy picks."""

    def __init__(self, upstream: str, policy: FaultPolicy | None = None) -> None:
        target = urlparse(upstream)
        assert target.hostname is not None and target.port is not None, upstream
        self._host, self._port = target.hostname, target.port
        self._lock = threading.Lock()
        self._policy = policy or FaultPolicy()
        self._rng = random.Random(self._policy.seed)
        self._kill: Callable[[int], None] | None = None
        self._burst: tuple[str, int] | None = None  # (kind, requests still to fail)
        self.count = 0
        self.injected: Counter[str] = Counter()
        self.upstream_down = 0
        self.manifest_kills: list[tuple[float, int]] = []
        """(wall time, checkpoint step) of every armed manifest PUT intercepted."""
        self.server = _QuietServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, name="cairn-faultproxy", daemon=True)
        self._thread.start()

    # -- control --------------------------------------------------------------------------------
    @property
    def faults(self) -> int:
        return sum(self.injected.values())

    def set_policy(self, policy: FaultPolicy) -> None:
        with self._lock:
            self._policy = policy
            self._rng = random.Random(policy.seed)
            self._burst = None

    def arm_manifest_kill(self, callback: Callable[[int], None]) -> None:
        with self._lock:
            self._kill = callback

    def disarm(self) -> None:
        with self._lock:
            self._kill = None

    @property
    def armed(self) -> bool:
        return self._kill is not None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def _decide(self, method: str, path: str) -> tuple[str | None, float, Callable[[int], None] | None]:
        """(fault kind or None, latency, kill callback) for one request."""
        with self._lock:
            self.count += 1
            manifest = _MANIFEST_PUT.search(path.split("?", 1)[0]) if method == "PUT" else None
            if self._kill is not None and manifest is not None:
                kill, self._kill = self._kill, None
                self.manifest_kills.append((time.time(), int(manifest["step"])))
                return None, 0.0, kill
            policy = self._policy
            if self._burst is not None:  # inside a burst: fail like the request that started it
                kind, left = self._burst
                self._burst = (kind, left - 1) if left > 1 else None
            else:
                hit = (policy.every > 0 and self.count % policy.every == 0) or (
                    policy.rate > 0 and self._rng.random() < policy.rate
                )
                if not hit:
                    return None, 0.0, None
                kind = policy.kinds[0] if len(policy.kinds) == 1 else self._rng.choice(policy.kinds)
                if policy.burst > 1:
                    self._burst = (kind, policy.burst - 1)
            self.injected[kind] += 1
            latency = self._rng.uniform(0.5, 1.0) * policy.latency_s if kind == "latency" else 0.0
            return kind, latency, None

    # -- the HTTP side ----------------------------------------------------------------------------
    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _drop(self) -> None:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)

            def _reply(self, status: int, payload: bytes) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def _handle(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                kind, latency, kill = proxy._decide(self.command, self.path)
                if kill is not None:
                    kill(self.client_address[1])  # the writer dies, shards written, manifest unsent
                    self._drop()
                    return
                if kind == "cut" and length:
                    self.rfile.read(length // 2)
                    self._drop()
                    return
                body = self.rfile.read(length) if length else None
                if kind == "503":
                    self._reply(503, b"<Error><Code>SlowDown</Code><Message>injected by cairn drill</Message></Error>")
                    return
                if kind == "reset":
                    self._drop()
                    return
                if latency:
                    time.sleep(latency)
                try:
                    status, headers, data = self._forward(body)
                except OSError:
                    with proxy._lock:
                        proxy.upstream_down += 1
                    self._reply(503, b"<Error><Code>ServiceUnavailable</Code><Message>upstream down</Message></Error>")
                    return
                self.send_response(status)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # HEAD carries the object's length without a body.
                announced = dict((k.lower(), v) for k, v in headers).get("content-length", "0")
                self.send_header("Content-Length", announced if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if kind == "cut" and len(data) > 1:
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self._drop()
                    return
                self.wfile.write(data)

            def _forward(self, body: bytes | None) -> tuple[int, list[tuple[str, str]], bytes]:
                conn = http.client.HTTPConnection(proxy._host, proxy._port, timeout=60)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    return resp.status, resp.getheaders(), resp.read()
                finally:
                    conn.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        return Handler
