"""The reservation service refuses malformed requests with a JSON 400/413/411 and keeps serving.

Requests are written byte for byte on raw sockets, so that a bad ``Content-Length``, invalid UTF-8
or a control character in a header reaches the service as sent. Every refusal must be an HTTP
answer with ``{"error": <code>, "message": <one line>}``, never a dropped connection, and a valid
reservation must still succeed afterwards.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
import uuid
from typing import Any
from urllib.parse import urlsplit

import pytest

from cairn.effects import ReservationClient
from tests.integration.conftest import ReservationServer
from workers.stack.reservation import MAX_BODY_BYTES, MAX_KEY_CHARS, MAX_UNITS

pytestmark = pytest.mark.integration

VALID = b'{"resource": "FILTER-A", "units": 1, "run_id": "r"}'


class Answer:
    """One HTTP response read off a raw socket."""

    def __init__(self, response: http.client.HTTPResponse) -> None:
        self.status = response.status
        self.headers = response.headers
        self.raw = response.read()
        self.body: Any = json.loads(self.raw) if self.headers.get("Content-Type") == "application/json" else None

    @property
    def closes(self) -> bool:
        return (self.headers.get("Connection") or "").lower() == "close"


def _address(service: ReservationServer) -> tuple[str, int]:
    parts = urlsplit(service.url)
    assert parts.hostname is not None and parts.port is not None
    return parts.hostname, parts.port


def _request(
    body: bytes | None,
    *,
    key: bytes | None = None,
    content_length: bytes | None = None,
    extra: bytes = b"",
    path: bytes = b"/reservations",
) -> bytes:
    """A POST exactly as written: ``content_length`` overrides the true length of ``body``."""
    lines = [b"POST " + path + b" HTTP/1.1", b"Host: reservation", b"Content-Type: application/json"]
    if key is None:
        key = uuid.uuid4().hex.encode()
    lines.append(b"Idempotency-Key: " + key)
    if content_length is None and body is not None:
        content_length = str(len(body)).encode()
    if content_length is not None:
        lines.append(b"Content-Length: " + content_length)
    head = b"\r\n".join(lines) + b"\r\n" + extra + b"\r\n"
    return head + (body or b"")


def _exchange(service: ReservationServer, *requests: bytes, timeout: float = 5.0) -> list[Answer]:
    """Send ``requests`` on one connection (pipelined) and read one answer for each."""
    with socket.create_connection(_address(service), timeout=timeout) as sock:
        sock.sendall(b"".join(requests))
        answers = []
        for _ in requests:
            response = http.client.HTTPResponse(sock, method="POST")
            response.begin()
            answers.append(Answer(response))
        return answers


def _refused(service: ReservationServer, request: bytes, status: int, code: str) -> Answer:
    """Send one bad request; check its JSON refusal, then that a valid reservation still succeeds."""
    (answer,) = _exchange(service, request)
    assert answer.status == status, answer.raw
    assert answer.headers.get("Content-Length") == str(len(answer.raw))
    assert answer.body["error"] == code, answer.body
    message = answer.body["message"]
    assert isinstance(message, str) and message and "\n" not in message
    _still_serves(service)
    return answer


def _still_serves(service: ReservationServer) -> None:
    reservation = ReservationClient(service.url).reserve(f"after-{uuid.uuid4().hex}", "FILTER-A", 1)
    assert reservation.status == "active" and not reservation.replayed


# -- the body's bytes ---------------------------------------------------------------------------
def test_invalid_utf8_body_is_refused(reservation_service: ReservationServer) -> None:
    _refused(reservation_service, _request(b'{"resource": "FILTER-\xff\xfe", "units": 1}'), 400, "BadEncoding")


def test_invalid_utf8_keeps_the_connection_usable(reservation_service: ReservationServer) -> None:
    """The bad body was read in full, so the next request on the same connection is answered."""
    bad, good = _exchange(reservation_service, _request(b'{"resource": "\xc3\x28"}'), _request(VALID))
    assert (bad.status, bad.body["error"]) == (400, "BadEncoding") and not bad.closes
    assert good.status == 201 and good.body["status"] == "active"


@pytest.mark.parametrize("literal", [b"9" * 5000, b"-" + b"9" * 5000, b"1" + b"0" * 40])
def test_huge_integer_is_refused(reservation_service: ReservationServer, literal: bytes) -> None:
    _refused(reservation_service, _request(b'{"resource": "FILTER-A", "units": ' + literal + b"}"), 400, "BadNumber")


@pytest.mark.parametrize("literal", [b"1e400", b"-1e400", b"NaN", b"Infinity", b"-Infinity", b"0." + b"0" * 5000])
def test_non_finite_or_huge_float_is_refused(reservation_service: ReservationServer, literal: bytes) -> None:
    body = b'{"resource": "FILTER-A", "units": 1, "weight": ' + literal + b"}"
    _refused(reservation_service, _request(body), 400, "BadNumber")


@pytest.mark.parametrize("depth", [1_001, 100_000])
def test_deeply_nested_json_is_refused(reservation_service: ReservationServer, depth: int) -> None:
    body = b'{"resource": "FILTER-A", "units": 1, "x": ' + b"[" * depth + b"]" * depth + b"}"
    _refused(reservation_service, _request(body), 400, "NestingTooDeep")


def test_brackets_inside_strings_do_not_count_as_nesting(reservation_service: ReservationServer) -> None:
    body = json.dumps({"resource": "FILTER-A", "units": 1, "run_id": '[{\\"' * 2000}).encode()
    (answer,) = _exchange(reservation_service, _request(body))
    assert answer.status == 201, answer.raw


# -- the body's fields --------------------------------------------------------------------------
def test_units_true_is_not_an_integer(reservation_service: ReservationServer) -> None:
    _refused(reservation_service, _request(b'{"resource": "FILTER-A", "units": true}'), 400, "BadRequest")


@pytest.mark.parametrize("units", [MAX_UNITS + 1, 2**63, 10**19])
def test_units_above_the_bound_are_refused(reservation_service: ReservationServer, units: int) -> None:
    body = json.dumps({"resource": "FILTER-A", "units": units}).encode()
    answer = _refused(reservation_service, _request(body), 400, "BadRequest")
    assert str(MAX_UNITS) in answer.body["message"]


@pytest.mark.parametrize("units", [0, -1, 1.5, "2", None])
def test_units_not_a_positive_integer_are_refused(reservation_service: ReservationServer, units: Any) -> None:
    _refused(
        reservation_service, _request(json.dumps({"resource": "FILTER-A", "units": units}).encode()), 400, "BadRequest"
    )


@pytest.mark.parametrize(
    "body",
    [
        b"{}",
        b'{"units": 1}',
        b'{"resource": "FILTER-A"}',
        b'{"resource": "FILTER-A", "units": 1, "run_id": {"nested": 1}}',
        b'{"resource": "FILTER-A", "units": 1, "run_id": 7}',
        b'{"resource": "\\ud800", "units": 1}',
        b'{"resource": "FILTER-A", "units": 1, "run_id": "\\udfff"}',
    ],
)
def test_missing_or_mistyped_fields_are_refused(reservation_service: ReservationServer, body: bytes) -> None:
    _refused(reservation_service, _request(body), 400, "BadRequest")


@pytest.mark.parametrize("body", [b"[1, 2]", b'"FILTER-A"', b"null", b"1", b"9" * 5000])
def test_non_object_json_is_refused(reservation_service: ReservationServer, body: bytes) -> None:
    (answer,) = _exchange(reservation_service, _request(body))
    assert answer.status == 400 and answer.body["error"] in {"BadJSON", "BadNumber"}, answer.raw
    _still_serves(reservation_service)


# -- framing: Content-Length and Transfer-Encoding ----------------------------------------------
@pytest.mark.parametrize("value", [b"-1", b"abc", b"+5", b"1_0", b"0x10", b" ", b"1e3", b"3.0"])
def test_bad_content_length_is_refused_and_closes(reservation_service: ReservationServer, value: bytes) -> None:
    answer = _refused(reservation_service, _request(VALID, content_length=value), 400, "BadContentLength")
    assert answer.closes


def test_conflicting_content_lengths_are_refused(reservation_service: ReservationServer) -> None:
    request = _request(VALID, extra=b"Content-Length: 3\r\n")
    answer = _refused(reservation_service, request, 400, "BadContentLength")
    assert answer.closes


@pytest.mark.parametrize("length", [MAX_BODY_BYTES + 1, 10**23])
def test_body_over_the_bound_is_413_and_closes(reservation_service: ReservationServer, length: int) -> None:
    request = _request(None, content_length=str(length).encode())
    answer = _refused(reservation_service, request, 413, "TooLarge")
    assert answer.closes


def test_body_at_the_bound_is_read(reservation_service: ReservationServer) -> None:
    prefix = b'{"resource": "FILTER-A", "units": 1, "pad": "'
    body = prefix + b"x" * (MAX_BODY_BYTES - len(prefix) - 2) + b'"}'
    assert len(body) == MAX_BODY_BYTES
    (answer,) = _exchange(reservation_service, _request(body))
    assert answer.status == 201, answer.raw


def test_chunked_body_is_refused_and_closes(reservation_service: ReservationServer) -> None:
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(VALID), VALID)
    request = _request(None, extra=b"Transfer-Encoding: chunked\r\n") + chunked
    answer = _refused(reservation_service, request, 411, "LengthRequired")
    assert answer.closes


def test_truncated_body_is_refused(reservation_service: ReservationServer) -> None:
    """The client promises more bytes than it sends, then stops writing."""
    with socket.create_connection(_address(reservation_service), timeout=5) as sock:
        sock.sendall(_request(VALID[:10], content_length=str(len(VALID)).encode()))
        sock.shutdown(socket.SHUT_WR)
        response = http.client.HTTPResponse(sock, method="POST")
        response.begin()
        answer = Answer(response)
    assert (answer.status, answer.body["error"]) == (400, "IncompleteBody") and answer.closes
    _still_serves(reservation_service)


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        (b"GARBAGE\r\n\r\n", 400, "BadRequest"),
        (b"POST /reservations HTTP/9.9\r\nHost: x\r\n\r\n", 505, "HttpVersionNotSupported"),
        (b"PUT /reservations HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}", 501, "NotImplemented"),
    ],
)
def test_malformed_request_line_or_method_is_answered_in_json(
    reservation_service: ReservationServer, request_bytes: bytes, status: int, code: str
) -> None:
    answer = _refused(reservation_service, request_bytes, status, code)
    assert answer.closes


def test_body_sent_to_a_route_without_one_closes(reservation_service: ReservationServer) -> None:
    """Bytes nobody reads would be taken for the next request, so the answer closes the connection."""
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: 20\r\n\r\nGET /x HTTP/1.1\r\n\r\n"
    (answer,) = _exchange(reservation_service, request)
    assert answer.status == 200 and answer.closes


# -- the Idempotency-Key header -----------------------------------------------------------------
def test_idempotency_key_at_the_bound_is_accepted(reservation_service: ReservationServer) -> None:
    (answer,) = _exchange(reservation_service, _request(VALID, key=b"k" * MAX_KEY_CHARS))
    assert answer.status == 201, answer.raw


def test_idempotency_key_over_the_bound_is_refused(reservation_service: ReservationServer) -> None:
    _refused(reservation_service, _request(VALID, key=b"k" * (MAX_KEY_CHARS + 1)), 400, "BadIdempotencyKey")


@pytest.mark.parametrize("char", [b"\x00", b"\x01", b"\x1b", b"\x7f", b"\t"])
def test_idempotency_key_with_control_characters_is_refused(
    reservation_service: ReservationServer, char: bytes
) -> None:
    _refused(reservation_service, _request(VALID, key=b"wf" + char + b"reserve"), 400, "BadIdempotencyKey")


def test_refused_key_on_release_too(reservation_service: ReservationServer) -> None:
    request = _request(b"{}", key=b"k" * (MAX_KEY_CHARS + 1), path=b"/reservations/reservation-1/release")
    _refused(reservation_service, request, 400, "BadIdempotencyKey")


# -- many clients at once -----------------------------------------------------------------------
def test_200_concurrent_clients_are_all_answered(reservation_service: ReservationServer) -> None:
    """200 connections opened at the same instant: none reset or refused, each gets an answer.

    Even clients reserve one unit each (the fixture's FILTER-A holds 8), odd clients ask /health.
    """
    clients = 200
    host, port = _address(reservation_service)
    start = threading.Barrier(clients)
    statuses: dict[int, int] = {}
    failures: dict[int, BaseException] = {}

    def one(i: int) -> None:
        try:
            start.wait(timeout=30)
            conn = http.client.HTTPConnection(host, port, timeout=30)
            try:
                if i % 2:
                    conn.request("GET", "/health")
                else:
                    body = json.dumps({"resource": "FILTER-A", "units": 1, "run_id": f"c{i}"})
                    headers = {"Content-Type": "application/json", "Idempotency-Key": f"concurrent/{i}"}
                    conn.request("POST", "/reservations", body=body, headers=headers)
                response = conn.getresponse()
                response.read()
                statuses[i] = response.status
            finally:
                conn.close()
        except BaseException as exc:  # recorded and asserted on below
            failures[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)

    assert not failures, f"{len(failures)} of {clients} failed: {sorted({type(e).__name__ for e in failures.values()})}"
    assert len(statuses) == clients
    assert all(statuses[i] == 200 for i in range(1, clients, 2))
    reserves = [statuses[i] for i in range(0, clients, 2)]
    assert reserves.count(201) == 8 and reserves.count(409) == clients // 2 - 8, reserves
    assert ReservationClient(reservation_service.url).usage("FILTER-A")["consumed"] == 8


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [
        ({"Idempotency-Key": "k"}, b"x" * (2 << 20), 413, "TooLarge"),
        ({"Idempotency-Key": "k" * (100 << 10)}, b"{}", 431, "RequestHeaderFieldsTooLarge"),
    ],
    ids=["2MiB-body", "100KiB-header"],
)
def test_oversized_requests_are_answered_with_a_status_and_the_service_keeps_serving(
    reservation_service: ReservationServer, headers: dict[str, str], body: bytes, status: int, code: str
) -> None:
    """The client sends the whole oversized request, in pieces, as HTTP clients do: it reads the
    status instead of a broken pipe or a reset (the service drops what it will not read)."""
    import time

    url = urlsplit(reservation_service.url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)

    def pieces() -> Any:
        for i in range(0, len(body), 1 << 16):
            yield body[i : i + (1 << 16)]
            time.sleep(0.001)

    conn.request("POST", "/reservations", body=pieces(), headers={**headers, "Content-Length": str(len(body))})
    response = conn.getresponse()
    assert response.status == status
    assert json.loads(response.read())["error"] == code
    conn.close()
    health = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    try:
        health.request("GET", "/health")
        answer = health.getresponse()
        assert answer.status == 200 and json.loads(answer.read()) == {"ok": True}
    finally:
        health.close()
