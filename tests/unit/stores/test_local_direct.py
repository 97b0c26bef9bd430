"""``LocalStore.read_into`` reads a large range of a file whose pages are not cached straight
into the destination (``O_DIRECT``, where the destination's address and the file offset agree
modulo a page), its unaligned ends and every other read through the page cache — and every
way gives the same bytes: aligned or not, cached or not, a file system that refuses direct
reads, a file shorter than asked."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from cairn import errors as E
from cairn.checkpoint.placement import placed
from cairn.stores import LocalStore
from cairn.stores import local as local_module

KEY = "run/training/000000000001/shard.bin"
SIZE = (4 << 20) + 123  # not a whole number of pages


@pytest.fixture
def store(tmp_path: Path) -> tuple[LocalStore, bytes]:
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    store = LocalStore(tmp_path / "store")
    store.write_object(KEY, [data], size=len(data))
    return store, data


def _evict(store: LocalStore) -> None:
    fd = os.open(store.root / KEY, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.fixture
def direct_calls(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Each direct read's outcome (False: the file system refused it)."""
    calls: list[bool] = []
    real = local_module._direct_read

    def spy(fd: int, path: Path, key: str, view: memoryview, offset: int, start: int, end: int) -> bool:
        calls.append(real(fd, path, key, view, offset, start, end))
        return calls[-1]

    monkeypatch.setattr(local_module, "_direct_read", spy)
    return calls


@pytest.mark.skipif(not local_module._DIRECT_IO, reason="direct reads are Linux-only")
@pytest.mark.parametrize("offset", [0, 4096, 12345], ids=["at-0", "page-aligned", "unaligned"])
@pytest.mark.parametrize("aligned", [True, False], ids=["placed", "misplaced"])
def test_every_read_gives_the_files_bytes(
    store: tuple[LocalStore, bytes], direct_calls: list[bool], offset: int, aligned: bool
) -> None:
    local, data = store
    n = SIZE - offset - 7
    out = placed(n, offset) if aligned else np.empty(n + 1, dtype=np.uint8)[1:]
    _evict(local)
    local.read_into(KEY, offset, memoryview(out))
    assert out.tobytes() == data[offset : offset + n]
    # Placed memory agrees with the file modulo a page: the middle goes around the cache.
    assert direct_calls == ([True] if aligned else []), direct_calls
    local.read_into(KEY, offset, memoryview(out))  # again, some pages cached now: the same bytes
    assert out.tobytes() == data[offset : offset + n]


@pytest.mark.skipif(not local_module._DIRECT_IO, reason="direct reads are Linux-only")
def test_a_file_system_that_refuses_direct_reads_is_read_through_the_cache(
    store: tuple[LocalStore, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    local, data = store
    real_fcntl = local_module.fcntl.fcntl

    def refuse(fd: int, cmd: int, arg: int = 0) -> int:
        if cmd == local_module.fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_fcntl(fd, cmd, arg)

    monkeypatch.setattr(local_module.fcntl, "fcntl", refuse)
    out = placed(SIZE, 0)
    _evict(local)
    local.read_into(KEY, 0, memoryview(out))
    assert out.tobytes() == data


def test_a_file_shorter_than_asked_is_a_typed_error(store: tuple[LocalStore, bytes]) -> None:
    local, data = store
    out = placed(SIZE, 0)
    os.truncate(local.root / KEY, SIZE - 5000)
    _evict(local)
    with pytest.raises(E.StorageError, match="short object"):
        local.read_into(KEY, 0, memoryview(out))
