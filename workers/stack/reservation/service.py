"""The reservation service's state and rules, independent of HTTP: resources, reservations and
the idempotency records, in one SQLite file.

A mutating request runs once per ``Idempotency-Key``, in one serialized transaction with the
record of its outcome, a success or a refusal by the service's rules (capacity, an unknown
resource or reservation); the same key and request again replay that outcome, the same key with a
different request is ``422 IdempotencyConflict``. A request refused before it ran (a malformed
body or key) records nothing.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Iterator
from contextlib import closing, contextmanager
from http import HTTPStatus
from pathlib import Path
from typing import Any

from workers.stack.reservation.body import check_key, reservation_request
from workers.stack.reservation.errors import ServiceError

__all__ = ["ReservationService"]

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
        """Run ``action(db)`` once per key and record its outcome, a refusal (``ServiceError``)
        included; replay the recorded outcome for the same request (a created reservation
        replays as ``200``: nothing is created this time)."""
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
                status = int(row[1])
                return (HTTPStatus.OK if status == HTTPStatus.CREATED else status), json.loads(row[2]), True
            db.execute("SAVEPOINT action")
            try:
                status, response = action(db)
            except ServiceError as exc:  # refused by the rules: undo what it wrote, record the refusal
                db.execute("ROLLBACK TO action")
                status, response = exc.status, exc.body()
            db.execute("RELEASE action")
            db.execute(
                "INSERT INTO idempotency(key, request_hash, status, response) VALUES (?, ?, ?, ?)",
                (key, digest, int(status), json.dumps(response)),
            )
            return status, response, False

    def reserve(self, key: str | None, body: dict[str, Any]) -> tuple[int, dict[str, Any], bool]:
        resource, units, run_id = reservation_request(body)

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
        """The effect performed under ``key``, or None if the key is unknown; a key whose recorded
        outcome is a refusal performed nothing, which is ``404 NotPerformed``."""
        with self._tx() as db:
            row = db.execute("SELECT status, response FROM idempotency WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        status, response = int(row[0]), json.loads(row[1])
        if status >= HTTPStatus.BAD_REQUEST:
            raise ServiceError(
                HTTPStatus.NOT_FOUND,
                "NotPerformed",
                f"Idempotency-Key {key!r} was refused ({status} {response.get('error')}); nothing was performed",
            )
        return {"key": key, "status": status, "response": response}

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
