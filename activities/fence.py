"""A superseded attempt writes nothing: the fence between a training segment's attempt and the run's store.

An attempt is superseded once the server has given its segment to another attempt: its worker
stalled past the heartbeat timeout (a frozen process, a paused VM, a swap storm), or the server
answered its heartbeat that the attempt is gone. Such a "zombie" resumes where it stopped when
its process thaws; ``FencedStore`` refuses its writes from then on (``AttemptSuperseded``), so
it neither commits a checkpoint nor leaves shards beside the current attempt's. Reads pass.

The fence is checked before each write, so a write already under way when the process froze
still lands; create-if-absent commits and deterministic training make that one identical to
what the current attempt commits at the same step.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from cairn.stores import Chunk, ObjectInfo, Store

__all__ = ["AttemptSuperseded", "FencedStore", "SUPERSEDED"]

SUPERSEDED = "AttemptSuperseded"
"""Error type of an attempt that stopped because it had been superseded (nothing committed)."""


class AttemptSuperseded(Exception):
    """This attempt is no longer its segment's current one: it must not write to the store."""


class FencedStore(Store):
    """``inner``, whose writes (``write_object``, ``put_if_absent``) first ask ``superseded``
    (None while the attempt is current, else why not) and are refused once it answers."""

    def __init__(self, inner: Store, superseded: Callable[[], str | None]) -> None:
        self.inner = inner
        self.superseded = superseded
        self.read_piece_bytes = inner.read_piece_bytes

    def _check(self, key: str) -> None:
        why = self.superseded()
        if why is not None:
            raise AttemptSuperseded(f"{why}: not writing {key}")

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        self._check(key)
        self.inner.write_object(key, chunks, size)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        self._check(key)
        return self.inner.put_if_absent(key, data)

    def save_target(self, run_id: str, nbytes: int) -> Store:
        target = self.inner.save_target(run_id, nbytes)
        return self if target is self.inner else FencedStore(target, self.superseded)

    # -- everything else is the inner store's -----------------------------------------------------
    def read(self, key: str, *args: Any, **kwargs: Any) -> bytes:
        return self.inner.read(key, *args, **kwargs)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        self.inner.read_into(key, offset, out)

    def size(self, key: str) -> int:
        return self.inner.size(key)

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        return self.inner.list(prefix, start_after)

    def delete(self, keys: Iterable[str]) -> None:
        self.inner.delete(keys)

    def stale_uploads(self, prefix: str, older_than_seconds: float, now: float | None = None) -> builtins.list[str]:
        return self.inner.stale_uploads(prefix, older_than_seconds, now)

    def abort_stale_uploads(
        self, prefix: str, older_than_seconds: float, now: float | None = None
    ) -> builtins.list[str]:
        return self.inner.abort_stale_uploads(prefix, older_than_seconds, now)

    def root_exists(self) -> bool:
        return self.inner.root_exists()

    def exists(self, key: str) -> bool:
        return self.inner.exists(key)

    def close(self) -> None:
        self.inner.close()

    def __getattr__(self, name: str) -> Any:  # url, and what a store adds (bucket, endpoint, ...)
        if name in ("inner", "superseded"):
            raise AttributeError(name)
        return getattr(self.inner, name)
