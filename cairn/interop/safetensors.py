"""The safetensors format (https://github.com/huggingface/safetensors): an 8-byte little-endian
header length, a JSON header (``name -> {dtype, shape, data_offsets}``, optional
``__metadata__`` of strings), then the tensors' raw little-endian bytes. Written here by a
streaming writer (``plan_files`` + ``header_bytes``), read by ``read_header`` under limits: the
header's size, every dtype, shape and offset are checked against the file's real size before
anything is allocated. No pickle anywhere."""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from cairn.checkpoint.tensors import ALLOWED_DTYPES, dtype_from_tag
from cairn.errors import ConfigError, TensorSpecError
from cairn.jsonio import JsonLimits, parse_json

__all__ = [
    "INDEX_SUFFIX",
    "MAX_HEADER_BYTES",
    "FileEntry",
    "FilePlan",
    "header_bytes",
    "plan_files",
    "read_header",
    "safetensors_files",
]

TO_SAFETENSORS = {
    "<f8": "F64",
    "<f4": "F32",
    "<f2": "F16",
    "bfloat16": "BF16",
    "<i8": "I64",
    "<i4": "I32",
    "<i2": "I16",
    "|i1": "I8",
    "<u8": "U64",
    "<u4": "U32",
    "|u1": "U8",
    "|b1": "BOOL",
}
"""Cairn's dtype tags (``cairn.checkpoint.tensors``) and their safetensors names."""
FROM_SAFETENSORS = {v: k for k, v in TO_SAFETENSORS.items()}
assert set(TO_SAFETENSORS) == ALLOWED_DTYPES
MAX_HEADER_BYTES = 100 << 20
"""The largest header read (safetensors' own reader refuses more than 100 MB)."""
MAX_ENTRIES = 1 << 16
"""Tensors a header may list when the reader expects no particular number (``Limits.max_tensors``)."""
_ITEMS_PER_ENTRY = 16 + 8
"""JSON values and members one entry takes at most: its key, dtype, shape (up to 8 dims, as
``Limits.max_ndim``) and offsets, with their containers."""
_METADATA_ITEMS = 1 << 12
INDEX_SUFFIX = ".safetensors.index.json"


@dataclass(frozen=True)
class FileEntry:
    """One tensor of a safetensors file: its key, Cairn dtype tag, shape and byte range in the
    file (absolute offsets: the header included)."""

    key: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    stop: int

    @property
    def length(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class FilePlan:
    """One file of an export: its name and its tensors (key -> (dtype tag, shape)) in order."""

    name: str
    tensors: dict[str, tuple[str, tuple[int, ...]]]

    @property
    def data_bytes(self) -> int:
        return sum(_nbytes(d, s) for d, s in self.tensors.values())


def _nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    return math.prod(shape) * dtype_from_tag(dtype).itemsize


def plan_files(tensors: Mapping[str, tuple[str, tuple[int, ...]]], stem: str, max_file_bytes: int) -> list[FilePlan]:
    """``tensors`` (by key, in key order) in files of at most ``max_file_bytes`` of data each (a
    tensor larger than that gets a file of its own): ``STEM.safetensors`` when one file holds
    them, else ``STEM-00001-of-0000N.safetensors`` (the Hugging Face names, with an index)."""
    groups: list[dict[str, tuple[str, tuple[int, ...]]]] = [{}]
    size = 0
    for key in sorted(tensors):
        n = _nbytes(*tensors[key])
        if groups[-1] and size + n > max_file_bytes:
            groups.append({})
            size = 0
        groups[-1][key] = tensors[key]
        size += n
    if len(groups) == 1:
        return [FilePlan(f"{stem}.safetensors", groups[0])]
    total = len(groups)
    return [FilePlan(f"{stem}-{i + 1:05d}-of-{total:05d}.safetensors", g) for i, g in enumerate(groups)]


def header_bytes(plan: FilePlan, metadata: Mapping[str, str]) -> bytes:
    """The length prefix and JSON header of ``plan``'s file (tensors laid out in order),
    padded with spaces to a multiple of 8 bytes as the reference writer does."""
    body: dict[str, object] = {"__metadata__": dict(metadata)}
    offset = 0
    for key, (dtype, shape) in plan.tensors.items():
        n = _nbytes(dtype, shape)
        body[key] = {"dtype": TO_SAFETENSORS[dtype], "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(body, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def read_header(
    handle: BinaryIO, where: str, max_entries: int = MAX_ENTRIES
) -> tuple[dict[str, FileEntry], dict[str, str]]:
    """The tensors and metadata of an open safetensors file, every field checked: the header
    fits the file and ``MAX_HEADER_BYTES``; it lists at most ``max_entries`` tensors (the
    reader's expectation: how many the model has), counted before the JSON is parsed, so the
    parse costs what that many entries cost, whatever the header's size; each dtype is one
    Cairn stores; each shape times the itemsize is exactly its byte range; ranges lie inside the
    file and do not overlap."""
    size = os.fstat(handle.fileno()).st_size
    prefix = handle.read(8)
    if len(prefix) != 8:
        raise TensorSpecError("not a safetensors file", field=where, expected="an 8-byte header length", found=size)
    (n,) = struct.unpack("<Q", prefix)
    if n > min(MAX_HEADER_BYTES, size - 8):
        raise TensorSpecError(
            "safetensors header length past the file or the limit",
            field=f"{where}: header",
            expected=f"<= {min(MAX_HEADER_BYTES, size - 8)} bytes",
            found=n,
        )
    budget = JsonLimits(max_bytes=MAX_HEADER_BYTES, max_items=_ITEMS_PER_ENTRY * max_entries + _METADATA_ITEMS)
    data = parse_json(handle.read(n), where=f"{where}: header", error=TensorSpecError, limits=budget)
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: header", expected="a JSON object", found=type(data).__name__)
    if len(data) - ("__metadata__" in data) > max_entries:
        raise TensorSpecError(
            "the file lists more tensors than expected", field=f"{where}: header", expected=max_entries, found=len(data)
        )
    metadata = data.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ConfigError(f"{where}: __metadata__", expected="an object of strings", found=str(metadata)[:80])
    base = 8 + n
    entries: dict[str, FileEntry] = {}
    for key, spec in data.items():
        field = f"{where}: {key}"
        if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
            raise TensorSpecError(field=field, expected="dtype, shape, data_offsets", found=str(spec)[:80])
        dtype = FROM_SAFETENSORS.get(spec["dtype"]) if isinstance(spec["dtype"], str) else None
        if dtype is None:
            raise TensorSpecError(field=f"{field}.dtype", expected=sorted(FROM_SAFETENSORS), found=spec["dtype"])
        shape, offsets = spec["shape"], spec["data_offsets"]
        if not (isinstance(shape, list) and all(isinstance(d, int) and 0 <= d < 1 << 48 for d in shape)):
            raise TensorSpecError(field=f"{field}.shape", expected="non-negative integers", found=str(shape)[:80])
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise TensorSpecError(field=f"{field}.data_offsets", expected="[begin, end]", found=str(offsets)[:80])
        begin, end = offsets
        want = _nbytes(dtype, tuple(shape))
        if not 0 <= begin <= end <= size - base or end - begin != want:
            raise TensorSpecError(
                "tensor bytes disagree with its dtype x shape or run past the file",
                field=f"{field}.data_offsets",
                expected=f"{want} bytes within {size - base}",
                found=offsets,
            )
        entries[key] = FileEntry(key, dtype, tuple(shape), base + begin, base + end)
    ranges = sorted((e.start, e.stop, e.key) for e in entries.values() if e.length)
    for (_, stop, a), (start, _, b) in zip(ranges, ranges[1:], strict=False):
        if start < stop:
            raise TensorSpecError("tensors overlap", field=f"{where}: {b}", expected=f"after {a}", found=start)
    return entries, metadata


def safetensors_files(path: Path, field: str = "init_from.safetensors") -> list[Path]:
    """The safetensors files of ``path``: the file itself; in a directory, the files its
    ``*.safetensors.index.json`` maps, else its one ``*.safetensors`` file (``field``: the
    option that named ``path``, for a refusal)."""
    if path.is_file():
        return [path]
    if not path.is_dir():
        raise ConfigError(field, expected="a safetensors file or a directory", found=str(path))
    indexes = sorted(path.glob(f"*{INDEX_SUFFIX}"))
    if len(indexes) == 1:
        raw = indexes[0].read_bytes()
        index = parse_json(raw, where=str(indexes[0]), limits=JsonLimits(max_bytes=MAX_HEADER_BYTES))
        weight_map = index.get("weight_map") if isinstance(index, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ConfigError(
                f"{indexes[0]}: weight_map", expected="an object of file names", found=str(weight_map)[:80]
            )
        names = sorted(set(weight_map.values()))
        for name in names:
            if "/" in name or name.startswith(".") or not (path / name).is_file():
                raise ConfigError(f"{indexes[0]}: weight_map", expected="files in the directory", found=name)
        return [path / name for name in names]
    files = sorted(p for p in path.glob("*.safetensors") if p.is_file())
    if len(files) != 1 or len(indexes) > 1:
        raise ConfigError(
            field,
            expected="one .safetensors file, or an index.json and its files",
            found=f"{len(files)} files, {len(indexes)} indexes in {path}",
        )
    return files
