"""A safetensors file or Hugging Face directory read as a new stage's initial weights
(``init_from.safetensors``): a legitimate weights-only initialisation, not a resume.

Everything is checked before one tensor is allocated: every header (``read_header``), then the
key set against the model's (``Trainer.exchange_names``: every weight present, nothing
unknown; a tied alias such as ``lm_head.weight`` may be present and must then equal its
tensor), then every dtype and shape against the model's own. Then the bytes are read, their
values checked by the trainer's rules, and the directory's content hash computed for the
lineage. A refusal is a typed error naming the key, expected vs found."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cairn.checkpoint.tensors import byte_view, dtype_from_tag, dtype_tag
from cairn.errors import TensorSpecError
from cairn.interop.exchange import WeightExchange
from cairn.interop.safetensors import INDEX_SUFFIX, FileEntry, read_header, safetensors_files

__all__ = ["ImportedWeights", "content_hash", "read_weights"]

FIELD = "init_from.safetensors"
SIDE_FILES = ("config.json",)
"""Files of a directory the content hash covers besides the weights and their index."""
_SLACK = 1024
"""Tensors past the model's own a header may list and still be parsed, so that the refusal names
the foreign ones; the parse stays bounded by that many."""


@dataclass
class ImportedWeights:
    arrays: dict[str, np.ndarray]
    """Checkpoint name -> the weights read (fresh storage)."""
    content_hash: str
    """``sha256:...`` over the names and bytes of every file read (see ``content_hash``)."""


def _digest_line(path: Path, size: int, digest: str) -> str:
    return f"{path.name}\0{size}\0{digest}\n"


def _combined(lines: dict[str, str]) -> str:
    outer = hashlib.sha256()
    for name in sorted(lines):
        outer.update(lines[name].encode())
    return "sha256:" + outer.hexdigest()


def content_hash(files: list[Path]) -> str:
    """sha256 over ``name, size, sha256(bytes)`` of each file, in name order: a directory's
    identity (an identifier, not a signature)."""
    return _combined({p.name: _read_file(p, [], {}) for p in files})


def _read_file(path: Path, entries: list[FileEntry], arrays: dict[str, np.ndarray], field: str = FIELD) -> str:
    """Read ``path`` once, front to back: each entry's bytes land in its array of ``arrays``,
    and every byte of the file is hashed on the way (so the hash names exactly what was read)."""
    inner = hashlib.sha256()
    with open(path, "rb") as f:
        pos = 0
        for entry in sorted(entries, key=lambda e: e.start):
            while pos < entry.start:
                gap = f.read(min(8 << 20, entry.start - pos))
                if not gap:
                    raise TensorSpecError("file shorter than its header says", field=f"{field}: {path.name}")
                inner.update(gap)
                pos += len(gap)
            view = byte_view(arrays[entry.key])
            if f.readinto(view) != entry.length:
                raise TensorSpecError("file shorter than its header says", field=f"{field}: {entry.key}")
            inner.update(view)
            pos = entry.stop
        while chunk := f.read(8 << 20):
            inner.update(chunk)
            pos += len(chunk)
    return _digest_line(path, pos, inner.hexdigest())


def _headers(files: list[Path], expected: int, field: str) -> dict[str, tuple[Path, FileEntry]]:
    """Every file's tensors; no file may list more than the ``expected`` (the model's own)."""
    found: dict[str, tuple[Path, FileEntry]] = {}
    for path in files:
        with open(path, "rb") as f:
            entries, _ = read_header(f, str(path), max_entries=expected)
        for key, entry in entries.items():
            if key in found:
                raise TensorSpecError("a tensor is in two files", field=f"{field}: {key}", found=str(path))
            found[key] = (path, entry)
    return found


def _spec(dtype: str, shape: tuple[int, ...]) -> str:
    return f"{dtype}{list(shape)}"


def read_weights(
    path: Path,
    trainer: WeightExchange,
    fresh: Mapping[str, np.ndarray],
    *,
    field: str = FIELD,
    side_files: Sequence[str] = SIDE_FILES,
) -> ImportedWeights:
    """The weights at ``path`` under their checkpoint names, checked against ``fresh`` (the
    model's step-0 state); see the module docstring. ``field`` names the option that named
    ``path`` in a refusal; ``side_files``: the files of a directory the content hash covers
    besides the weights and their index (those present)."""
    files = safetensors_files(path, field)
    names, aliases = trainer.exchange_names()
    found = _headers(files, len(names) + len(aliases) + _SLACK, field)
    unknown = sorted(set(found) - set(names) - set(aliases))
    missing = sorted(set(names) - set(found))
    if unknown or missing:
        raise TensorSpecError(
            "the file's tensors are not this model's weights",
            field=field,
            expected=f"{len(names)} weights" + (f", missing {missing[:5]}" if missing else ""),
            found=f"{len(found)} tensors" + (f", unknown {unknown[:5]}" if unknown else ""),
        )
    for key, (_, entry) in found.items():
        want = fresh[names.get(key) or aliases[key]]
        if (entry.dtype, entry.shape) != (dtype_tag(want.dtype), want.shape):
            raise TensorSpecError(
                field=f"{field}: {key}",
                expected=_spec(dtype_tag(want.dtype), want.shape),
                found=_spec(entry.dtype, entry.shape),
            )
    by_key = {key: np.empty(entry.shape, dtype=dtype_from_tag(entry.dtype)) for key, (_, entry) in found.items()}
    lines = {file.name: _read_file(file, [e for p, e in found.values() if p == file], by_key, field) for file in files}
    arrays: dict[str, np.ndarray] = {}
    for key, arr in by_key.items():
        if key in names:
            trainer.check_values(names[key], arr.reshape(-1))
            arrays[names[key]] = arr
    for key, arr in by_key.items():
        name = aliases.get(key)
        if name is not None and byte_view(arr) != byte_view(arrays[name]):
            raise TensorSpecError(
                "a tied weight differs from the tensor it is tied to",
                field=f"{field}: {key}",
                expected=f"equal to {name}",
                found="other values",
            )
    if path.is_dir():
        side = [path / n for n in side_files if (path / n).is_file()] + sorted(path.glob(f"*{INDEX_SUFFIX}"))
        lines.update({p.name: _read_file(p, [], {}) for p in side})
    return ImportedWeights(arrays, _combined(lines))
