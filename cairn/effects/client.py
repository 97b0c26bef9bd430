"""Client of the reservation service: the HTTP ``Idempotency-Key`` convention.

Errors are translated here: a refused request (conflict, capacity, unknown) raises a
non-retryable ``EffectError``; a key reused with another body raises
``IdempotencyConflictError``; an unreachable service or a 5xx raises ``EffectUnavailableError``,
which callers retry with the same key.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from cairn.errors import EffectError, EffectUnavailableError, IdempotencyConflictError

__all__ = ["ReservationClient", "Reservation", "EffectUnavailableError"]


@dataclass(frozen=True)
class Reservation:
    reservation_id: str
    resource: str
    units: int
    status: str
    replayed: bool = False
    """True when the service answered with the outcome recorded for this key earlier."""


class ReservationClient:
    def __init__(self, base_url: str, timeout: float = 3.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: dict[str, Any] | None, key: str | None) -> tuple[int, Any, bool]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if key is not None:
            req.add_header("Idempotency-Key", key)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                replayed = resp.headers.get("Idempotent-Replayed") == "true"
                return resp.status, json.loads(resp.read() or b"null"), replayed
        except urllib.error.HTTPError as exc:
            payload = json.loads(exc.read() or b"{}") if exc.headers.get("Content-Type") == "application/json" else {}
            if exc.code >= 500:
                raise EffectUnavailableError(f"{method} {path}: service error {exc.code}") from exc
            if exc.code == 404 and method == "GET":
                return 404, None, False
            code = payload.get("error", str(exc.code))
            message = payload.get("message", exc.reason)
            if code == "IdempotencyConflict":
                raise IdempotencyConflictError(
                    message, field="Idempotency-Key", expected="the original request body", found=key
                ) from exc
            raise EffectError(f"{method} {path} refused: {code}: {message}") from exc
        except (urllib.error.URLError, OSError) as exc:
            raise EffectUnavailableError(f"{method} {path}: service unreachable at {self.base_url} ({exc})") from exc

    def reserve(self, key: str, resource: str, units: int, run_id: str | None = None) -> Reservation:
        _, body, replayed = self._call(
            "POST", "/reservations", {"resource": resource, "units": units, "run_id": run_id}, key
        )
        return Reservation(body["reservation_id"], body["resource"], body["units"], body["status"], replayed)

    def release(self, key: str, reservation_id: str) -> Reservation:
        _, body, replayed = self._call("POST", f"/reservations/{quote(reservation_id)}/release", {}, key)
        return Reservation(body["reservation_id"], body["resource"], body["units"], body["status"], replayed)

    def lookup(self, key: str) -> dict[str, Any] | None:
        """The outcome the service recorded for ``key``, or None if it never performed it."""
        status, body, _ = self._call("GET", f"/idempotency/{quote(key, safe='/')}", None, None)
        return None if status == 404 else body

    def usage(self, resource: str) -> dict[str, Any]:
        status, body, _ = self._call("GET", f"/resources/{quote(resource)}", None, None)
        if status == 404:
            raise EffectError(f"unknown resource {resource!r}")
        return dict(body)

    def reservations(self) -> list[dict[str, Any]]:
        _, body, _ = self._call("GET", "/reservations", None, None)
        return list(body["reservations"])
