"""The reservation service: a stand-in external system (a capacity broker) that keeps state and
honors idempotency keys, over HTTP + JSON, backed by SQLite.

Run it with ``python -m workers.stack.reservation --port 8377 --db reservations.db`` (``cairn dev
up`` and the drill's embedded stack start one). ``body``: what a request may carry; ``service``:
the state and the idempotency rules; ``app``: the routes; ``server``: HTTP/1.1 on h11 and asyncio,
its limits (``limits``) and ``main``.
"""

from __future__ import annotations

from workers.stack.reservation.body import (
    MAX_BODY_BYTES,
    MAX_JSON_DEPTH,
    MAX_KEY_CHARS,
    MAX_NUMBER_CHARS,
    MAX_UNITS,
    check_key,
    parse_body,
)
from workers.stack.reservation.limits import ServerLimits
from workers.stack.reservation.server import ReservationHTTPServer, main, serve
from workers.stack.reservation.service import ReservationService

__all__ = [
    "ReservationService",
    "ReservationHTTPServer",
    "ServerLimits",
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
