"""The reservation service's refusals: an HTTP status, an error code and a one-line message, and
the one JSON shape every refusal is answered in."""

from __future__ import annotations

from http import HTTPStatus

__all__ = ["ServiceError", "UnreadableRequest", "error_body", "MAX_MESSAGE_CHARS"]

MAX_MESSAGE_CHARS = 500


def error_body(code: str, message: str) -> dict[str, str]:
    """``{"error": code, "message": message}`` with the message on one line of at most ``MAX_MESSAGE_CHARS``."""
    line = " ".join(message.split())
    if len(line) > MAX_MESSAGE_CHARS:
        line = line[: MAX_MESSAGE_CHARS - 3] + "..."
    return {"error": code, "message": line}


class ServiceError(Exception):
    """A refusal: answered as ``{"error": code, "message": message}`` with ``status``."""

    def __init__(self, status: HTTPStatus, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code

    def body(self) -> dict[str, str]:
        return error_body(self.code, str(self))


class UnreadableRequest(ServiceError):
    """The request could not be read as framed (its head, length or coding; a stalled client): the rest
    of the stream is not a request, so the answer closes the connection."""
