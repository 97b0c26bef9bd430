"""Stores: where checkpoint bytes live. ``open_store(url)`` picks one by URL.

- a path or ``file://`` URL: ``LocalStore`` (the embedded default)
- ``s3://bucket/prefix``: ``S3Store`` (any S3-compatible server)
- ``memory://name``: ``MemoryStore`` (tests)

Modules: ``base`` (the storage interface), ``local`` (local disk), ``s3`` (S3-compatible
servers), ``s3_client`` (its boto3 client and what it signs), ``s3_retry`` (its retries and
in-flight bound), ``s3_stream`` (many spans of an object
with one ranged GET), ``memory`` (the in-memory test double),
``numbered`` (the create-if-absent numbered log), ``objects`` (small JSON objects read under
their bound), ``identity`` (the store's identity).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cairn.stores.base import Chunk, ObjectInfo, Store
from cairn.stores.identity import store_identity
from cairn.stores.local import LocalStore
from cairn.stores.memory import MemoryStore

if TYPE_CHECKING:
    from cairn.stores.s3 import S3Store

__all__ = ["Chunk", "LocalStore", "MemoryStore", "ObjectInfo", "S3Store", "Store", "open_store", "store_identity"]


def __getattr__(name: str) -> Any:
    """``S3Store`` on first use: boto3 is imported only by those who use S3."""
    if name == "S3Store":
        from cairn.stores.s3 import S3Store

        return S3Store
    raise AttributeError(f"module 'cairn.stores' has no attribute {name!r}")


_MEMORY: dict[str, MemoryStore] = {}


def open_store(url: str, **options: Any) -> Store:
    """Open the store named by ``url``; ``options`` go to the store's constructor."""
    if url.startswith("s3://"):
        from cairn.stores.s3 import S3Store

        return S3Store.from_url(url, **options)
    if url.startswith("memory://"):
        return _MEMORY.setdefault(url, MemoryStore(url.removeprefix("memory://")))
    if url.startswith("file://"):
        url = url.removeprefix("file://")
    return LocalStore(url)
