"""The reservation service's HTTP side: routes, body framing, JSON answers, the server, ``main``.

Routes: ``POST /reservations``, ``POST /reservations/{id}/release``, ``GET /idempotency/{key}``,
``GET /resources/{name}``, ``GET /reservations``, ``GET /health``. Every refusal is
``{"error": <code>, "message": <one line>}`` with a ``Content-Length``. A body is framed by one
decimal ``Content-Length`` of at most ``MAX_BODY_BYTES``: chunked -> ``411 LengthRequired``, a bad
or conflicting length -> ``400 BadContentLength``, too large -> ``413 TooLarge``, short ->
``400 IncompleteBody``; these, the stdlib's own refusals and ``500 InternalError`` close the
connection.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
import traceback
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from workers.stack.reservation.body import MAX_BODY_BYTES, parse_body
from workers.stack.reservation.errors import ServiceError, UnreadableBody
from workers.stack.reservation.service import ReservationService

__all__ = ["ReservationHTTPServer", "serve", "main"]

REQUEST_QUEUE_SIZE = 1024
"""The listen backlog (the stdlib's default is 5): a burst of clients queues instead of being reset."""
REQUEST_TIMEOUT_S = 30.0
"""A connection idle or stalled this long is closed."""
DRAIN_BYTES = 8 << 20
DRAIN_SECONDS = 2.0
"""After refusing a request it will not read (an oversized header or body), the service reads and
drops up to this much of what the client is still sending before it closes: closing with unread
bytes would reset the connection, and the client would see a broken pipe instead of the status."""
MAX_MESSAGE_CHARS = 500


def _one_line(message: str) -> str:
    line = " ".join(message.split())
    return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 3] + "..."


def _handler(service: ReservationService) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        default_request_version = "HTTP/1.1"  # answer an unparsable request line with a status line, not HTTP/0.9
        timeout = REQUEST_TIMEOUT_S
        body_read = False
        """Whether the current request's body has been consumed from the stream."""

        def log_message(self, fmt: str, *args: Any) -> None:
            sys.stderr.write("reservation-service: " + (fmt % args) + "\n")

        def _send(self, status: int, body: Any, replayed: bool = False, close: bool = False) -> None:
            """Answer with a JSON body; close the connection if the request's body was not consumed
            (it would otherwise be read as the next request)."""
            data = json.dumps(body).encode()
            close = close or (not self.body_read and self._announces_body())
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if replayed:
                    self.send_header("Idempotent-Replayed", "true")
                if close:
                    self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(data)
                if close:
                    self._drain()
            except OSError:  # the client went away; nothing more can be said on this connection
                self.close_connection = True

        def _drain(self) -> None:
            """Answer sent, connection closing: drop what the client still sends (bounded by
            ``DRAIN_BYTES`` and ``DRAIN_SECONDS``), so it reads the status instead of a reset."""
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)
            self.connection.settimeout(0.2)
            deadline, dropped = time.monotonic() + DRAIN_SECONDS, 0
            with contextlib.suppress(OSError):
                while dropped < DRAIN_BYTES and time.monotonic() < deadline:
                    chunk = self.connection.recv(1 << 16)
                    if not chunk:
                        break
                    dropped += len(chunk)

        def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
            """The stdlib's own refusals (a malformed request line or header, an unsupported method), in
            the same JSON shape as ours; the request could not be framed, so the connection closes."""
            status = HTTPStatus(code)
            self.log_error("code %d, message %s", code, message)
            code_name = "".join(word.capitalize() for word in status.name.split("_"))
            self._send(code, {"error": code_name, "message": _one_line(message or status.phrase)}, close=True)

        def _framed_length(self) -> int:
            """The body's length from its framing, or ``UnreadableBody`` when it cannot be trusted."""
            if self.headers.get("Transfer-Encoding") is not None:
                raise UnreadableBody(HTTPStatus.LENGTH_REQUIRED, "LengthRequired", "send the body with Content-Length")
            values = {value.strip() for value in self.headers.get_all("Content-Length") or []}
            if not values:
                return 0
            value = values.pop()
            if values or not (value.isascii() and value.isdigit()):
                raise UnreadableBody(
                    HTTPStatus.BAD_REQUEST, "BadContentLength", "Content-Length must be one decimal number of bytes"
                )
            if len(value) > len(str(MAX_BODY_BYTES)) or int(value) > MAX_BODY_BYTES:
                raise UnreadableBody(
                    HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "TooLarge", f"body over {MAX_BODY_BYTES} bytes"
                )
            return int(value)

        def _body(self) -> dict[str, Any]:
            length = self._framed_length()
            try:
                raw = self.rfile.read(length) if length else b""
            except OSError as exc:  # a timeout or a reset while the client was sending
                raise UnreadableBody(
                    HTTPStatus.BAD_REQUEST, "IncompleteBody", f"reading the body failed: {exc}"
                ) from exc
            if len(raw) < length:
                raise UnreadableBody(
                    HTTPStatus.BAD_REQUEST, "IncompleteBody", f"Content-Length is {length}, got {len(raw)} bytes"
                )
            self.body_read = True
            return parse_body(raw)

        def _announces_body(self) -> bool:
            length = self.headers.get("Content-Length")
            return self.headers.get("Transfer-Encoding") is not None or (length is not None and length.strip() != "0")

        def _route(self, method: str) -> None:
            self.body_read = False
            try:
                self._answer(method)
            except UnreadableBody as exc:
                self._send(exc.status, {"error": exc.code, "message": _one_line(str(exc))}, close=True)
            except ServiceError as exc:
                self._send(exc.status, {"error": exc.code, "message": _one_line(str(exc))})
            except Exception:  # a bug, not a refusal: answer it in JSON rather than drop the connection
                self.log_error("internal error on %s %s\n%s", method, self.path, traceback.format_exc())
                self._send(500, {"error": "InternalError", "message": "the service failed; see its log"}, close=True)

        def _answer(self, method: str) -> None:
            parts = [unquote(p) for p in self.path.split("?")[0].strip("/").split("/") if p]
            key = self.headers.get("Idempotency-Key")
            if method == "GET" and parts == ["health"]:
                return self._send(200, {"ok": True})
            if method == "GET" and parts == ["reservations"]:
                return self._send(200, {"reservations": service.reservations()})
            if method == "GET" and len(parts) == 2 and parts[0] == "resources":
                found = service.resource(parts[1])
                return self._send(200, found) if found else self._send(404, {"error": "UnknownResource"})
            if method == "GET" and len(parts) >= 2 and parts[0] == "idempotency":
                outcome = service.lookup("/".join(parts[1:]))
                return self._send(200, outcome) if outcome else self._send(404, {"error": "UnknownKey"})
            if method == "POST" and parts == ["reservations"]:
                status, resp, replayed = service.reserve(key, self._body())
                return self._send(200 if replayed else status, resp, replayed)
            if method == "POST" and len(parts) == 3 and parts[0] == "reservations" and parts[2] == "release":
                self._body()
                status, resp, replayed = service.release(key, parts[1])
                return self._send(status, resp, replayed)
            self._send(404, {"error": "NotFound", "message": _one_line(f"{method} {self.path}")})

        def do_GET(self) -> None:  # noqa: N802
            self._route("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._route("POST")

    return Handler


class ReservationHTTPServer(ThreadingHTTPServer):
    """One thread per connection, with a listen backlog for bursts of clients."""

    request_queue_size = REQUEST_QUEUE_SIZE
    daemon_threads = True


def serve(port: int, db_path: Path, capacities: dict[str, int], host: str = "127.0.0.1") -> ReservationHTTPServer:
    service = ReservationService(db_path, capacities)
    return ReservationHTTPServer((host, port), _handler(service))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="reservation-service", description="capacity reservations with idempotency keys"
    )
    parser.add_argument("--port", type=int, default=8377)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--db", default="reservations.db")
    parser.add_argument(
        "--capacity", action="append", default=[], metavar="NAME=UNITS", help="resource capacity (default FILTER-A=16)"
    )
    args = parser.parse_args(argv)
    capacities = dict(item.split("=", 1) for item in args.capacity) if args.capacity else {"FILTER-A": "16"}
    server = serve(args.port, Path(args.db), {k: int(v) for k, v in capacities.items()}, args.host)
    print(f"reservation service on http://{args.host}:{args.port} (db {args.db})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0
