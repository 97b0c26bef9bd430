"""What the data files are, at O(files) cost: each file's SHA-256, read once and then cached by
its (path, size, mtime, ctime, inode) in a cache directory outside any checkout, or declared by
the user; and the refusal of a checkpoint whose files have changed since, naming the file."""

from __future__ import annotations

import glob
import hashlib
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from cairn.errors import ConfigError, IncompatibleConfigError
from cairn.trainers.pytorch.records.options import DataFile, DataFiles

__all__ = ["cache_dir", "check_unchanged", "content_digest", "expand_files", "file_digests"]

_CHUNK = 1 << 20


def cache_dir(option: str | None) -> Path:
    """``hash_cache``, else ``$XDG_CACHE_HOME/cairn/data-hashes``, else ``~/.cache/cairn/data-hashes``."""
    if option:
        return Path(option)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cairn" / "data-hashes"


def expand_files(options: DataFiles) -> list[tuple[Path, str | None]]:
    """Every file with its declared digest (None: to be computed): globs expanded, sorted; a glob
    that matches nothing or a path that is not a file is refused."""
    out: list[tuple[Path, str | None]] = []
    for i, entry in enumerate(options.files):
        field = f"files[{i}]"
        if isinstance(entry, DataFile):
            path = Path(entry.path)
            if not path.is_file():
                raise ConfigError(field, expected="a readable file", found=entry.path)
            out.append((path, "sha256:" + entry.sha256.removeprefix("sha256:")))
            continue
        matches = sorted(glob.glob(entry, recursive=True)) if glob.has_magic(entry) else [entry]
        files = [Path(m) for m in matches if Path(m).is_file()]
        if not files:
            raise ConfigError(field, expected="a file, or a glob that matches files", found=entry)
        out.extend((f, None) for f in files)
    return out


def _key(path: Path) -> tuple[str, int]:
    st = path.stat()
    ident = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}\0{st.st_dev}"
    return hashlib.sha256(ident.encode()).hexdigest(), st.st_size


def _cached(cache: Path, key: str) -> str | None:
    try:
        text = (cache / key[:2] / key).read_text().strip()
    except OSError:
        return None
    return text if text.startswith("sha256:") and len(text) == 71 else None


def _store(cache: Path, key: str, digest: str) -> None:
    """Best effort, atomic: a cache that cannot be written costs a re-read next time, nothing else."""
    folder = cache / key[:2]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder)
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
        os.replace(tmp, folder / key)
    except OSError:
        return


def content_digest(path: Path, cache: Path) -> str:
    """``sha256:HEX`` of the file's bytes; read only when the cache has no entry for the file's
    current (path, size, mtime, ctime, inode)."""
    key, _ = _key(path)
    found = _cached(cache, key)
    if found is not None:
        return found
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except OSError as exc:
        raise ConfigError(f"data file {path}", expected="a readable file", found=str(exc)[:200]) from None
    digest = "sha256:" + h.hexdigest()
    _store(cache, key, digest)
    return digest


def file_digests(files: Sequence[tuple[Path, str | None]], cache: Path) -> list[str]:
    """Each file's digest: the declared one (checked against the cache when the cache knows the
    file as it is now: a mismatch is refused), else ``content_digest``."""
    digests = []
    for path, declared in files:
        if declared is None:
            digests.append(content_digest(path, cache))
            continue
        known = _cached(cache, _key(path)[0])
        if known is not None and known != declared:
            raise ConfigError(f"data file {path}: declared sha256", expected=known, found=declared)
        digests.append(declared)
    return digests


def check_unchanged(names: Sequence[str], digests: Sequence[str], saved: object) -> None:
    """A checkpoint's recorded digests (``saved``) are the files' digests now: a changed, added
    or removed file is refused, naming it."""
    if not isinstance(saved, list) or not all(isinstance(d, str) for d in saved):
        raise IncompatibleConfigError(field="data files", expected="a list of file digests", found=type(saved).__name__)
    for name, now, then in zip(names, digests, saved, strict=False):
        if now != then:
            raise IncompatibleConfigError(
                f"data file {name} changed since the checkpoint", field="data files", expected=then, found=now
            )
    if len(saved) != len(digests):
        raise IncompatibleConfigError(
            "the data files are not the checkpoint's", field="data files", expected=len(saved), found=len(digests)
        )
