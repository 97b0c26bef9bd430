"""The ``.metadata`` of a PyTorch Distributed Checkpoint (DCP) directory, read as data: a pickle
of DCP's metadata classes, bounded in size (``MAX_METADATA_BYTES``) and read by
``cairn.interop.pickle_data`` naming only ``METADATA_GLOBALS`` (the pairs a ``dcp.save`` of torch
2.13 writes; anything else, such as ``os.system``, is refused in one line naming it). The result
is plain: each tensor's dtype, shape and chunks, the keys of the entries that are not tensors,
and where each chunk's bytes are (file, offset, length), every field checked."""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cairn.errors import CheckpointError, ConfigError, ManifestError, SizeLimitError
from cairn.interop.pickle_data import Built, Global, read_pickle
from cairn.interop.weights import _digest_line

__all__ = [
    "MAX_METADATA_BYTES",
    "METADATA_FILE",
    "METADATA_GLOBALS",
    "TORCH_DTYPES",
    "Chunk",
    "DcpMetadata",
    "StoredItem",
    "TensorEntry",
    "read_dcp_metadata",
    "shape_of",
]

METADATA_FILE = ".metadata"
MAX_METADATA_BYTES = 64 << 20
"""The largest ``.metadata`` read (about 200 bytes per tensor chunk)."""
MAX_CHUNKS = 1 << 20
"""Tensor chunks a ``.metadata`` may describe, all tensors together."""
MAX_NDIM = 8
MAX_DIM = 1 << 48
TORCH_DTYPES = {
    "float64": "<f8",
    "float32": "<f4",
    "float16": "<f2",
    "bfloat16": "bfloat16",
    "int64": "<i8",
    "int32": "<i4",
    "int16": "<i2",
    "int8": "|i1",
    "uint8": "|u1",
    "bool": "|b1",
}
"""torch's dtypes (``torch.NAME``) a tensor may have here, as Cairn's dtype tags."""

_META = "torch.distributed.checkpoint.metadata"
METADATA_GLOBALS = frozenset(
    {
        (_META, "Metadata"),
        (_META, "TensorStorageMetadata"),
        (_META, "BytesStorageMetadata"),
        (_META, "ChunkStorageMetadata"),
        (_META, "TensorProperties"),
        (_META, "MetadataIndex"),
        (_META, "StorageMeta"),
        (_META, "_MEM_FORMAT_ENCODING"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.serialization", "_get_layout"),
        ("torch", "Size"),
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("pathlib._local", "PosixPath"),
        ("pathlib._local", "WindowsPath"),
        *(("torch", name) for name in TORCH_DTYPES),
    }
)
"""What a ``.metadata`` may name: DCP's metadata classes, ``torch.Size``, the dtypes, the layout
and memory-format encodings, and the path class of ``StorageMeta.checkpoint_id``."""


@dataclass(frozen=True)
class Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]


@dataclass(frozen=True)
class TensorEntry:
    dtype: str
    """Cairn's dtype tag."""
    shape: tuple[int, ...]
    chunks: tuple[Chunk, ...]


@dataclass(frozen=True)
class StoredItem:
    file: str
    offset: int
    length: int


@dataclass
class DcpMetadata:
    """A ``.metadata`` as data: tensors by their flat key (``model.fc.weight``), the keys of the
    entries that are not tensors, where each tensor chunk's bytes are, and its own digest line."""

    tensors: dict[str, TensorEntry]
    others: frozenset[str]
    items: dict[tuple[str, tuple[int, ...]], StoredItem]
    files: frozenset[str]
    digest: str


def _state(value: Any, name: str, where: str, module: str = _META) -> Any:
    """The state ``BUILD`` set on a DCP metadata object of class ``module.name``."""
    if not (isinstance(value, Built) and value.call == Global(module, name) and value.args == ()):
        found = str(value.call) if isinstance(value, Built) else type(value).__name__
        raise ManifestError(field=where, expected=f"a {name}", found=found)
    return value.state


def _fields(value: Any, name: str, where: str, required: set[str], optional: set[str] | None = None) -> dict[str, Any]:
    state = value if name == "" else _state(value, name, where)
    if not isinstance(state, dict) or not required <= set(state) <= required | (optional or set()):
        found = sorted(k for k in state if isinstance(k, str)) if isinstance(state, dict) else type(state).__name__
        raise ManifestError(field=where, expected=f"{name or 'fields'} {sorted(required)}", found=found)
    return state


def shape_of(value: Any, where: str, error: type[CheckpointError] = ManifestError) -> tuple[int, ...]:
    """A ``torch.Size`` (or a plain tuple of ints) within the bounds of a shape."""
    if isinstance(value, Built) and value.call == Global("torch", "Size") and len(value.args) == 1:
        value = value.args[0]
    if not (
        isinstance(value, tuple | list)
        and len(value) <= MAX_NDIM
        and all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d < MAX_DIM for d in value)
    ):
        raise error(field=where, expected=f"a torch.Size of <= {MAX_NDIM} non-negative ints", found="other")
    return tuple(value)


def _tensor_entry(value: Any, where: str, budget: list[int]) -> TensorEntry:
    body = _fields(value, "TensorStorageMetadata", where, {"properties", "size", "chunks"})
    props = _state(body["properties"], "TensorProperties", f"{where}.properties")
    dtype = props[0] if isinstance(props, tuple) and props else props.get("dtype") if isinstance(props, dict) else None
    if not (isinstance(dtype, Global) and dtype.module == "torch" and dtype.name in TORCH_DTYPES):
        found = str(dtype) if isinstance(dtype, Global) else type(dtype).__name__
        raise ManifestError(field=f"{where}.dtype", expected=sorted(TORCH_DTYPES), found=found)
    shape = shape_of(body["size"], f"{where}.size")
    chunks = body["chunks"]
    if not isinstance(chunks, list) or len(chunks) > budget[0]:
        raise SizeLimitError(field=f"{where}.chunks", expected=f"<= {MAX_CHUNKS} chunks in all", found="more")
    budget[0] -= len(chunks)
    parsed = []
    for i, chunk in enumerate(chunks):
        c = _fields(chunk, "ChunkStorageMetadata", f"{where}.chunks[{i}]", {"offsets", "sizes"})
        parsed.append(
            Chunk(shape_of(c["offsets"], f"{where}.chunks[{i}]"), shape_of(c["sizes"], f"{where}.chunks[{i}]"))
        )
    return TensorEntry(TORCH_DTYPES[dtype.name], shape, tuple(parsed))


def _stored_item(key: Any, value: Any, where: str) -> tuple[str, tuple[int, ...] | None, StoredItem]:
    index = _fields(key, "MetadataIndex", where, {"fqn"}, {"offset", "index"})
    info = _state(value, "_StorageInfo", where, "torch.distributed.checkpoint.filesystem")
    info = _fields(info, "", where, {"relative_path", "offset", "length"}, {"transform_descriptors"})
    if info.get("transform_descriptors"):
        raise ManifestError(field=where, expected="items without DCP extensions", found="transform_descriptors")
    fqn, path, offset, length = index["fqn"], info["relative_path"], info["offset"], info["length"]
    if not isinstance(fqn, str) or not isinstance(path, str) or "/" in path or "\\" in path or path.startswith("."):
        found = path[:80] if isinstance(path, str) else type(path).__name__
        raise ManifestError(field=where, expected="a key and a file name in the directory", found=found)
    if not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 62 for n in (offset, length)):
        raise ManifestError(field=f"{where}: {fqn}", expected="a byte offset and length", found="other")
    chunk = None if index.get("offset") is None else shape_of(index["offset"], f"{where}: {fqn}")
    return fqn, chunk, StoredItem(path, offset, length)


def read_dcp_metadata(path: Path, field: str) -> DcpMetadata:
    """The ``.metadata`` of the DCP directory ``path``, read under limits (module docstring)."""
    meta = path / METADATA_FILE
    if not path.is_dir() or not meta.is_file():
        raise ConfigError(field, expected="a DCP directory (with .metadata)", found=str(path))
    with open(meta, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > MAX_METADATA_BYTES:
            raise SizeLimitError(
                field=f"{field}: {METADATA_FILE}", expected=f"<= {MAX_METADATA_BYTES} bytes", found=size
            )
        raw = f.read(size)  # not more: read(n) allocates n bytes up front
    where = f"{field}: {METADATA_FILE}"
    value = read_pickle(raw, METADATA_GLOBALS, where=where, what="DCP metadata classes", error=ManifestError)
    body = _fields(
        value, "Metadata", where, {"state_dict_metadata"}, {"planner_data", "storage_data", "storage_meta", "version"}
    )
    entries, stored = body["state_dict_metadata"], body.get("storage_data")
    if not isinstance(entries, dict) or not isinstance(stored, dict):
        raise ManifestError(field=where, expected="state_dict_metadata and storage_data", found="other")
    tensors: dict[str, TensorEntry] = {}
    others = set()
    budget = [MAX_CHUNKS]
    for key, entry in entries.items():
        if not isinstance(key, str):
            raise ManifestError(field=where, expected="str keys", found=type(key).__name__)
        if isinstance(entry, Built) and entry.call == Global(_META, "BytesStorageMetadata"):
            others.add(key)
        else:
            tensors[key] = _tensor_entry(entry, f"{where}: {key}", budget)
    items: dict[tuple[str, tuple[int, ...]], StoredItem] = {}
    files = set()
    for key, info in stored.items():
        fqn, chunk, item = _stored_item(key, info, f"{where}: storage_data")
        files.add(item.file)
        if chunk is not None:
            items[(fqn, chunk)] = item
    digest = _digest_line(meta, len(raw), hashlib.sha256(raw).hexdigest())
    return DcpMetadata(tensors, frozenset(others), items, frozenset(files), digest)
