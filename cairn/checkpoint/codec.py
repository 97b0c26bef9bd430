"""Lossless per-entry compression of checkpoint bytes: the frame format and its checks.

An encoded entry's logical bytes (a tensor, or a block of the blocked layout) are cut into
frames of ``FRAME_BYTES`` (the last may be shorter; a multiple of every dtype's width), and
each frame is stored as one Blosc2 chunk: a byte-plane shuffle by the dtype's width (the
exponent bytes of trained floats repeat; their mantissa bytes do not) and zstd level 1, each
byte plane its own stream. The manifest records, per entry, the codec, the frame size and
each frame's stored size and BLAKE3 (``cairn.checkpoint.manifest.Encoding``); the entry's
``checksum`` stays the BLAKE3 of its logical bytes, so the fingerprint does not depend on the
codec and a restore checks both: the stored bytes before they are decoded (a corrupt frame is
refused, never decompressed), the logical bytes after (a frame that decodes to other bytes is
refused).

Decoding is bounded: a frame decodes only into a destination of exactly its declared logical
size, and only after its own header agrees with that size and its stored length, so no frame
can inflate past what the manifest declared. Nothing here unpickles. Blosc2 runs with the
interpreter lock released (``blosc2.set_releasegil``), so frames encode and decode while other
threads work.
"""

from __future__ import annotations

import functools
from types import ModuleType
from typing import Any, Literal, cast

from blake3 import blake3

from cairn.checkpoint.manifest import Encoding, Frame, TensorEntry
from cairn.checkpoint.tensors import CHECKSUM_PREFIX
from cairn.errors import IntegrityError, SizeLimitError, TensorSpecError

__all__ = [
    "CODEC",
    "FRAME_BYTES",
    "MAX_FRAME_BYTES",
    "FRAME_OVERHEAD",
    "MIN_FRAME_BYTES",
    "FRAME_RECORD_BYTES",
    "warm_up",
    "FrameSpan",
    "frame_spans",
    "check_encoding",
    "encode_frame",
    "decode_frame",
    "stored_checksum",
]

CODEC: Literal["blosc2-zstd"] = "blosc2-zstd"
FRAME_BYTES = 1 << 20
"""Logical bytes per frame written: a multiple of 16 (every dtype's width divides it)."""
MAX_FRAME_BYTES = 64 << 20
"""The largest frame a manifest may declare: what one decode may allocate or write at once."""
MIN_FRAME_BYTES = 64 << 10
"""The smallest frame size a manifest may declare: bounds the frames per byte of state (their
records in a manifest, and the calls a restore makes)."""
FRAME_RECORD_BYTES = 128
"""The most one frame's record adds to a manifest or rank index (its size and checksum, in JSON)."""
FRAME_OVERHEAD = 32
"""The most a Blosc2 chunk adds to its bytes (``blosc2.MAX_OVERHEAD``: an incompressible frame
is stored as a copy behind its header), so a frame's stored size is at most its logical + this."""
_MIN_HEADER = 16
"""Bytes of a Blosc2 chunk header that declare its sizes."""


@functools.cache
def _blosc2() -> ModuleType:
    import blosc2  # imported on first use: a restore of raw checkpoints never loads it

    # The binding holds the interpreter lock through a compress or decode unless told otherwise
    # (a process-wide setting, False by default). Released, a save's encoding thread runs beside
    # its writer and hashing threads, and a restore's decodes beside its reads; the cost the
    # binding warns of is per call, negligible on 1 MiB frames.
    blosc2.set_releasegil(True)
    return cast(ModuleType, blosc2)


FrameSpan = tuple[int, int, int, int]
"""(logical start, logical end, stored start, stored end) of one frame, relative to the entry."""


def frame_spans(entry: TensorEntry) -> list[FrameSpan]:
    """Where each frame of an encoded entry lies, logically and in its shard (from its offset)."""
    assert entry.encoding is not None
    spans: list[FrameSpan] = []
    stored = 0
    size = entry.encoding.frame_bytes
    for k, frame in enumerate(entry.encoding.frames):
        start = k * size
        spans.append((start, min(entry.length, start + size), stored, stored + frame.bytes))
        stored += frame.bytes
    return spans


def check_encoding(where: str, entry: TensorEntry, itemsize: int) -> None:
    """Refuse, from the manifest alone, an encoding that is not one this build writes and reads
    back within bounds: frames of whole elements, at most ``MAX_FRAME_BYTES``, exactly as many
    as the logical bytes need, none stored larger than its logical bytes + ``FRAME_OVERHEAD``."""
    enc = entry.encoding
    if enc is None:
        return
    if not MIN_FRAME_BYTES <= enc.frame_bytes <= MAX_FRAME_BYTES:
        raise SizeLimitError(
            field=f"{where}.encoding.frame_bytes",
            expected=f"{MIN_FRAME_BYTES}..{MAX_FRAME_BYTES}",
            found=enc.frame_bytes,
        )
    if enc.frame_bytes % itemsize:
        raise TensorSpecError(
            "frames must hold whole elements",
            field=f"{where}.encoding.frame_bytes",
            expected=f"a multiple of {itemsize}",
            found=enc.frame_bytes,
        )
    count = -(-entry.length // enc.frame_bytes)
    if len(enc.frames) != count:
        raise TensorSpecError(
            "frames do not cover the logical bytes",
            field=f"{where}.encoding.frames",
            expected=f"{count} frames",
            found=len(enc.frames),
        )
    for k, frame in enumerate(enc.frames):
        logical = min(enc.frame_bytes, entry.length - k * enc.frame_bytes)
        if not _MIN_HEADER <= frame.bytes <= logical + FRAME_OVERHEAD:
            raise SizeLimitError(
                "a stored frame's size is outside what its logical bytes can encode to",
                field=f"{where}.encoding.frames[{k}].bytes",
                expected=f"{_MIN_HEADER}..{logical + FRAME_OVERHEAD}",
                found=frame.bytes,
            )


def warm_up() -> None:
    """Load the codec (its import and first call cost a few hundred milliseconds), so that what
    is timed afterwards is the codec's throughput."""
    encode_frame(memoryview(bytes(4096)), 4)


def stored_checksum(data: Any) -> str:
    """BLAKE3 of a frame's stored bytes."""
    return CHECKSUM_PREFIX + blake3(data).hexdigest()


def encode_frame(data: memoryview, itemsize: int) -> tuple[bytes, Frame]:
    """One frame's stored bytes and its manifest record (``data``: whole elements of ``itemsize``)."""
    b2 = _blosc2()
    params = b2.CParams(
        codec=b2.Codec.ZSTD,
        clevel=1,
        typesize=itemsize,
        nthreads=1,  # a thread pool per call costs more than it gains on a 1 MiB frame
        filters=[b2.Filter.SHUFFLE],
        splitmode=b2.SplitMode.ALWAYS_SPLIT,
    )
    stored: bytes = b2.compress2(data, cparams=params)
    return stored, Frame(bytes=len(stored), checksum=stored_checksum(stored))


def new_encoding(frames: list[Frame]) -> Encoding:
    return Encoding(codec=CODEC, frame_bytes=FRAME_BYTES, frames=frames)


def decode_frame(stored: memoryview, out: memoryview, frame: Frame, where: str) -> None:
    """Check one stored frame against its checksum, then its header against its declared sizes,
    then decode it into ``out`` (exactly its logical bytes). Typed refusals, nothing partial
    accepted: the caller's logical checksum still covers ``out``."""
    found = stored_checksum(stored)
    if found != frame.checksum:
        raise IntegrityError(
            "stored frame bytes do not match their checksum",
            field=f"{where}.checksum",
            expected=frame.checksum,
            found=found,
        )
    b2 = _blosc2()
    try:
        nbytes, cbytes, _ = b2.get_cbuffer_sizes(stored)
    except Exception as exc:  # noqa: BLE001 - any failure to read the header is the frame's
        raise IntegrityError(f"stored frame has no readable header: {exc}", field=where) from None
    # This check is what bounds the decode: the binding writes as many bytes as the header
    # declares, whatever the destination's size (a larger claim would write past it).
    if nbytes != len(out) or cbytes != len(stored):
        raise IntegrityError(
            "stored frame's header disagrees with the manifest",
            field=where,
            expected=f"{len(out)} logical / {len(stored)} stored bytes",
            found=f"{nbytes} / {cbytes}",
        )
    try:
        got = b2.decompress2(stored, dst=out, dparams=b2.DParams(nthreads=1))
    except Exception as exc:  # noqa: BLE001 - a frame that fails to decode is refused, typed
        raise IntegrityError(f"stored frame does not decode: {exc}", field=where) from None
    if got is not None and got != len(out):
        raise IntegrityError("stored frame decoded to another size", field=where, expected=len(out), found=got)
