"""A real external service that keeps state and honors idempotency keys: capacity reservations.

HTTP + JSON, backed by SQLite (one file, transactions, unique constraints). It stands in for
the systems a training run touches (a capacity broker, a quota service). Run it with
``python -m workers.reservation_service --port 8377 --db reservations.db`` (``cairn dev up``
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
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import closing, contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote

__all__ = ["ReservationService", "serve", "main"]

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
    def __init__(self, status: HTTPStatus, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


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
        if not key:
            raise ServiceError(HTTPStatus.BAD_REQUEST, "MissingIdempotencyKey", "Idempotency-Key header is required")
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
        resource, units = body.get("resource"), body.get("units")
        if not isinstance(resource, str) or not isinstance(units, int) or units <= 0:
            raise ServiceError(HTTPStatus.BAD_REQUEST, "BadRequest", "body needs resource (string) and units (> 0)")

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
                (resource, units, body.get("run_id")),
            )
            reservation_id = f"reservation-{cur.lastrowid}"
            db.execute("UPDATE reservations SET reservation_id = ? WHERE seq = ?", (reservation_id, cur.lastrowid))
            return HTTPStatus.CREATED, {
                "reservation_id": reservation_id,
                "resource": resource,
                "units": units,
                "run_id": body.get("run_id"),
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

        def log_message(self, fmt: str, *args: Any) -> None:
            sys.stderr.write("reservation-service: " + (fmt % args) + "\n")

        def _send(self, status: int, body: Any, replayed: bool = False) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if replayed:
                self.send_header("Idempotent-Replayed", "true")
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            if length > 1 << 20:
                raise ServiceError(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "TooLarge", "body over 1 MiB")
            raw = self.rfile.read(length) if length else b"{}"
            try:
                body = json.loads(raw or b"{}")
            except json.JSONDecodeError as exc:
                raise ServiceError(HTTPStatus.BAD_REQUEST, "BadJSON", str(exc)) from exc
            if not isinstance(body, dict):
                raise ServiceError(HTTPStatus.BAD_REQUEST, "BadJSON", "body must be a JSON object")
            return body

        def _route(self, method: str) -> None:
            parts = [unquote(p) for p in self.path.split("?")[0].strip("/").split("/") if p]
            try:
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
                self._send(404, {"error": "NotFound", "message": f"{method} {self.path}"})
            except ServiceError as exc:
                self._send(exc.status, {"error": exc.code, "message": str(exc)})

        def do_GET(self) -> None:  # noqa: N802
            self._route("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._route("POST")

    return Handler


def serve(port: int, db_path: Path, capacities: dict[str, int], host: str = "127.0.0.1") -> ThreadingHTTPServer:
    service = ReservationService(db_path, capacities)
    server = ThreadingHTTPServer((host, port), _handler(service))
    server.daemon_threads = True
    return server


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
