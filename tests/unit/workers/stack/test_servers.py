"""Waiting for the Temporal frontend: an accepting port is not a healthy frontend (a CI run failed
on ``Frontend is not healthy yet`` when the fixtures waited for the port alone)."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from workers.stack import servers
from workers.stack.servers import temporal_unhealthy, wait_for_tcp, wait_for_temporal


@pytest.fixture
def mute_port() -> Iterator[int]:
    """A port that accepts connections and never answers gRPC (as a frontend not yet serving)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                accepted.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield listener.getsockname()[1]
    stop.set()
    thread.join()
    for conn in accepted:
        conn.close()
    listener.close()


def test_an_accepting_port_that_is_no_healthy_frontend_is_waited_on_then_named(mute_port: int) -> None:
    wait_for_tcp("127.0.0.1", mute_port, timeout=5)  # the old wait returned here
    assert temporal_unhealthy(f"127.0.0.1:{mute_port}", timeout=1) is not None  # no answer, or a refusal
    with pytest.raises(TimeoutError, match=rf"127\.0\.0\.1:{mute_port} was not healthy within 2s \(last: .+\)"):
        wait_for_temporal("127.0.0.1", mute_port, timeout=2)


def test_the_wait_returns_once_the_frontend_is_healthy(mute_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = iter(["RuntimeError: Frontend is not healthy yet", "RuntimeError: Frontend is not healthy yet", None])
    probes: list[str] = []

    def probe(address: str, timeout: float) -> str | None:
        assert 0 < timeout <= servers.PROBE_S
        probes.append(address)
        return next(answers)

    monkeypatch.setattr(servers, "temporal_unhealthy", probe)
    wait_for_temporal("127.0.0.1", mute_port, timeout=30)
    assert probes == [f"127.0.0.1:{mute_port}"] * 3


def test_a_server_that_exits_while_unhealthy_is_said_to_have_exited(mute_port: int) -> None:
    calls = iter([True, False])  # alive for the port check, gone by the first health probe
    with pytest.raises(RuntimeError, match="process exited before the Temporal frontend"):
        wait_for_temporal("127.0.0.1", mute_port, timeout=30, alive=lambda: next(calls, False))
