"""The model registry: publishing a checkpoint reference by conditional write.

An entry is ``.cairn/registry/{run_id}/{sha256(key)[:24]}.json`` in a store (under the store's
reserved prefix, so no run id can collide with it: ``cairn.checkpoint.layout``); its name derives from the
publish effect's idempotency key, and it is created with create-if-absent. A retried publish
finds its own entry and returns it; the same key with a different body is refused.
"""

from __future__ import annotations

import hashlib

from pydantic import BaseModel, ConfigDict, ValidationError

from cairn.checkpoint.layout import registry_entry_key, registry_prefix
from cairn.errors import IdempotencyConflictError, InvalidObjectError
from cairn.stores.base import Store
from cairn.stores.objects import read_record

__all__ = ["PublishedModel", "publish_model", "published_entries"]


class PublishedModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    run_id: str
    checkpoint: str
    fingerprint: str
    key: str


def _entry_key(run_id: str, key: str) -> str:
    return registry_entry_key(run_id, hashlib.sha256(key.encode()).hexdigest()[:24])


def publish_model(store: Store, entry: PublishedModel) -> tuple[str, bool]:
    """Write the entry once; returns (registry key, created)."""
    path = _entry_key(entry.run_id, entry.key)
    body = entry.model_dump_json().encode()
    if store.put_if_absent(path, body):
        return path, True
    existing = _read_entry(store, path)
    if existing != entry:
        raise IdempotencyConflictError(
            "publish key already used for another checkpoint",
            field="registry",
            expected=existing.checkpoint,
            found=entry.checkpoint,
        )
    return path, False


def published_entries(store: Store, run_id: str) -> list[PublishedModel]:
    out = []
    for info in store.list(registry_prefix(run_id)):
        out.append(_read_entry(store, info.key))
    return out


def _read_entry(store: Store, key: str) -> PublishedModel:
    """A registry entry, read bounded; one that is not an entry Cairn writes is ``InvalidObjectError``."""
    body = read_record(store, key, what="registry entry")
    try:
        return PublishedModel.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "entry"
        raise InvalidObjectError(f"{store.url}/{key}: not a registry entry ({where}: {first['msg']})") from None
