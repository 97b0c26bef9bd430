"""What the data files are, at O(files) cost: each file's SHA-256, read once and then cached by
its (path, size, mtime, ctime, inode) in a cache directory outside any checkout, or declared by
the user; and the refusal of a checkpoint whose files have changed since, naming the file by its
option's path in the run's config (``trainer.options.data.files[K]``)."""

from __future__ import annotations

import glob
import hashlib
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cairn.errors import ConfigError, IncompatibleConfigError
from cairn.trainers.pytorch.records.options import DataFile, DataFiles

__all__ = [
    "ListedFile",
    "cache_dir",
    "check_unchanged",
    "content_digest",
    "expand_files",
    "file_change",
    "file_digests",
    "recorded_digests",
]

_CHUNK = 1 << 20


@dataclass(frozen=True)
class ListedFile:
    """A file of the dataset: where it is, its declared digest (None: to be computed) and the
    entry of ``files`` it came from, as the run's config names it (``trainer.options.data.files[K]``)."""

    path: Path
    declared: str | None
    entry: str

    @property
    def name(self) -> str:
        """How an error names the file: its entry and its path (a glob's entry matches several)."""
        return f"{self.entry} ({self.path})"


def cache_dir(option: str | None) -> Path:
    """``hash_cache``, else ``$XDG_CACHE_HOME/cairn/data-hashes``, else ``~/.cache/cairn/data-hashes``."""
    if option:
        return Path(option)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cairn" / "data-hashes"


def expand_files(options: DataFiles, field: str) -> list[ListedFile]:
    """Every file, globs expanded and sorted; ``field`` is the option's path in the run's config
    (``trainer.options.data``). A glob that matches nothing or a path that is not a file is refused."""
    out: list[ListedFile] = []
    for i, entry in enumerate(options.files):
        at = f"{field}.files[{i}]"
        if isinstance(entry, DataFile):
            path = Path(entry.path)
            if not path.is_file():
                raise ConfigError(at, expected="a readable file", found=entry.path)
            out.append(ListedFile(path, "sha256:" + entry.sha256.removeprefix("sha256:"), at))
            continue
        matches = sorted(glob.glob(entry, recursive=True)) if glob.has_magic(entry) else [entry]
        files = [Path(m) for m in matches if Path(m).is_file()]
        if not files:
            raise ConfigError(at, expected="a file, or a glob that matches files", found=entry)
        out.extend(ListedFile(f, None, at) for f in files)
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


def content_digest(path: Path, cache: Path, name: str | None = None) -> str:
    """``sha256:HEX`` of the file's bytes; read only when the cache has no entry for the file's
    current (path, size, mtime, ctime, inode). ``name``: how an error names the file."""
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
        raise ConfigError(name or f"data file {path}", expected="a readable file", found=str(exc)[:200]) from None
    digest = "sha256:" + h.hexdigest()
    _store(cache, key, digest)
    return digest


def file_digests(files: Sequence[ListedFile], cache: Path) -> list[str]:
    """Each file's digest: the declared one (checked against the cache when the cache knows the
    file as it is now: a mismatch is refused), else ``content_digest``."""
    digests = []
    for file in files:
        if file.declared is None:
            digests.append(content_digest(file.path, cache, file.name))
            continue
        known = _cached(cache, _key(file.path)[0])
        if known is not None and known != file.declared:
            raise ConfigError(f"{file.name}: declared sha256", expected=known, found=file.declared)
        digests.append(file.declared)
    return digests


def _short_digest(digest: str) -> str:
    return digest[: len("sha256:") + 12]


def file_change(
    files: Sequence[ListedFile], digests: Sequence[str], saved: Sequence[str], field: str
) -> IncompatibleConfigError | None:
    """The refusal of a checkpoint whose recorded digests (``saved``, in the files' order) are not
    the files' digests now (``digests``): the first changed file named, or the count when files
    were added or removed (``field``: the option's path); None when they are the same."""
    if len(saved) != len(digests):
        return IncompatibleConfigError(
            "the files are not the checkpoint's; nothing was loaded",
            field=f"{field}.files",
            expected=f"{len(saved)} files",
            found=f"{len(digests)} files",
        )
    for file, now, then in zip(files, digests, saved, strict=True):
        if now != then:
            return IncompatibleConfigError(
                "changed since the checkpoint was written; nothing was loaded",
                field=file.name,
                expected=_short_digest(then),
                found=_short_digest(now),
            )
    return None


def recorded_digests(state: object) -> list[str] | None:
    """The file digests a loader state records (``RecordLoader.state_dict``'s ``files``), if any."""
    saved = state.get("files") if isinstance(state, dict) else None
    return saved if isinstance(saved, list) and all(isinstance(d, str) for d in saved) else None


def check_unchanged(files: Sequence[ListedFile], digests: Sequence[str], state: object, field: str) -> None:
    """A loader state (``state``) records the files' digests now: a changed, added or removed
    file is refused, naming it (``file_change``), and so is a state that records none."""
    saved = recorded_digests(state)
    if saved is None:
        raw = state.get("files") if isinstance(state, dict) else state
        raise IncompatibleConfigError(
            "the loader state records no file digests",
            field=f"{field}.files",
            expected="a list of file digests",
            found=type(raw).__name__,
        )
    change = file_change(files, digests, saved, field)
    if change is not None:
        raise change
