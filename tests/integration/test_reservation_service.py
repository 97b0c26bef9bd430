"""The reservation service refuses malformed requests with a JSON 400/413/411 and keeps serving.

Requests are written byte for byte on raw sockets, so that a bad ``Content-Length``, invalid UTF-8
or a control character in a header reaches the service as sent. Every refusal must be an HTTP
answer with ``{"error": <code>, "message": <one line>}``, never a dropped connection, and a valid
reservation must still succeed afterwards. A request whose framing is ambiguous is refused whole:
nothing in it, and nothing smuggled behind it, is executed. Slow clients are cut off on time,
connections are capped, and a key's recorded outcome (a success or a refusal) is replayed.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import selectors
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from cairn.effects import ReservationClient
from tests.integration.conftest import ReservationServer
from workers.stack.reservation import (
    MAX_BODY_BYTES,
    MAX_KEY_CHARS,
    MAX_UNITS,
    ReservationHTTPServer,
    ServerLimits,
    serve,
)
from workers.stack.servers import free_port, wait_for_http

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


class _Stream:
    """One buffered reader shared by the answers read off a socket (``HTTPResponse`` would make a
    new one per answer and lose what the previous one had buffered of the next)."""

    def __init__(self, sock: socket.socket) -> None:
        self._file = sock.makefile("rb")

    def makefile(self, *args: Any, **kwargs: Any) -> Any:
        return self

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)

    def close(self) -> None:
        """``HTTPResponse`` closes its reader after each answer; the socket's owner closes it."""

    def answer(self) -> Answer:
        response = http.client.HTTPResponse(self, method="POST")  # type: ignore[arg-type]
        response.begin()
        return Answer(response)

    def at_eof(self) -> bool:
        try:
            return self._file.read(1) == b""
        except ConnectionResetError:
            return True


def _exchange(service: ReservationServer, *requests: bytes, timeout: float = 5.0) -> list[Answer]:
    """Send ``requests`` on one connection (pipelined) and read one answer for each."""
    with socket.create_connection(_address(service), timeout=timeout) as sock:
        sock.sendall(b"".join(requests))
        stream = _Stream(sock)
        return [stream.answer() for _ in requests]


def _answers_until_closed(service: ReservationServer, data: bytes, timeout: float = 5.0) -> list[Answer]:
    """Send ``data``, stop writing, and read every answer until the service closes the connection."""
    with socket.create_connection(_address(service), timeout=timeout) as sock:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
        stream, answers = _Stream(sock), []
        while True:
            try:
                answers.append(stream.answer())
            except (http.client.RemoteDisconnected, ConnectionResetError):
                return answers


def _wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.01)


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
@pytest.mark.parametrize("value", [b"-1", b"abc", b"+5", b"1_0", b"0x10", b" ", b"1e3", b"3.0", b"1" + b"0" * 23])
def test_bad_content_length_is_refused_and_closes(reservation_service: ReservationServer, value: bytes) -> None:
    answer = _refused(reservation_service, _request(VALID, content_length=value), 400, "BadContentLength")
    assert answer.closes


def test_conflicting_content_lengths_are_refused(reservation_service: ReservationServer) -> None:
    request = _request(VALID, extra=b"Content-Length: 3\r\n")
    answer = _refused(reservation_service, request, 400, "BadContentLength")
    assert answer.closes


@pytest.mark.parametrize("length", [MAX_BODY_BYTES + 1, 10**19])
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


def test_body_sent_to_a_route_without_one_is_read_not_taken_for_a_request(
    reservation_service: ReservationServer,
) -> None:
    """A body is framed by its ``Content-Length`` on every route, so bytes that look like a request
    inside it are never answered as one; the next real request on the connection is."""
    inner = b"GET /x HTTP/1.1\r\nHost: x\r\n\r\n"
    request = b"GET /health HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(inner), inner)
    then = b"GET /reservations HTTP/1.1\r\nHost: x\r\n\r\n"
    answers = _answers_until_closed(reservation_service, request + then)
    assert [(a.status, a.body) for a in answers] == [(200, {"ok": True}), (200, {"reservations": []})]


# -- the Idempotency-Key header -----------------------------------------------------------------
def test_idempotency_key_at_the_bound_is_accepted(reservation_service: ReservationServer) -> None:
    (answer,) = _exchange(reservation_service, _request(VALID, key=b"k" * MAX_KEY_CHARS))
    assert answer.status == 201, answer.raw


def test_idempotency_key_over_the_bound_is_refused(reservation_service: ReservationServer) -> None:
    _refused(reservation_service, _request(VALID, key=b"k" * (MAX_KEY_CHARS + 1)), 400, "BadIdempotencyKey")


@pytest.mark.parametrize("char", [b"\x01", b"\x1b", b"\x7f", b"\t"])
def test_idempotency_key_with_control_characters_is_refused(
    reservation_service: ReservationServer, char: bytes
) -> None:
    _refused(reservation_service, _request(VALID, key=b"wf" + char + b"reserve"), 400, "BadIdempotencyKey")


def test_nul_in_a_header_is_a_malformed_request(reservation_service: ReservationServer) -> None:
    """RFC 9110 section 5.5: a NUL in a field value is refused by the HTTP layer, before any route."""
    answer = _refused(reservation_service, _request(VALID, key=b"wf\x00reserve"), 400, "BadRequest")
    assert answer.closes


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

    try:
        conn.request("POST", "/reservations", body=pieces(), headers={**headers, "Content-Length": str(len(body))})
        response = conn.getresponse()
        assert response.status == status
        assert json.loads(response.read())["error"] == code
    finally:
        conn.close()
    health = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
    try:
        health.request("GET", "/health")
        answer = health.getresponse()
        assert answer.status == 200 and json.loads(answer.read()) == {"ok": True}
    finally:
        health.close()


# -- request smuggling: framing a lenient parser would read differently --------------------------
SMUGGLED = _request(b'{"resource": "FILTER-A", "units": 8, "run_id": "smuggled"}', key=b"smuggled")
"""A complete reservation of the whole capacity, sent as the body of a release."""


@pytest.mark.parametrize(
    ("framing", "status", "code"),
    [
        (b"Content-Length : %d\r\n" % len(SMUGGLED), 400, "BadRequest"),
        (b"Content-Length: 0\r\nContent-Length: %d\r\n" % len(SMUGGLED), 400, "BadContentLength"),
        (b"Content-Length: 0\r\n %d\r\n" % len(SMUGGLED), 400, "BadContentLength"),
        (b"Transfer-Encoding: chunked\r\nContent-Length: 0\r\n", 400, "ConflictingFraming"),
        (b"Transfer-Encoding : chunked\r\nContent-Length: 0\r\n", 400, "BadRequest"),
        (b"Transfer-Encoding: chunked\r\n", 411, "LengthRequired"),
        (b"Transfer-Encoding: gzip, chunked\r\n", 501, "NotImplemented"),
    ],
    ids=[
        "space-before-colon",
        "conflicting-lengths",
        "obs-fold",
        "te-and-cl",
        "te-space-before-colon",
        "chunked",
        "te-gzip",
    ],
)
def test_a_request_smuggled_behind_ambiguous_framing_is_not_executed(
    reservation_service: ReservationServer, framing: bytes, status: int, code: str
) -> None:
    """A release whose body is a second, complete request: the release is refused whole (RFC 9112
    section 5.1 / 6.1), the connection closes, and neither request changes the store."""
    client = ReservationClient(reservation_service.url)
    held = client.reserve("setup", "FILTER-A", 8)
    release = (
        b"POST /reservations/" + held.reservation_id.encode() + b"/release HTTP/1.1\r\nHost: x\r\n"
        b"Idempotency-Key: outer\r\n" + framing + b"\r\n"
    )
    answers = _answers_until_closed(reservation_service, release + SMUGGLED)
    assert [(a.status, a.body.get("error")) for a in answers] == [(status, code)], [a.raw for a in answers]
    assert answers[0].closes and "\n" not in answers[0].body["message"]
    assert client.reservations() == [
        {"reservation_id": held.reservation_id, "resource": "FILTER-A", "units": 8, "run_id": None, "status": "active"}
    ]
    assert client.lookup("outer") is None and client.lookup("smuggled") is None


@pytest.mark.parametrize("lengths", [b"Content-Length: %d\r\nContent-Length: %d\r\n", b"Content-Length: %d, %d\r\n"])
def test_repeated_equal_content_lengths_are_one_length(reservation_service: ReservationServer, lengths: bytes) -> None:
    """RFC 9110 section 8.6 lets a recipient take a repeated identical length as that length."""
    head = b"POST /reservations HTTP/1.1\r\nHost: x\r\nIdempotency-Key: twice\r\n"
    (answer,) = _exchange(reservation_service, head + lengths % (len(VALID), len(VALID)) + b"\r\n" + VALID)
    assert answer.status == 201, answer.raw


# -- a key's outcome, success or refusal, is recorded and replayed ------------------------------
def _post(service: ReservationServer, path: str, key: str, body: dict[str, Any]) -> Answer:
    (answer,) = _exchange(service, _request(json.dumps(body).encode(), key=key.encode(), path=path.encode()))
    return answer


def test_a_refusal_is_replayed_for_the_same_key_and_body(reservation_service: ReservationServer) -> None:
    """A refused reservation stays refused for its key, even once capacity is free again."""
    client = ReservationClient(reservation_service.url)
    held = client.reserve("holder", "FILTER-A", 8)
    ask = {"resource": "FILTER-A", "units": 1, "run_id": "late"}
    first = _post(reservation_service, "/reservations", "late", ask)
    assert (first.status, first.body.get("error")) == (409, "InsufficientCapacity")
    assert first.headers.get("Idempotent-Replayed") is None
    client.release("free", held.reservation_id)
    again = _post(reservation_service, "/reservations", "late", ask)
    assert (again.status, again.body) == (first.status, first.body)
    assert again.headers.get("Idempotent-Replayed") == "true" and not again.closes
    assert client.usage("FILTER-A")["consumed"] == 0
    assert client.lookup("late") is None  # nothing was performed under the key


@pytest.mark.parametrize("outcome", ["refused", "succeeded"])
def test_same_key_with_another_body_is_422(reservation_service: ReservationServer, outcome: str) -> None:
    units = 9 if outcome == "refused" else 1
    first = _post(reservation_service, "/reservations", "k", {"resource": "FILTER-A", "units": units})
    assert first.status == (409 if outcome == "refused" else 201), first.raw
    other = _post(reservation_service, "/reservations", "k", {"resource": "FILTER-A", "units": 2})
    assert (other.status, other.body.get("error")) == (422, "IdempotencyConflict"), other.raw
    assert "\n" not in other.body["message"]
    assert ReservationClient(reservation_service.url).usage("FILTER-A")["consumed"] == (0 if units == 9 else 1)


def test_a_refused_release_is_recorded_against_its_key(reservation_service: ReservationServer) -> None:
    missing = _post(reservation_service, "/reservations/reservation-9/release", "rel", {})
    assert (missing.status, missing.body.get("error")) == (404, "UnknownReservation")
    held = ReservationClient(reservation_service.url).reserve("r", "FILTER-A", 1)
    other = _post(reservation_service, f"/reservations/{held.reservation_id}/release", "rel", {})
    assert (other.status, other.body.get("error")) == (422, "IdempotencyConflict")
    same = _post(reservation_service, "/reservations/reservation-9/release", "rel", {})
    assert (same.status, same.body) == (404, missing.body) and same.headers.get("Idempotent-Replayed") == "true"


def test_a_request_refused_before_it_ran_leaves_its_key_free(reservation_service: ReservationServer) -> None:
    """A body that does not validate never reaches the service's rules, so nothing is recorded."""
    bad = _post(reservation_service, "/reservations", "v", {"resource": "FILTER-A", "units": 0})
    assert (bad.status, bad.body["error"]) == (400, "BadRequest")
    good = _post(reservation_service, "/reservations", "v", {"resource": "FILTER-A", "units": 1})
    assert good.status == 201, good.raw


def test_lookup_of_a_refused_key_says_nothing_was_performed(reservation_service: ReservationServer) -> None:
    _post(reservation_service, "/reservations", "over", {"resource": "FILTER-A", "units": 9})
    (answer,) = _exchange(reservation_service, b"GET /idempotency/over HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (answer.status, answer.body["error"]) == (404, "NotPerformed") and "409" in answer.body["message"]


# -- slow clients, idle connections and the connection cap --------------------------------------
@pytest.fixture
def limited_service(tmp_path: Path) -> Iterator[Callable[[ServerLimits], tuple[ReservationServer, Any]]]:
    """Start services under given limits (short timeouts, a small cap); all are stopped at the end."""
    stops: list[Callable[[], None]] = []

    def start(limits: ServerLimits) -> tuple[ReservationServer, ReservationHTTPServer]:
        server = serve(0, tmp_path / f"limited-{len(stops)}.db", {"FILTER-A": 8}, limits=limits)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)

        stops.append(stop)
        return ReservationServer(url=f"http://127.0.0.1:{server.server_address[1]}"), server

    yield start
    for stop in stops:
        stop()


def test_300_slow_clients_are_cut_off_on_time_and_others_are_served(
    limited_service: Callable[[ServerLimits], tuple[ReservationServer, Any]],
) -> None:
    """300 clients trickle a request head a byte at a time (each byte well inside any per-read
    timeout): a normal client is still answered at once, and every slow one is answered 408 and
    closed when the head deadline passes, not later."""
    head_timeout = 3.0
    service, server = limited_service(
        ServerLimits(head_timeout_s=head_timeout, body_timeout_s=3.0, idle_timeout_s=3.0, drain_timeout_s=0.2)
    )
    clients, slack = 300, 2.0
    partial = b"POST /reservations HTTP/1.1\r\nHost: x\r\nX-Slow: "
    opened: dict[socket.socket, float] = {}
    closed: dict[socket.socket, float] = {}
    received: dict[socket.socket, bytes] = {}
    selector = selectors.DefaultSelector()
    try:
        for _ in range(clients):
            sock = socket.create_connection(_address(service), timeout=5)
            sock.sendall(partial[:12])
            sock.setblocking(False)
            opened[sock], received[sock] = time.monotonic(), b""
            selector.register(sock, selectors.EVENT_READ)

        sent, next_byte, answered_in = 12, 0.0, None
        check_at = max(opened.values()) + 1.0  # a normal client, while all 300 are mid-trickle
        deadline = max(opened.values()) + head_timeout + slack
        while len(closed) < clients and time.monotonic() < deadline:
            if time.monotonic() >= next_byte:  # one more byte from every open client, every 100 ms
                byte = partial[sent : sent + 1] or b"a"
                sent += 1
                for sock in opened.keys() - closed.keys():
                    with contextlib.suppress(OSError):
                        sock.send(byte)
                next_byte = time.monotonic() + 0.1
            if answered_in is None and time.monotonic() >= check_at:
                assert not closed
                start = time.monotonic()
                reservation = ReservationClient(service.url, timeout=head_timeout).reserve("prompt", "FILTER-A", 1)
                answered_in = time.monotonic() - start
                assert reservation.status == "active" and answered_in < 1.0, answered_in
            for key, _ in selector.select(timeout=0.02):
                reader = key.fileobj
                assert isinstance(reader, socket.socket)
                try:
                    chunk = reader.recv(4096)
                except (BlockingIOError, InterruptedError):
                    continue
                except ConnectionResetError:
                    chunk = b""
                received[reader] += chunk
                if not chunk:
                    closed[reader] = time.monotonic()
                    selector.unregister(reader)
        assert answered_in is not None, "the slow clients were closed before the normal client was tried"
        assert len(closed) == clients, f"{clients - len(closed)} of {clients} slow clients still open"
        lifetimes = sorted(closed[sock] - opened[sock] for sock in opened)
        assert head_timeout - 0.5 <= lifetimes[0] and lifetimes[-1] <= head_timeout + slack, lifetimes[::30]
        assert all(data.startswith(b"HTTP/1.1 408 ") and b'"RequestTimeout"' in data for data in received.values())
        _wait_until(lambda: server.open_connections == 0, 5, "the service to drop the slow connections")
    finally:
        selector.close()
        for sock in opened:
            sock.close()


@pytest.mark.parametrize("stall", ["silent", "idle-after-a-request", "trickled-body"])
def test_a_stalled_connection_is_closed_when_its_timeout_passes(
    limited_service: Callable[[ServerLimits], tuple[ReservationServer, Any]], stall: str
) -> None:
    """No bytes at all (head timeout), nothing after an answered request (idle timeout), a body
    trickled a byte at a time (body timeout, a deadline for the whole body)."""
    limits = ServerLimits(head_timeout_s=1.0, idle_timeout_s=0.5, body_timeout_s=1.5, drain_timeout_s=0.2)
    service, _ = limited_service(limits)
    expected = {"silent": 1.0, "idle-after-a-request": 0.5, "trickled-body": 1.5}[stall]
    with socket.create_connection(_address(service), timeout=5) as sock:
        stream = _Stream(sock)
        if stall == "idle-after-a-request":
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            assert stream.answer().status == 200
        start = time.monotonic()
        if stall == "trickled-body":
            sock.sendall(_request(None, content_length=str(len(VALID)).encode()))
            for byte in VALID:
                sock.sendall(bytes([byte]))
                if _readable(sock, 0.1):
                    break
            answer = stream.answer()
            assert (answer.status, answer.body.get("error")) == (408, "RequestTimeout") and answer.closes
        assert stream.at_eof()
        assert expected - 0.2 <= time.monotonic() - start <= expected + 1.5


def _readable(sock: socket.socket, timeout: float) -> bool:
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        return bool(selector.select(timeout))


def test_connections_over_the_cap_get_503_until_one_closes(
    limited_service: Callable[[ServerLimits], tuple[ReservationServer, Any]],
) -> None:
    cap = 8
    service, server = limited_service(ServerLimits(max_connections=cap, head_timeout_s=30.0, drain_timeout_s=0.2))
    holders = [socket.create_connection(_address(service), timeout=5) for _ in range(cap)]
    try:
        for sock in holders:
            sock.sendall(b"GET /health HTTP/1.1\r\n")
        _wait_until(lambda: server.open_connections == cap, 5, f"{cap} open connections")
        (over,) = _exchange(service, b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        assert (over.status, over.body.get("error")) == (503, "ServiceUnavailable") and over.closes
        holders.pop().close()
        _wait_until(lambda: server.open_connections < cap, 5, "a connection to close")
        assert ReservationClient(service.url).reserve("after-cap", "FILTER-A", 1).status == "active"
    finally:
        for sock in holders:
            sock.close()


def test_the_command_line_serves_with_its_limits(tmp_path: Path) -> None:
    """``python -m workers.stack.reservation`` as ``cairn dev up`` and the drills start it, plus the limit flags."""
    port = free_port()
    command = [sys.executable, "-m", "workers.stack.reservation", "--port", str(port), "--db", str(tmp_path / "r.db")]
    command += ["--capacity", "FILTER-A=2", "--max-connections", "4", "--head-timeout", "1", "--idle-timeout", "1"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as process:
        try:
            wait_for_http(f"http://127.0.0.1:{port}/health", 30, lambda: process.poll() is None)
            client = ReservationClient(f"http://127.0.0.1:{port}")
            assert client.reserve("cli", "FILTER-A", 2).status == "active"
            assert client.usage("FILTER-A")["available"] == 0
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"GET /health HTTP/1.1\r\n")
                assert _Stream(sock).answer().status == 408  # cut off after --head-timeout 1
        finally:
            process.terminate()
            process.wait(timeout=10)
