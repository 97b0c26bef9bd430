"""How much the reservation service's HTTP side accepts and how long it waits for a client."""

from __future__ import annotations

from dataclasses import dataclass, fields

__all__ = ["ServerLimits"]


@dataclass(frozen=True)
class ServerLimits:
    """Limits on connections, request heads and slow clients; a body's bound is ``MAX_BODY_BYTES``.

    Each timeout is a deadline for the whole phase, not for each read, so a client that trickles
    bytes is cut off on time: the head (request line and headers) must arrive within
    ``head_timeout_s`` of the connection opening or of its first byte on a reused connection, the
    body within ``body_timeout_s`` of the head (an answer is written under the same deadline), and
    a kept-alive connection may wait ``idle_timeout_s`` for its next request.
    """

    max_connections: int = 1024
    """Open connections served at once; one more is answered ``503`` and closed."""
    max_header_bytes: int = 64 << 10
    """The request line and headers together; more is ``431``."""
    head_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    idle_timeout_s: float = 5.0
    drain_bytes: int = 8 << 20
    drain_timeout_s: float = 2.0
    """After a refusal that leaves part of the request unread, up to this much of what the client is
    still sending is read and dropped before closing, so the client reads the status, not a reset."""

    def __post_init__(self) -> None:
        for field in fields(self):
            if not getattr(self, field.name) > 0:
                raise ValueError(f"ServerLimits.{field.name} must be positive, got {getattr(self, field.name)!r}")
