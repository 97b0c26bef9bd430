"""Local-disk store: temp names, fsync, atomic rename, fsync of the directory.

The embedded default. ``put_if_absent`` uses link(2), which fails when the target exists:
the same create-if-absent guarantee S3 gives with ``If-None-Match: *``.

Objects are regular files that this store wrote; it never follows a symlink below its root.
Every directory on a key's path is opened relative to its parent with ``O_NOFOLLOW``; an object
is lstat'ed, opened with ``O_NOFOLLOW | O_NONBLOCK`` and checked again with fstat: a symlink (to
``/dev/zero``, out of the store, or even to another object), a FIFO, a device or a directory
where an object should be is an ``InvalidObjectError`` at once, never a hang or an endless
read. ``list`` shows regular files only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import stat
import uuid
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

from cairn.errors import (
    CairnError,
    ConfigError,
    InvalidObjectError,
    ObjectNotFoundError,
    StorageError,
    StoreNotFoundError,
)
from cairn.stores.base import Chunk, ObjectInfo, Store, split_key, too_large

__all__ = ["LocalStore"]

TMP_MARK = ".tmp-"

_READ_CHUNK = 1 << 20
_PAGE = 4096
_DIRECT_MIN = 1 << 20
"""The least a read skips the page cache for (``LocalStore.read_into``)."""
_DIRECT_IO = all(hasattr(os, name) for name in ("O_DIRECT", "RWF_NOWAIT", "posix_fadvise"))
"""Whether this system has direct reads (Linux)."""
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


def _kind(mode: int) -> str:
    kinds = [
        (stat.S_ISREG, "a regular file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symlink"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ]
    return next((name for test, name in kinds if test(mode)), f"file type {stat.S_IFMT(mode):o}")


def _not_regular(path: Path, mode: int) -> InvalidObjectError:
    return InvalidObjectError(str(path), expected="a regular file written by the store", found=_kind(mode))


def _os_error(exc: OSError, doing: str, path: Path) -> CairnError:
    """The Cairn error for ``exc``: what the store holds at ``path`` is wrong (same verdict on
    every retry) or the disk failed (retryable)."""
    if exc.errno == errno.ELOOP:
        return InvalidObjectError(str(path), expected="a regular file written by the store", found="a symlink")
    if exc.errno in (errno.EISDIR, errno.ENOTDIR):
        return InvalidObjectError(f"cannot {doing} {path}: {exc.strerror}")
    unusable = {errno.EACCES, errno.EPERM, errno.EROFS}
    if doing in ("write", "commit"):
        unusable.add(errno.ENOENT)  # a directory that cannot be created (e.g. under /proc)
    if exc.errno in unusable:  # the same answer on every retry: fail fast, say what to fix
        return StoreNotFoundError(
            f"cannot {doing} {path}: {exc.strerror} (the store cannot be used: check the path and its permissions)"
        )
    return StorageError(f"cannot {doing} {path}: {exc.strerror or exc}")


class LocalStore(Store):
    """Objects are regular files under ``root``; keys are relative paths."""

    def __init__(self, root: str | Path) -> None:
        expected = "a directory path or s3://bucket/prefix"
        if not str(root).strip():
            raise ConfigError("store", expected=expected, found=repr(str(root)))
        try:
            self.root = Path(root).expanduser().resolve()
            is_dir = stat.S_ISDIR(os.stat(self.root).st_mode)
        except FileNotFoundError:
            is_dir = True  # created by the first write
        except (OSError, ValueError, RuntimeError) as exc:  # NUL in the path, a symlink loop
            raise ConfigError("store", expected=expected, found=f"{str(root)!r} ({exc})") from exc
        if not is_dir:
            raise ConfigError("store", expected=expected, found=f"{str(self.root)!r}, which is not a directory")
        self.url = str(self.root)

    def _open_dir(self, parts: Sequence[str], *, create: bool = False) -> int:
        """A descriptor of the directory ``root/parts``, reached without following a symlink;
        missing directories are created (and made durable) when ``create``."""
        if create:
            self.root.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, _DIR_FLAGS)
        try:
            for depth, part in enumerate(parts, start=1):
                if create:
                    try:
                        os.mkdir(part, dir_fd=fd)
                        os.fsync(fd)  # the new directory's entry survives a crash
                    except FileExistsError:
                        pass
                try:
                    sub = os.open(part, _DIR_FLAGS, dir_fd=fd)
                except NotADirectoryError as exc:  # a symlink (O_NOFOLLOW) or a non-directory
                    mode = os.stat(part, dir_fd=fd, follow_symlinks=False).st_mode
                    where = self.root.joinpath(*parts[:depth])
                    if create or stat.S_ISLNK(mode):
                        raise InvalidObjectError(str(where), expected="a directory", found=_kind(mode)) from exc
                    raise ObjectNotFoundError(f"no object under {where}: {_kind(mode)}") from exc
                os.close(fd)
                fd = sub
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _stat_object(self, key: str) -> tuple[int, str, os.stat_result, Path]:
        """The open directory holding ``key``, the object's name in it, its lstat and its path,
        once the object is known to be a regular file (nothing is opened or followed)."""
        parts = split_key(key)
        path = self.root.joinpath(*parts)
        try:
            dir_fd = self._open_dir(parts[:-1])
            try:
                st = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
            except BaseException:
                os.close(dir_fd)
                raise
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"no object {path}") from exc
        except OSError as exc:
            raise _os_error(exc, "stat", path) from exc
        if not stat.S_ISREG(st.st_mode):
            os.close(dir_fd)
            raise _not_regular(path, st.st_mode)
        return dir_fd, parts[-1], st, path

    def _open_object(self, key: str) -> tuple[int, Path]:
        """A read-only descriptor of ``key``, a regular file (checked again on the open file)."""
        dir_fd, name, _, path = self._stat_object(key)
        try:
            fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"no object {path}") from exc
        except OSError as exc:
            raise _os_error(exc, "open", path) from exc
        finally:
            os.close(dir_fd)
        try:
            mode = os.fstat(fd).st_mode
        except OSError as exc:
            os.close(fd)
            raise StorageError(f"cannot stat {path}: {exc.strerror or exc}") from exc
        if not stat.S_ISREG(mode):  # replaced between the lstat and the open
            os.close(fd)
            raise _not_regular(path, mode)
        return fd, path

    def _write_temp(self, dir_fd: int, name: str, chunks: Iterable[Chunk]) -> str:
        tmp = f".{name}{TMP_MARK}{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
        try:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            _unlink_quietly(tmp, dir_fd)
            raise
        os.close(fd)
        return tmp

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        parts = split_key(key)
        final = self.root.joinpath(*parts)
        try:
            dir_fd = self._open_dir(parts[:-1], create=True)
            try:
                tmp = self._write_temp(dir_fd, parts[-1], chunks)
                try:
                    os.replace(tmp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                except BaseException:
                    _unlink_quietly(tmp, dir_fd)
                    raise
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise _os_error(exc, "write", final) from exc

    def root_exists(self) -> bool:
        return self.root.is_dir()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        parts = split_key(key)
        final = self.root.joinpath(*parts)
        try:
            dir_fd = self._open_dir(parts[:-1], create=True)
            try:
                tmp = self._write_temp(dir_fd, parts[-1], [data])
                try:
                    os.link(tmp, parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                    created = True
                except FileExistsError:
                    created = False
                finally:
                    _unlink_quietly(tmp, dir_fd)
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise _os_error(exc, "commit", final) from exc
        return created

    def read(self, key: str, max_bytes: int) -> bytes:
        fd, path = self._open_object(key)
        try:
            size = os.fstat(fd).st_size
            if size > max_bytes:
                raise too_large(key, max_bytes, size)
            chunks, total = [], 0
            while total <= max_bytes:  # at most max_bytes + 1, whatever the file does meanwhile
                chunk = os.read(fd, min(_READ_CHUNK, max_bytes + 1 - total))
                if not chunk:
                    break
                chunks.append(chunk)
                total += len(chunk)
            if total > max_bytes:
                raise too_large(key, max_bytes, None)
            return b"".join(chunks)
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Fill ``out`` from ``key`` at ``offset``. A large read from a file whose pages are not
        cached goes around the page cache (``O_DIRECT``: the disk writes straight into ``out``,
        no copy, no cached pages to allocate) where ``out``'s address and ``offset`` agree
        modulo a page; its unaligned ends, and every other read, are plain reads."""
        view = out.cast("B") if out.format != "B" else out
        fd, path = self._open_object(key)
        try:
            start, end = _direct_span(view, offset)
            if end > start:  # no read-ahead: not for the probe, nor for the unaligned ends
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
            if end > start and not _cached(fd, view[start : start + _PAGE], offset + start):
                _read_span(fd, path, key, view, offset, 0, start)
                _read_span(fd, path, key, view, offset, end, len(view))
                if _direct_read(fd, path, key, view, offset, start, end):
                    return
                view, offset = view[start:end], offset + start  # the file system refused it
            _read_span(fd, path, key, view, offset, 0, len(view))
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    def size(self, key: str) -> int:
        dir_fd, _, st, _ = self._stat_object(key)
        os.close(dir_fd)
        return st.st_size

    def list(self, prefix: str = "", start_after: str | None = None) -> Iterator[ObjectInfo]:
        # Start at the deepest directory the prefix names fully; descend only into real
        # directories whose keys can still match (the prefix, and some key after start_after);
        # yield regular files only (no symlinks).
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        start = self.root
        if head:
            parts = split_key(head)
            start = self.root.joinpath(*parts)
            try:
                os.close(self._open_dir(parts))
            except (ObjectNotFoundError, InvalidObjectError, FileNotFoundError):
                return
            except OSError as exc:
                raise StorageError(f"cannot list {start}: {exc.strerror or exc}") from exc
        pending = [(start, f"{head}/" if head else "")]
        while pending:
            directory, base = pending.pop()
            try:
                with os.scandir(directory) as entries:
                    for entry in entries:
                        key = base + entry.name
                        if entry.is_dir(follow_symlinks=False):
                            below = key + "/"
                            if (below.startswith(prefix) or prefix.startswith(below)) and not _all_before(
                                below, start_after
                            ):
                                pending.append((Path(entry.path), below))
                        elif (
                            key.startswith(prefix)
                            and (start_after is None or key > start_after)
                            and entry.is_file(follow_symlinks=False)
                        ):
                            try:
                                st = entry.stat(follow_symlinks=False)
                            except FileNotFoundError:
                                continue
                            yield ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime)
            except (FileNotFoundError, NotADirectoryError):
                continue  # removed (or replaced) while we walked
            except OSError as exc:
                raise StorageError(f"cannot list {directory}: {exc.strerror or exc}") from exc

    def delete(self, keys: Iterable[str]) -> None:
        parents: set[Path] = set()
        for parts in [split_key(key) for key in keys]:  # a malformed key refuses the whole call
            path = self.root.joinpath(*parts)
            try:
                dir_fd = self._open_dir(parts[:-1])
            except (ObjectNotFoundError, FileNotFoundError):
                continue
            except OSError as exc:
                raise _os_error(exc, "delete", path) from exc
            try:
                os.unlink(parts[-1], dir_fd=dir_fd)
                parents.add(path.parent)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise _os_error(exc, "delete", path) from exc
            finally:
                os.close(dir_fd)
        # Remove directories left empty, deepest first, never the root.
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            while parent != self.root and parent.is_relative_to(self.root):
                try:
                    parent.rmdir()
                except OSError as exc:
                    if exc.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOENT):
                        break
                    raise StorageError(f"cannot remove {parent}: {exc.strerror}") from exc
                parent = parent.parent


def _direct_span(view: memoryview, offset: int) -> tuple[int, int]:
    """The part ``[start, end)`` of ``view`` that a direct read fills: page-aligned in memory
    and in the file, at least ``_DIRECT_MIN`` bytes; empty when the two disagree modulo a page
    or the system has no direct reads."""
    if len(view) < _DIRECT_MIN or view.readonly or not _DIRECT_IO:
        return 0, 0
    address = ctypes.addressof(ctypes.c_char.from_buffer(view))
    start = -address % _PAGE
    end = start + (len(view) - start) // _PAGE * _PAGE
    return (start, end) if (address - offset) % _PAGE == 0 and end - start >= _DIRECT_MIN else (0, 0)


def _cached(fd: int, page: memoryview, at: int) -> bool:
    """Whether the file's bytes at ``at`` are in the page cache: a read that may not wait for
    the disk (its bytes land where they belong, in ``page``)."""
    try:
        return os.preadv(fd, [page], at, os.RWF_NOWAIT) == len(page)
    except OSError:
        return False


def _direct_read(fd: int, path: Path, key: str, view: memoryview, offset: int, start: int, end: int) -> bool:
    """Fill ``view[start:end]`` (page-aligned) with ``O_DIRECT``; False where the file system
    refuses it (nothing is then known to have been read)."""
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_DIRECT)
        _read_span(fd, path, key, view, offset, start, end)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_DIRECT)
        return False
    return True


def _read_span(fd: int, path: Path, key: str, view: memoryview, offset: int, start: int, end: int) -> None:
    """Fill ``view[start:end]`` from the file's bytes at ``offset + start``."""
    pos = start
    while pos < end:
        n = os.preadv(fd, [view[pos:end]], offset + pos)
        if n == 0:
            raise StorageError(
                f"{path}: short object",
                field=key,
                expected=f">= {offset + len(view)} bytes",
                found=f"{offset + pos} bytes",
            )
        pos += n


def _all_before(directory: str, start_after: str | None) -> bool:
    """Whether every key under ``directory`` (ending in '/') sorts at or before ``start_after``:
    it sorts before it and is not a prefix of it (then no key below can pass it)."""
    return start_after is not None and directory < start_after and not start_after.startswith(directory)


def _unlink_quietly(name: str, dir_fd: int) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name, dir_fd=dir_fd)
