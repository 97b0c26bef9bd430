"""The reservation service's routes: a request whose body has been read in full becomes a JSON
``Reply``. No sockets here; ``server`` frames requests and writes replies.

Routes: ``POST /reservations``, ``POST /reservations/{id}/release``, ``GET /idempotency/{key}``,
``GET /resources/{name}``, ``GET /reservations``, ``GET /health``. A refusal is a ``ServiceError``
answered as ``{"error": <code>, "message": <one line>}``; a bug is ``500 InternalError``. The
connection stays open after any of these: the body was read as framed.
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from urllib.parse import unquote

from workers.stack.reservation.body import parse_body
from workers.stack.reservation.errors import ServiceError, error_body
from workers.stack.reservation.service import ReservationService

__all__ = ["Reply", "ReservationApp"]


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any
    replayed: bool = False
    """The outcome recorded for the request's ``Idempotency-Key`` earlier, answered again."""


def _idempotency_key(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    """The ``Idempotency-Key`` header's value (Latin-1, as HTTP field values are), if sent once."""
    values = [value for name, value in headers if name == b"idempotency-key"]
    if len(values) > 1:
        raise ServiceError(HTTPStatus.BAD_REQUEST, "BadIdempotencyKey", "Idempotency-Key must be sent once")
    return values[0].decode("latin-1") if values else None


class ReservationApp:
    """The routes over one ``ReservationService``; ``answer`` may be called from several threads."""

    def __init__(self, service: ReservationService) -> None:
        self.service = service

    def answer(self, method: str, target: str, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> Reply:
        """The reply to one request; ``headers`` as h11 gives them (lower-case names)."""
        try:
            return self._route(method, target, headers, body)
        except ServiceError as exc:
            return Reply(exc.status, exc.body())
        except Exception:  # a bug, not a refusal: answer it in JSON rather than drop the connection
            sys.stderr.write(f"reservation-service: internal error on {method} {target}\n{traceback.format_exc()}")
            return Reply(
                HTTPStatus.INTERNAL_SERVER_ERROR, error_body("InternalError", "the service failed; see its log")
            )

    def _route(self, method: str, target: str, headers: Sequence[tuple[bytes, bytes]], body: bytes) -> Reply:
        parts = [unquote(p) for p in target.split("?")[0].strip("/").split("/") if p]
        if method == "GET" and parts == ["health"]:
            return Reply(HTTPStatus.OK, {"ok": True})
        if method == "GET" and parts == ["reservations"]:
            return Reply(HTTPStatus.OK, {"reservations": self.service.reservations()})
        if method == "GET" and len(parts) == 2 and parts[0] == "resources":
            found = self.service.resource(parts[1])
            if found is None:
                raise ServiceError(HTTPStatus.NOT_FOUND, "UnknownResource", f"no resource {parts[1]!r}")
            return Reply(HTTPStatus.OK, found)
        if method == "GET" and len(parts) >= 2 and parts[0] == "idempotency":
            key = "/".join(parts[1:])
            outcome = self.service.lookup(key)
            if outcome is None:
                raise ServiceError(HTTPStatus.NOT_FOUND, "UnknownKey", f"no outcome recorded for {key!r}")
            return Reply(HTTPStatus.OK, outcome)
        if method == "POST" and parts == ["reservations"]:
            return Reply(*self.service.reserve(_idempotency_key(headers), parse_body(body)))
        if method == "POST" and len(parts) == 3 and parts[0] == "reservations" and parts[2] == "release":
            parse_body(body)  # a release carries no fields, but what it carries must still be JSON
            return Reply(*self.service.release(_idempotency_key(headers), parts[1]))
        raise ServiceError(HTTPStatus.NOT_FOUND, "NotFound", f"{method} {target}")
