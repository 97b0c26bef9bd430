"""Small JSON objects read from a store under bounds: the one way Cairn reads a latest pointer,
a pin, an owner claim, the store's identity, a registry entry or a lifecycle event.

The object is refused above ``max_bytes`` by its size before a byte is read (``Store.read``),
then parsed by ``cairn.jsonio.parse_json`` under the same bound (depth scanned before parsing,
no NaN/Infinity, bounded integers and strings). Every refusal is one typed one-line ``error``
naming the object (``InvalidObjectError`` unless the caller says otherwise); a missing object is
``ObjectNotFoundError`` and a store that cannot answer is ``StorageError``, as from any read.
"""

from __future__ import annotations

from typing import Any

from cairn.errors import CairnError, InvalidObjectError, SizeLimitError
from cairn.jsonio import JsonLimits, parse_json
from cairn.stores.base import Store

__all__ = ["read_json_object", "read_record", "RECORD_DEPTH", "MAX_POINTER_BYTES", "MAX_RECORD_BYTES"]

RECORD_DEPTH = 8
"""Nesting of every record Cairn writes is at most 3; anything deeper is not one of them."""
MAX_POINTER_BYTES = 4 << 10
"""``latest.json`` and ``.cairn/store-id.json``: a step or an id and a few words (~100 bytes)."""
MAX_RECORD_BYTES = 64 << 10
"""An owner claim, a lifecycle event, a registry entry, a tier's record: a few short fields."""


def read_json_object(
    store: Store,
    key: str,
    *,
    max_bytes: int,
    what: str,
    error: type[CairnError] = InvalidObjectError,
    max_depth: int = RECORD_DEPTH,
) -> dict[str, Any]:
    """The JSON object stored under ``key``: at most ``max_bytes`` bytes and ``max_depth`` levels."""
    where = f"{store.url}/{key}"
    try:
        raw = store.read(key, max_bytes)
    except SizeLimitError as exc:
        raise error(f"{what} too large", field=where, expected=exc.expected, found=exc.found) from None
    limits = JsonLimits(max_bytes=max_bytes, max_depth=max_depth, max_string_chars=max_bytes)
    data = parse_json(raw, where=f"{where} ({what})", error=error, limits=limits)
    if not isinstance(data, dict):
        raise error(f"{what} is not a JSON object", field=where, expected="an object", found=type(data).__name__)
    return data


def read_record(store: Store, key: str, *, what: str, error: type[CairnError] = InvalidObjectError) -> dict[str, Any]:
    """A record Cairn keeps in a store (an owner claim, a lifecycle event, ...): a JSON object of
    at most ``MAX_RECORD_BYTES``."""
    return read_json_object(store, key, max_bytes=MAX_RECORD_BYTES, what=what, error=error)
