"""A real external service that keeps state and honors idempotency keys: capacity reservations.

HTTP + JSON, backed by SQLite (one file, transactions, unique constraints). It stands in for
the systems a training run touches (a capacity broker, a quota service). Run it with
``python -m workers.stack.reservation --port 8377 --db reservations.db`` (``cairn dev up``
starts one).

API (``Idempotency-Key`` header on every mutating request):

- ``POST /reservations`` ``{"resource": "FILTER-A", "units": 2, "run_id": "..."}`` ->
  ``201 {"reservation_id": "reservation-1", ...}``. The same key and the same body again ->
  ``200`` with the original outcome (``Idempotent-Replayed: true``), nothing consumed again.
  The same key with a different body -> ``422 IdempotencyConflict``. Not enough capacity ->
  ``409 InsufficientCapacity``.
- ``POST /reservations/{id}/release`` -> ``200 {"status": "released"}``; idempotent.
- ``GET /idempotency/{key}`` -> the recorded outcome for that key, or ``404``: how a client
  reconciles an intent whose outcome it never saw.
- ``GET /resources/{name}`` -> ``{"capacity", "consumed", "available"}``;
  ``GET /reservations`` -> every reservation; ``GET /health``.

Every refusal is ``{"error": <code>, "message": <one line>}`` with a ``Content-Length``; a
request whose body could not be read as framed also gets ``Connection: close``. The bounds:

- body: UTF-8 JSON object of at most ``MAX_BODY_BYTES`` (1 MiB), framed by one decimal
  ``Content-Length`` (no ``Transfer-Encoding``). Larger -> ``413 TooLarge``; a length that is not
  digits, or several that differ -> ``400 BadContentLength``; fewer bytes than announced ->
  ``400 IncompleteBody``; chunked -> ``411 LengthRequired``. These four close the connection.
- ``400 BadEncoding`` (not UTF-8); ``400 NestingTooDeep`` (arrays/objects nested deeper than
  ``MAX_JSON_DEPTH`` = 32, checked before parsing); ``400 BadNumber`` (a number literal longer
  than ``MAX_NUMBER_CHARS`` = 40 characters, a float that overflows to infinity, ``NaN`` or
  ``Infinity``); ``400 BadJSON`` (not JSON, or not an object).
- ``400 BadRequest``: ``resource`` must be a string, ``units`` an integer (not a boolean) from 1
  to ``MAX_UNITS`` = 1,000,000, ``run_id`` a string or null.
- ``400 BadIdempotencyKey``: a key longer than ``MAX_KEY_CHARS`` = 256 characters or holding a
  control character (U+0000-U+001F, U+007F, tab included).

The listen backlog is ``REQUEST_QUEUE_SIZE`` (1024, the stdlib default is 5) so that a burst of
clients connecting at once queues instead of being reset; a connection idle or stalled for
``REQUEST_TIMEOUT_S`` (30 s) is closed. The stdlib's own refusals (a malformed request line or
header, an unsupported method) are answered in the same JSON shape, with ``Connection: close``;
so is a bug in the service, as ``500 InternalError`` (its traceback goes to stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import math
import re
import socket
import sqlite3
import sys
import time
import traceback
from collections.abc import Iterator
from contextlib import closing, contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, TypeGuard
from urllib.parse import unquote

__all__ = [
    "ReservationService",
    "ReservationHTTPServer",
    "parse_body",
    "check_key",
    "serve",
    "main",
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_NUMBER_CHARS",
    "MAX_UNITS",
    "MAX_KEY_CHARS",
]

MAX_BODY_BYTES = 1 << 20
MAX_JSON_DEPTH = 32
MAX_NUMBER_CHARS = 40
MAX_UNITS = 1_000_000
MAX_KEY_CHARS = 256
REQUEST_QUEUE_SIZE = 1024
REQUEST_TIMEOUT_S = 30.0
DRAIN_BYTES = 8 << 20
DRAIN_SECONDS = 2.0
"""After refusing a request it will not read (an oversized header or body), the service reads and
drops up to this much of what the client is still sending before it closes: closing with unread
bytes would reset the connection, and the client would see a broken pipe instead of the status."""
MAX_MESSAGE_CHARS = 500

SCHEMA = """
CREATE TABLE IF NOT EXISTS resources (
    name TEXT PRIMARY KEY,
    capacity INTEGER NOT NULL CHECK (capacity >= 0)
);
CREATE TABLE IF NOT EXISTS reservations (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    reservation_id TEXT UNIQUE,
    resource TEXT NOT NULL REFERENCES resources(name),
    units INTEGER NOT NULL CHECK (units > 0),
    run_id TEXT,
    status TEXT NOT NULL CHECK (status IN ('active', 'released'))
);
CREATE TABLE IF NOT EXISTS idempotency (
    key TEXT PRIMARY KEY,
    request_hash TEXT NOT NULL,
    status INTEGER NOT NULL,
    response TEXT NOT NULL
);
"""


class ServiceError(Exception):
    """A refusal: answered as ``{"error": code, "message": message}`` with ``status``."""

    def __init__(self, status: HTTPStatus, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class UnreadableBody(ServiceError):
    """The body could not be read as framed: the rest of the stream is not a request, so the
    answer closes the connection."""


_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f\x7f]")
# A backslash escape (skipped whole, so an escaped quote does not end a string), a quote, a bracket.
_JSON_STRUCTURE = re.compile(r'\\.|["\[\]{}]', re.DOTALL)


def _bad_number(message: str) -> ServiceError:
    return ServiceError(HTTPStatus.BAD_REQUEST, "BadNumber", message)


def _parse_int(literal: str) -> int:
    if len(literal) > MAX_NUMBER_CHARS:
        raise _bad_number(f"an integer of {len(literal)} characters; at most {MAX_NUMBER_CHARS} are accepted")
    return int(literal)


def _parse_float(literal: str) -> float:
    if len(literal) > MAX_NUMBER_CHARS:
        raise _bad_number(f"a number of {len(literal)} characters; at most {MAX_NUMBER_CHARS} are accepted")
    value = float(literal)
    if not math.isfinite(value):
        raise _bad_number(f"{literal} is out of range")
    return value


def _refuse_constant(name: str) -> Any:
    raise _bad_number(f"{name} is not a number")


def _nested_deeper_than(text: str, limit: int) -> bool:
    """Whether arrays/objects in ``text`` nest deeper than ``limit``; brackets inside strings do
    not count. Linear, and stops at the first bracket past the limit."""
    if text.count("[") + text.count("{") <= limit:
        return False
    depth, in_string = 0, False
    for token in _JSON_STRUCTURE.findall(text):
        if token == '"':
            in_string = not in_string
        elif in_string or token[0] == "\\":
            continue
        elif token in "[{":
            depth += 1
            if depth > limit:
                return True
        else:
            depth -= 1
    return False


def parse_body(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, within the bounds in the module docstring; an empty body is ``{}``."""
    if not raw:
        return {}
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ServiceError(HTTPStatus.BAD_REQUEST, "BadEncoding", f"body is not UTF-8 (byte {exc.start})") from exc
    if _nested_deeper_than(text, MAX_JSON_DEPTH):
        raise ServiceError(
            HTTPStatus.BAD_REQUEST, "NestingTooDeep", f"arrays/objects nested deeper than {MAX_JSON_DEPTH}"
        )
    try:
        body = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ServiceError(HTTPStatus.BAD_REQUEST, "BadJSON", str(exc)) from exc
    if not isinstance(body, dict):
        raise ServiceError(HTTPStatus.BAD_REQUEST, "BadJSON", "body must be a JSON object")
    return body


def check_key(key: str | None) -> str:
    """The ``Idempotency-Key``, if present, short enough and free of control characters."""
    if not key:
        raise ServiceError(HTTPStatus.BAD_REQUEST, "MissingIdempotencyKey", "Idempotency-Key header is required")
    if len(key) > MAX_KEY_CHARS or _CONTROL_CHARACTERS.search(key):
        raise ServiceError(
            HTTPStatus.BAD_REQUEST,
            "BadIdempotencyKey",
            f"Idempotency-Key must be 1 to {MAX_KEY_CHARS} characters without control characters",
        )
    return key


def _is_text(value: object) -> TypeGuard[str]:
    """A string SQLite can store: UTF-8 encodable (a JSON ``\\ud800`` escape is a lone surrogate, which is not)."""
    if not isinstance(value, str):
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_units(value: object) -> TypeGuard[int]:
    """A positive integer up to ``MAX_UNITS``; JSON ``true`` is a bool, not a count."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= MAX_UNITS


def _one_line(message: str) -> str:
    line = " ".join(message.split())
    return line if len(line) <= MAX_MESSAGE_CHARS else line[: MAX_MESSAGE_CHARS - 3] + "..."


def _body_hash(method: str, path: str, body: dict[str, Any]) -> str:
    text = json.dumps({"method": method, "path": path, "body": body}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


class ReservationService:
    """The service's state and rules, independent of HTTP."""

    def __init__(self, db_path: Path, capacities: dict[str, int]) -> None:
        self.db_path = db_path
        with closing(sqlite3.connect(self.db_path)) as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(SCHEMA)
        with self._tx() as db:
            for name, capacity in capacities.items():
                db.execute("INSERT OR IGNORE INTO resources(name, capacity) VALUES (?, ?)", (name, capacity))

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One serialized write transaction (BEGIN IMMEDIATE): concurrent duplicates queue up."""
        with closing(sqlite3.connect(self.db_path, timeout=30, isolation_level=None)) as db:
            db.execute("PRAGMA foreign_keys=ON")
            db.execute("BEGIN IMMEDIATE")
            try:
                yield db
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def idempotent(
        self, key: str | None, method: str, path: str, body: dict[str, Any], action: Any
    ) -> tuple[int, dict[str, Any], bool]:
        """Run ``action(db)`` once per key; replay its recorded outcome for the same request."""
        key = check_key(key)
        digest = _body_hash(method, path, body)
        with self._tx() as db:
            row = db.execute("SELECT request_hash, status, response FROM idempotency WHERE key = ?", (key,)).fetchone()
            if row is not None:
                if row[0] != digest:
                    raise ServiceError(
                        HTTPStatus.UNPROCESSABLE_ENTITY,
                        "IdempotencyConflict",
                        f"Idempotency-Key {key!r} was already used for a different request",
                    )
                return int(row[1]), json.loads(row[2]), True
            status, response = action(db)
            db.execute(
                "INSERT INTO idempotency(key, request_hash, status, response) VALUES (?, ?, ?, ?)",
                (key, digest, status, json.dumps(response)),
            )
            return status, response, False

    def reserve(self, key: str | None, body: dict[str, Any]) -> tuple[int, dict[str, Any], bool]:
        resource, units, run_id = body.get("resource"), body.get("units"), body.get("run_id")
        if not (_is_text(resource) and _is_units(units) and (run_id is None or _is_text(run_id))):
            raise ServiceError(
                HTTPStatus.BAD_REQUEST,
                "BadRequest",
                f"body needs resource (string), units (integer, 1 to {MAX_UNITS}) and optionally run_id (string)",
            )

        def action(db: sqlite3.Connection) -> tuple[int, dict[str, Any]]:
            cap = db.execute("SELECT capacity FROM resources WHERE name = ?", (resource,)).fetchone()
            if cap is None:
                raise ServiceError(HTTPStatus.NOT_FOUND, "UnknownResource", f"no resource {resource!r}")
            used = self._consumed(db, resource)
            if used + units > cap[0]:
                raise ServiceError(
                    HTTPStatus.CONFLICT,
                    "InsufficientCapacity",
                    f"{resource}: {units} requested, {cap[0] - used} available",
                )
            cur = db.execute(
                "INSERT INTO reservations(resource, units, run_id, status) VALUES (?, ?, ?, 'active')",
                (resource, units, run_id),
            )
            reservation_id = f"reservation-{cur.lastrowid}"
            db.execute("UPDATE reservations SET reservation_id = ? WHERE seq = ?", (reservation_id, cur.lastrowid))
            return HTTPStatus.CREATED, {
                "reservation_id": reservation_id,
                "resource": resource,
                "units": units,
                "run_id": run_id,
                "status": "active",
            }

        return self.idempotent(key, "POST", "/reservations", body, action)

    def release(self, key: str | None, reservation_id: str) -> tuple[int, dict[str, Any], bool]:
        def action(db: sqlite3.Connection) -> tuple[int, dict[str, Any]]:
            row = db.execute(
                "SELECT resource, units, status FROM reservations WHERE reservation_id = ?", (reservation_id,)
            ).fetchone()
            if row is None:
                raise ServiceError(HTTPStatus.NOT_FOUND, "UnknownReservation", f"no reservation {reservation_id!r}")
            db.execute("UPDATE reservations SET status = 'released' WHERE reservation_id = ?", (reservation_id,))
            return HTTPStatus.OK, {
                "reservation_id": reservation_id,
                "resource": row[0],
                "units": row[1],
                "status": "released",
            }

        return self.idempotent(key, "POST", f"/reservations/{reservation_id}/release", {}, action)

    @staticmethod
    def _consumed(db: sqlite3.Connection, resource: str) -> int:
        row = db.execute(
            "SELECT COALESCE(SUM(units), 0) FROM reservations WHERE resource = ? AND status = 'active'", (resource,)
        ).fetchone()
        return int(row[0])

    def lookup(self, key: str) -> dict[str, Any] | None:
        with self._tx() as db:
            row = db.execute("SELECT status, response FROM idempotency WHERE key = ?", (key,)).fetchone()
        return None if row is None else {"key": key, "status": row[0], "response": json.loads(row[1])}

    def resource(self, name: str) -> dict[str, Any] | None:
        with self._tx() as db:
            cap = db.execute("SELECT capacity FROM resources WHERE name = ?", (name,)).fetchone()
            if cap is None:
                return None
            used = self._consumed(db, name)
            total = db.execute("SELECT COUNT(*) FROM reservations WHERE resource = ?", (name,)).fetchone()[0]
        return {
            "resource": name,
            "capacity": cap[0],
            "consumed": used,
            "available": cap[0] - used,
            "reservations": total,
        }

    def reservations(self) -> list[dict[str, Any]]:
        with self._tx() as db:
            rows = db.execute("SELECT reservation_id, resource, units, run_id, status FROM reservations ORDER BY seq")
            return [
                dict(zip(("reservation_id", "resource", "units", "run_id", "status"), r, strict=True)) for r in rows
            ]


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


if __name__ == "__main__":
    sys.exit(main())
