"""Local-disk store: temp names, fsync, atomic rename, fsync of the directory.

The embedded default. ``put_if_absent`` uses link(2), which fails when the target exists:
the same create-if-absent guarantee S3 gives with ``If-None-Match: *``.
"""

from __future__ import annotations

import errno
import os
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

from cairn.errors import ObjectNotFoundError, StorageError
from cairn.stores.base import Chunk, ObjectInfo, Store

__all__ = ["LocalStore"]

TMP_MARK = ".tmp-"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalStore(Store):
    """Objects are files under ``root``; keys are relative paths."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root).expanduser().resolve()
        self.url = str(self.root)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if not key or any(p in ("", ".", "..") for p in parts) or key.startswith("/"):
            raise StorageError(f"invalid object key {key!r}")
        return self.root.joinpath(*parts)

    def _write_temp(self, final: Path, chunks: Iterable[Chunk]) -> Path:
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f".{final.name}{TMP_MARK}{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                while view:
                    written = os.write(fd, view)
                    view = view[written:]
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            tmp.unlink(missing_ok=True)
            raise
        os.close(fd)
        return tmp

    def write_object(self, key: str, chunks: Iterable[Chunk], size: int | None = None) -> None:
        final = self._path(key)
        try:
            tmp = self._write_temp(final, chunks)
            os.replace(tmp, final)
            _fsync_dir(final.parent)
        except OSError as exc:
            raise StorageError(f"cannot write {final}: {exc.strerror or exc}") from exc

    def put_if_absent(self, key: str, data: bytes) -> bool:
        final = self._path(key)
        try:
            tmp = self._write_temp(final, [data])
            try:
                os.link(tmp, final)
                created = True
            except FileExistsError:
                created = False
            finally:
                tmp.unlink(missing_ok=True)
            _fsync_dir(final.parent)
        except OSError as exc:
            raise StorageError(f"cannot commit {final}: {exc.strerror or exc}") from exc
        return created

    def read(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"no object {path}") from exc
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc

    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        path = self._path(key)
        view = out.cast("B") if out.format != "B" else out
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"no object {path}") from exc
        except OSError as exc:
            raise StorageError(f"cannot open {path}: {exc.strerror or exc}") from exc
        try:
            pos = 0
            while pos < len(view):
                n = os.preadv(fd, [view[pos:]], offset + pos)
                if n == 0:
                    raise StorageError(
                        f"{path}: short object",
                        field=key,
                        expected=f">= {offset + len(view)} bytes",
                        found=f"{offset + pos} bytes",
                    )
                pos += n
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    def size(self, key: str) -> int:
        path = self._path(key)
        try:
            return path.stat().st_size
        except FileNotFoundError as exc:
            raise ObjectNotFoundError(f"no object {path}") from exc
        except OSError as exc:
            raise StorageError(f"cannot stat {path}: {exc.strerror or exc}") from exc

    def list(self, prefix: str = "") -> Iterator[ObjectInfo]:
        # Walk only the deepest directory that the prefix names fully.
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root.joinpath(*head.split("/")) if head else self.root
        if not base.is_dir():
            return
        for dirpath, _dirs, files in os.walk(base):
            for name in files:
                full = Path(dirpath, name)
                key = full.relative_to(self.root).as_posix()
                if key.startswith(prefix):
                    try:
                        st = full.stat()
                    except FileNotFoundError:
                        continue
                    yield ObjectInfo(key=key, size=st.st_size, mtime=st.st_mtime)

    def delete(self, keys: Iterable[str]) -> None:
        parents: set[Path] = set()
        for key in keys:
            path = self._path(key)
            try:
                path.unlink()
                parents.add(path.parent)
            except FileNotFoundError:
                continue
            except OSError as exc:
                raise StorageError(f"cannot delete {path}: {exc.strerror or exc}") from exc
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
