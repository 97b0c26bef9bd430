"""Many consecutive spans of an S3 object with one ranged GET (``S3Store.read_spans``).

A compressed restore reads a run of frames this way: one request for the run, its body read a
little at a time into one frame's buffer, each frame decoded before the next is read. A
response that is not exactly the range asked for is not used, and a body that breaks off midway
is not read on: the spans left are read with ranged reads of their own (and their retries).
While its body streams, the GET holds a slot of the store's in-flight bound, as any request does.
A plain ranged read (``S3Store.read_into``) fills its buffer the same few reads at a time
(``fill_exactly``), so no part is held twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Generator, Sequence
from typing import Any, Protocol

from cairn.stores.base import span_buffer
from cairn.stores.s3_retry import InflightLimit, classify

__all__ = ["STREAM_READ_BYTES", "SpanSource", "fill_exactly", "stream_spans"]

STREAM_READ_BYTES = 256 << 10
"""How much of a streamed body one read takes (``S3Store.read_spans``): a span is filled a few
such reads at a time, so a reader holds its span's buffer and little more."""


def _read_up_to(body: Any, view: memoryview) -> int:
    """Read a body into ``view``, ``STREAM_READ_BYTES`` at a time, until it is full or the body
    ends; returns the bytes read."""
    at = 0
    while at < len(view):
        data = body.read(min(STREAM_READ_BYTES, len(view) - at))
        if not data:
            break
        view[at : at + len(data)] = data
        at += len(data)
    return at


def _fill_from(body: Any, view: memoryview) -> bool:
    """Fill ``view`` from a response body; False if the stream broke off or ended first."""
    try:
        return _read_up_to(body, view) == len(view)
    except Exception as exc:
        if classify(exc) is None and not isinstance(exc, OSError):
            raise  # not a broken stream (the retry policy's judgement): said as it is
        return False  # the caller reads what is left range by range


def fill_exactly(body: Any, view: memoryview) -> int:
    """Read a ranged GET's body into ``view`` a few pieces at a time (never the whole range as
    one more object); returns how many bytes the body held, counting at most one past ``view``
    (a server that ignored the range is found by that byte, not read to its end)."""
    at = _read_up_to(body, view)
    return at + len(body.read(1)) if at == len(view) else at


class SpanSource(Protocol):
    """What ``stream_spans`` needs of the store (``S3Store``)."""

    inflight: InflightLimit

    def open_range(self, key: str, offset: int, length: int) -> Any:
        """The body of a ranged GET of exactly ``length`` bytes, or None (the range was ignored)."""

    def read_into(self, key: str, offset: int, out: memoryview) -> None: ...


def stream_spans(
    store: SpanSource, key: str, offset: int, sizes: Sequence[int], buffer: memoryview
) -> Generator[memoryview, None, None]:
    """``Store.read_spans`` for S3: the spans with one ranged GET (see the module)."""
    view_of = span_buffer(sizes, buffer)
    total = sum(sizes)
    body = store.open_range(key, offset, total) if total else None
    streaming = contextlib.ExitStack()  # the in-flight slot the body's transfer holds
    if body is not None:
        streaming.enter_context(store.inflight.slot())
    at = offset
    try:
        for size in sizes:
            view = view_of[:size]
            if body is not None and not _fill_from(body, view):
                body.close()
                body = None
                streaming.close()  # before the ranged reads take slots of their own
            if body is None:
                store.read_into(key, at, view)
            at += size
            yield view
    finally:
        if body is not None:
            body.close()
        streaming.close()
