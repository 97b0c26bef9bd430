"""The reservation service's refusals: an HTTP status, an error code and a one-line message."""

from __future__ import annotations

from http import HTTPStatus

__all__ = ["ServiceError", "UnreadableBody"]


class ServiceError(Exception):
    """A refusal: answered as ``{"error": code, "message": message}`` with ``status``."""

    def __init__(self, status: HTTPStatus, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


class UnreadableBody(ServiceError):
    """The body could not be read as framed: the rest of the stream is not a request, so the
    answer closes the connection."""
