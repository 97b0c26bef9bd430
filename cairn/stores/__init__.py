"""Stores: where checkpoint bytes live. ``open_store(url)`` picks one by URL.

- a path or ``file://`` URL: ``LocalStore`` (the embedded default)
- ``s3://bucket/prefix``: ``S3Store`` (any S3-compatible server)
- ``memory://name``: ``MemoryStore`` (tests)
"""

from __future__ import annotations

from typing import Any

from cairn.stores.base import ObjectInfo, Store
from cairn.stores.local import LocalStore
from cairn.stores.memory import MemoryStore

__all__ = ["Store", "ObjectInfo", "LocalStore", "MemoryStore", "open_store"]

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
