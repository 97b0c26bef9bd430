"""A store's identity: a small object (``STORE_ID_KEY``) written on first use by
create-if-absent, so that a run can tell the store it started on from any other (another
host's empty local directory has none, or another one)."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime

from cairn.errors import ObjectNotFoundError, StoreIdentityError
from cairn.stores.base import Store
from cairn.stores.objects import MAX_POINTER_BYTES, read_json_object

__all__ = ["RESERVED_PREFIX", "STORE_ID_KEY", "store_identity"]

RESERVED_PREFIX = ".cairn/"
"""What Cairn keeps for itself in a store, beside the runs (a run id never starts with a dot)."""
STORE_ID_KEY = f"{RESERVED_PREFIX}store-id.json"


def store_identity(store: Store, *, create: bool) -> str | None:
    """The store's identity; with ``create``, written on first use (create-if-absent)."""
    try:
        return _read_identity(store)
    except ObjectNotFoundError:
        if not create:
            return None
    body = {"store_id": uuid.uuid4().hex, "created_at": datetime.now(UTC).isoformat(timespec="seconds")}
    store.put_if_absent(STORE_ID_KEY, json.dumps(body).encode())
    return _read_identity(store)  # whoever won the race


def _read_identity(store: Store) -> str:
    """The store's identity record, read bounded (``MAX_POINTER_BYTES``) and checked."""
    body = read_json_object(
        store, STORE_ID_KEY, max_bytes=MAX_POINTER_BYTES, what="store identity", error=StoreIdentityError
    )
    value = body.get("store_id")
    if not isinstance(value, str) or not re.fullmatch(r"[0-9a-f]{32}", value):
        raise StoreIdentityError(field=f"{store.url}/{STORE_ID_KEY}", expected="32 hex digits", found=value)
    return value
