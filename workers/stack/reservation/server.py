"""The reservation service's HTTP/1.1 side: h11 frames requests on asyncio, ``app`` answers them.

h11 parses the request line, headers and ``Content-Length`` and refuses what RFC 9112 forbids
(whitespace before a header's colon, a line folded into ``Content-Length``, conflicting lengths,
NUL or CR in a value, unknown codings). This module adds the service's own framing rules and
limits (``ServerLimits``). The refusals made
here, all in the JSON shape of ``errors.error_body``, close the connection: the rest of the stream
cannot be trusted to be a request.

- a malformed head: ``400 BadRequest`` (``400 BadContentLength`` for the length), too large:
  ``431 RequestHeaderFieldsTooLarge``; a version other than HTTP/1.0 or 1.1: ``505``; a method
  other than GET or POST: ``501 NotImplemented``;
- ``Transfer-Encoding``: ``411 LengthRequired`` (``400 ConflictingFraming`` with a
  ``Content-Length``, ``501`` for a coding other than chunked); a length over ``MAX_BODY_BYTES``:
  ``413 TooLarge``; a body cut short: ``400 IncompleteBody``;
- a head or body not in by its deadline: ``408 RequestTimeout`` (a connection that sent nothing
  is closed without an answer); one connection over the cap: ``503 ServiceUnavailable``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import threading
from http import HTTPStatus
from pathlib import Path
from typing import Any

import h11

from workers.stack.reservation.app import Reply, ReservationApp
from workers.stack.reservation.body import MAX_BODY_BYTES
from workers.stack.reservation.errors import UnreadableRequest
from workers.stack.reservation.limits import ServerLimits
from workers.stack.reservation.service import ReservationService

__all__ = ["ReservationHTTPServer", "serve", "main"]

BACKLOG = 1024
"""The listen backlog: a burst of clients queues instead of being reset."""
READ_BYTES = 64 << 10
SHUTDOWN_S = 10.0
"""How long ``shutdown`` waits for connections cut off mid-request (an answer being computed) to end."""
METHODS = frozenset({b"GET", b"POST"})
_LENGTH_ERRORS = frozenset({"bad Content-Length", "conflicting Content-Length headers"})
"""h11's messages for a ``Content-Length`` it refuses, answered as ``BadContentLength``."""


def _code(status: int) -> str:
    """``HTTPStatus`` 431 -> ``RequestHeaderFieldsTooLarge``."""
    return "".join(word.capitalize() for word in HTTPStatus(status).name.split("_"))


def _malformed(exc: h11.RemoteProtocolError) -> UnreadableRequest:
    status = HTTPStatus(exc.error_status_hint)
    code = "BadContentLength" if str(exc) in _LENGTH_ERRORS else _code(status)
    return UnreadableRequest(status, code, f"malformed request: {exc}")


def _head_bytes(request: h11.Request) -> int:
    """The size of the request line and headers as sent, give or take optional whitespace."""
    line = len(request.method) + len(request.target) + len(b"  HTTP/1.1\r\n")
    return line + sum(len(name) + len(value) + 4 for name, value in request.headers) + 2


def _check_head(request: h11.Request, limits: ServerLimits) -> None:
    """Refuse a head the service will not read a body after: too large, another version or
    method, a body framed by anything but one ``Content-Length`` of at most ``MAX_BODY_BYTES``."""
    if _head_bytes(request) > limits.max_header_bytes:  # h11 bounds a head still arriving, this one arrived whole
        raise UnreadableRequest(
            HTTPStatus.REQUEST_HEADER_FIELDS_TOO_LARGE,
            "RequestHeaderFieldsTooLarge",
            f"request line and headers over {limits.max_header_bytes} bytes",
        )
    if request.http_version not in (b"1.0", b"1.1"):
        raise UnreadableRequest(
            HTTPStatus.HTTP_VERSION_NOT_SUPPORTED, "HttpVersionNotSupported", "HTTP/1.1 (or 1.0) only"
        )
    if request.method not in METHODS:
        raise UnreadableRequest(
            HTTPStatus.NOT_IMPLEMENTED, "NotImplemented", f"{request.method.decode()} is not served; GET and POST are"
        )
    names = {name for name, _ in request.headers}
    if b"transfer-encoding" in names and b"content-length" in names:
        raise UnreadableRequest(
            HTTPStatus.BAD_REQUEST, "ConflictingFraming", "Transfer-Encoding and Content-Length together"
        )
    if b"transfer-encoding" in names:
        raise UnreadableRequest(HTTPStatus.LENGTH_REQUIRED, "LengthRequired", "send the body with Content-Length")
    length = int(dict(request.headers).get(b"content-length", b"0"))  # h11 checked: digits, one value
    if length > MAX_BODY_BYTES:
        raise UnreadableRequest(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "TooLarge", f"body over {MAX_BODY_BYTES} bytes")


def _log(peer: Any, line: str) -> None:
    host = peer[0] if isinstance(peer, tuple) else "-"
    sys.stderr.write(f"reservation-service: {host} {line}\n")


class _Connection:
    """One client connection: requests in order (pipelined ones too), each answered before the next."""

    def __init__(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, app: ReservationApp, limits: ServerLimits
    ) -> None:
        self.reader, self.writer, self.app, self.limits = reader, writer, app, limits
        self.h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.peer = writer.get_extra_info("peername")

    async def serve(self) -> None:
        """Answer requests until the client closes, a deadline passes or a refusal closes the connection."""
        try:
            deadline: float | None = asyncio.get_running_loop().time() + self.limits.head_timeout_s
            while (request := await self._head(deadline)) is not None:
                body = await self._body()
                method, target = request.method.decode(), request.target.decode()
                reply = await asyncio.to_thread(self.app.answer, method, target, request.headers, body)
                _log(self.peer, f'"{method} {target}" {reply.status}')
                await self._send(reply)
                if self.h11.our_state is not h11.DONE:  # the client asked to close (or spoke HTTP/1.0)
                    return
                self.h11.start_next_cycle()
                deadline = None
        except UnreadableRequest as exc:
            _log(self.peer, f"refused: {exc.status} {exc.code}: {exc}")
            with contextlib.suppress(ConnectionError, TimeoutError):
                await self._send(Reply(exc.status, exc.body()), close=True)
                await self._drain()
        except (ConnectionError, TimeoutError):  # the client went away, or stopped reading its answer
            pass
        finally:
            await self.close()

    async def refuse_busy(self) -> None:
        """Over the connection cap: ``503`` at once, then close."""
        refusal = UnreadableRequest(
            HTTPStatus.SERVICE_UNAVAILABLE, "ServiceUnavailable", "too many open connections; retry shortly"
        )
        try:
            with contextlib.suppress(ConnectionError, TimeoutError):
                await self._send(Reply(refusal.status, refusal.body()), close=True)
                await self._drain()
        finally:
            await self.close()

    def abort(self) -> None:
        """End the connection now (the server is stopping): reads see the end of the stream."""
        self.writer.transport.abort()

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()

    async def _next_event(self) -> Any:
        while True:
            try:
                event = self.h11.next_event()
            except h11.RemoteProtocolError as exc:
                raise _malformed(exc) from exc
            if event is not h11.NEED_DATA:
                return event
            self.h11.receive_data(await self.reader.read(READ_BYTES))  # b"" is the end of the stream

    async def _head(self, deadline: float | None) -> h11.Request | None:
        """The next request's head, or None when the client closed or a kept-alive connection idled.

        ``deadline`` is the loop time by which the head must be in; None on a reused connection,
        where it is ``head_timeout_s`` after the first byte and waiting for that byte is idling."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            if not self.h11.trailing_data[0]:
                try:
                    async with asyncio.timeout(self.limits.idle_timeout_s):
                        data = await self.reader.read(READ_BYTES)
                except TimeoutError:
                    return None
                if not data:
                    return None
                self.h11.receive_data(data)
            deadline = loop.time() + self.limits.head_timeout_s
        try:
            async with asyncio.timeout_at(deadline):
                event = await self._next_event()
        except TimeoutError:
            if not self.h11.trailing_data[0]:
                return None  # connected and sent nothing: close without an answer
            raise UnreadableRequest(
                HTTPStatus.REQUEST_TIMEOUT,
                "RequestTimeout",
                f"the request line and headers did not arrive within {self.limits.head_timeout_s:g} s",
            ) from None
        if isinstance(event, h11.ConnectionClosed):
            return None
        assert isinstance(event, h11.Request), event
        _check_head(event, self.limits)
        return event

    async def _body(self) -> bytes:
        """The request's body, in full within ``body_timeout_s`` of its head."""
        if self.h11.they_are_waiting_for_100_continue:
            self.writer.write(
                self.h11.send(h11.InformationalResponse(status_code=100, headers=[], reason=b"Continue")) or b""
            )
        body = bytearray()
        try:
            async with asyncio.timeout(self.limits.body_timeout_s):
                while not isinstance(event := await self._next_event(), h11.EndOfMessage):
                    body += event.data
        except UnreadableRequest as exc:
            if self.h11.trailing_data[1]:  # the client stopped sending
                raise UnreadableRequest(HTTPStatus.BAD_REQUEST, "IncompleteBody", str(exc)) from exc
            raise
        except TimeoutError:
            raise UnreadableRequest(
                HTTPStatus.REQUEST_TIMEOUT,
                "RequestTimeout",
                f"the body did not arrive within {self.limits.body_timeout_s:g} s ({len(body)} bytes did)",
            ) from None
        return bytes(body)

    async def _send(self, reply: Reply, close: bool = False) -> None:
        data = json.dumps(reply.body).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
        if reply.replayed:
            headers.append((b"idempotent-replayed", b"true"))
        if close:
            headers.append((b"connection", b"close"))
        status = HTTPStatus(reply.status)
        head = h11.Response(status_code=status, headers=headers, reason=status.phrase.encode())
        out = b"".join(self.h11.send(event) or b"" for event in (head, h11.Data(data=data), h11.EndOfMessage()))
        self.writer.write(out)
        async with asyncio.timeout(self.limits.body_timeout_s):
            await self.writer.drain()

    async def _drain(self) -> None:
        """Answer sent, connection closing: drop what the client still sends (bounded by
        ``drain_bytes`` and ``drain_timeout_s``), so that it reads the status instead of a reset."""
        with contextlib.suppress(OSError):
            if self.writer.can_write_eof():
                self.writer.write_eof()
        dropped = 0
        with contextlib.suppress(ConnectionError, TimeoutError):
            async with asyncio.timeout(self.limits.drain_timeout_s):
                while dropped < self.limits.drain_bytes and (chunk := await self.reader.read(READ_BYTES)):
                    dropped += len(chunk)


class ReservationHTTPServer:
    """The service on one listening socket, served by an asyncio loop in ``serve_forever``'s thread.

    ``serve_forever``, ``shutdown`` (from another thread; returns once serving stopped),
    ``server_close`` and ``server_address`` behave as ``socketserver``'s do.
    """

    def __init__(self, sock: socket.socket, app: ReservationApp, limits: ServerLimits) -> None:
        self.socket, self.app, self.limits = sock, app, limits
        self._connections: dict[asyncio.Task[None], _Connection] = {}
        """Connections being served; those refused over the cap are in ``_refusing``."""
        self._refusing: dict[asyncio.Task[None], _Connection] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._stopping = False
        self._stopped = threading.Event()

    @property
    def server_address(self) -> tuple[str, int]:
        host, port = self.socket.getsockname()[:2]
        return host, port

    @property
    def open_connections(self) -> int:
        """Connections being served now (not counting those refused over the cap)."""
        return len(self._connections)

    def serve_forever(self) -> None:
        try:
            asyncio.run(self._serve())
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stop ``serve_forever`` (called from another thread) and return once it has: open
        connections are cut off."""
        with self._lock:
            self._stopping = True
            loop, stop = self._loop, self._stop
        if loop is None or stop is None:
            return  # never served; ``serve_forever`` will return at once if called now
        with contextlib.suppress(RuntimeError):  # the loop already ended
            loop.call_soon_threadsafe(stop.set)
        self._stopped.wait()

    def server_close(self) -> None:
        self.socket.close()

    async def _serve(self) -> None:
        with self._lock:
            if self._stopping:
                return
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with await asyncio.start_server(self._accept, sock=self.socket, backlog=BACKLOG):
            await self._stop.wait()
        # Not cancelled (asyncio logs a cancelled connection task as an error): cut off, each ends.
        tasks = {**self._connections, **self._refusing}
        for connection in tasks.values():
            connection.abort()
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_S)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(reader, writer, self.app, self.limits)
        task = asyncio.current_task()
        assert task is not None
        busy = len(self._connections) >= self.limits.max_connections
        tasks = self._refusing if busy else self._connections
        tasks[task] = connection
        try:
            if busy:
                _log(connection.peer, f"refused: 503 over {self.limits.max_connections} open connections")
                await connection.refuse_busy()
            else:
                await connection.serve()
        finally:
            del tasks[task]


def serve(
    port: int,
    db_path: Path,
    capacities: dict[str, int],
    host: str = "127.0.0.1",
    limits: ServerLimits | None = None,
) -> ReservationHTTPServer:
    """The service bound to ``host:port`` (0: a free port, see ``server_address``), not yet serving."""
    service = ReservationService(db_path, capacities)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
    return ReservationHTTPServer(sock, ReservationApp(service), limits or ServerLimits())


def main(argv: list[str] | None = None) -> int:
    defaults = ServerLimits()
    parser = argparse.ArgumentParser(
        prog="reservation-service", description="capacity reservations with idempotency keys"
    )
    parser.add_argument("--port", type=int, default=8377)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--db", default="reservations.db")
    parser.add_argument(
        "--capacity", action="append", default=[], metavar="NAME=UNITS", help="resource capacity (default FILTER-A=16)"
    )
    parser.add_argument("--max-connections", type=int, default=defaults.max_connections, metavar="N")
    parser.add_argument("--head-timeout", type=float, default=defaults.head_timeout_s, metavar="SECONDS")
    parser.add_argument("--body-timeout", type=float, default=defaults.body_timeout_s, metavar="SECONDS")
    parser.add_argument("--idle-timeout", type=float, default=defaults.idle_timeout_s, metavar="SECONDS")
    args = parser.parse_args(argv)
    capacities = dict(item.split("=", 1) for item in args.capacity) if args.capacity else {"FILTER-A": "16"}
    limits = ServerLimits(
        max_connections=args.max_connections,
        head_timeout_s=args.head_timeout,
        body_timeout_s=args.body_timeout,
        idle_timeout_s=args.idle_timeout,
    )
    server = serve(args.port, Path(args.db), {k: int(v) for k, v in capacities.items()}, args.host, limits)
    print(f"reservation service on http://{args.host}:{args.port} (db {args.db})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0
