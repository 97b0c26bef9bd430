"""What the reservation service accepts in a request: the body's JSON, its fields and the key.

A body is a UTF-8 JSON object, nested at most ``MAX_JSON_DEPTH`` deep (checked before parsing),
with number literals of at most ``MAX_NUMBER_CHARS`` characters and no ``NaN``/``Infinity``; a
reservation's ``units`` is an integer from 1 to ``MAX_UNITS``. An ``Idempotency-Key`` has at most
``MAX_KEY_CHARS`` characters and no control character. Each refusal is a ``ServiceError`` (400).
"""

from __future__ import annotations

import json
import math
import re
from http import HTTPStatus
from typing import Any, TypeGuard

from workers.stack.reservation.errors import ServiceError

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_NUMBER_CHARS",
    "MAX_UNITS",
    "MAX_KEY_CHARS",
    "parse_body",
    "check_key",
    "reservation_request",
]

MAX_BODY_BYTES = 1 << 20
MAX_JSON_DEPTH = 32
MAX_NUMBER_CHARS = 40
MAX_UNITS = 1_000_000
MAX_KEY_CHARS = 256

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


def reservation_request(body: dict[str, Any]) -> tuple[str, int, str | None]:
    """``(resource, units, run_id)`` of a ``POST /reservations`` body, else ``400 BadRequest``."""
    resource, units, run_id = body.get("resource"), body.get("units"), body.get("run_id")
    if not (_is_text(resource) and _is_units(units) and (run_id is None or _is_text(run_id))):
        raise ServiceError(
            HTTPStatus.BAD_REQUEST,
            "BadRequest",
            f"body needs resource (string), units (integer, 1 to {MAX_UNITS}) and optionally run_id (string)",
        )
    return resource, units, run_id
