"""PyTorch Distributed Checkpoint (DCP) directories read without trusting them, and
``init_from.dcp``: a model's weights from one.

The ``.metadata`` is read as data (``cairn.interop.dcp_metadata``); nothing here unpickles or
imports torch. Each tensor chunk is a ``torch.save`` archive at the byte range the metadata gives
in a ``.distcp`` file: the range must lie inside its file and be at most the chunk's data plus
``ITEM_SLACK`` before it is read; the archive must be stored (not compressed), its ``data.pkl``
may name only ``TENSOR_GLOBALS``, its storage must hold every element its dtype, shape, offset and
strides reach. Chunks (one per rank of a sharded save) must tile their tensor. Entries that are
not tensors (Python objects DCP pickles: optimizer hyper-parameters, data-loader state) are never
read.

``read_dcp_weights`` reads a DCP written as Cairn's export writes it (``{"model": ...,
"optimizer": ...}``) or as TorchTitan does (the model's keys at the top level), checked as
``init_from.safetensors`` checks a file (``cairn.interop.weights``)."""

from __future__ import annotations

import hashlib
import io
import math
import os
import zipfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from cairn.checkpoint.tensors import byte_view, dtype_from_tag, dtype_tag
from cairn.errors import SizeLimitError, TensorSpecError
from cairn.interop.dcp_metadata import (
    MAX_DIM,
    METADATA_FILE,
    TORCH_DTYPES,
    Chunk,
    DcpMetadata,
    StoredItem,
    TensorEntry,
    read_dcp_metadata,
    shape_of,
)
from cairn.interop.exchange import WeightExchange
from cairn.interop.pickle_data import Built, Global, Persistent, read_pickle
from cairn.interop.weights import ImportedWeights, _combined, _digest_line

__all__ = ["ITEM_SLACK", "OTHER_GROUPS", "TENSOR_GLOBALS", "read_dcp_tensors", "read_dcp_weights"]

FIELD = "init_from.dcp"
ITEM_SLACK = 1 << 16
"""Bytes a chunk's ``torch.save`` archive may take past its data (headers, alignment: ~1.5 KB)."""
_MAX_PICKLE_BYTES = 1 << 20
"""The largest ``data.pkl`` of a chunk's archive (a tensor's takes ~150 bytes)."""
STORAGE_TYPES = {
    f"{storage}Storage": TORCH_DTYPES[dtype]
    for dtype, storage in (
        ("float64", "Double"),
        ("float32", "Float"),
        ("float16", "Half"),
        ("bfloat16", "BFloat16"),
        ("int64", "Long"),
        ("int32", "Int"),
        ("int16", "Short"),
        ("int8", "Char"),
        ("uint8", "Byte"),
        ("bool", "Bool"),
    )
}
"""The storage classes ``torch.save`` names for the dtypes of ``dcp_metadata.TORCH_DTYPES``."""
TENSOR_GLOBALS = frozenset(
    {("torch._utils", "_rebuild_tensor_v2"), ("collections", "OrderedDict"), *(("torch", s) for s in STORAGE_TYPES)}
)
"""What a chunk's ``data.pkl`` may name (``torch.save`` of one tensor)."""
OTHER_GROUPS = ("optimizer", "lr_scheduler", "dataloader", "train_state")
"""Top-level entries beside the model's that an import passes over (never decoded; their files
are hashed with the rest): Cairn's export writes ``optimizer``; TorchTitan the four."""


MAX_CHUNKS_PER_TENSOR = 4096
"""Chunks one tensor may be saved in (one per rank that holds a piece of it): the overlap check
is quadratic in the chunks that share a first offset."""


def _check_chunks(key: str, entry: TensorEntry, field: str) -> None:
    """The chunks tile the tensor: each inside it, none overlapping, their volumes its volume."""
    where = f"{field}: {key}"
    if len(entry.chunks) > MAX_CHUNKS_PER_TENSOR:
        raise TensorSpecError(
            "too many chunks", field=where, expected=f"<= {MAX_CHUNKS_PER_TENSOR}", found=len(entry.chunks)
        )
    for c in entry.chunks:
        if len(c.offsets) != len(entry.shape) or len(c.sizes) != len(entry.shape):
            raise TensorSpecError(
                "a chunk with another number of dimensions", field=where, expected=entry.shape, found=c.sizes
            )
        if any(o + s > d for o, s, d in zip(c.offsets, c.sizes, entry.shape, strict=True)):
            raise TensorSpecError("a chunk past its tensor", field=where, expected=entry.shape, found=c.offsets)
    nonempty = [c for c in entry.chunks if math.prod(c.sizes) > 0] if entry.shape else []
    ordered = sorted(nonempty, key=lambda c: c.offsets)
    for i, a in enumerate(ordered):
        for b in ordered[i + 1 :]:
            if b.offsets[0] >= a.offsets[0] + a.sizes[0]:
                break  # sorted by the first offset: no later chunk meets ``a`` either
            if all(
                bo < ao + n and ao < bo + m for ao, n, bo, m in zip(a.offsets, a.sizes, b.offsets, b.sizes, strict=True)
            ):
                raise TensorSpecError("chunks overlap", field=where, expected=f"after {a.offsets}", found=b.offsets)
    volume = sum(math.prod(c.sizes) for c in entry.chunks)
    if volume != math.prod(entry.shape):
        raise TensorSpecError("chunks do not cover it", field=where, expected=math.prod(entry.shape), found=volume)


_ZIP_ERRORS = (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, OSError, EOFError, NotImplementedError)


def _member(archive: zipfile.ZipFile, infos: dict[str, zipfile.ZipInfo], name: str, limit: int, where: str) -> bytes:
    """The archive member ``name`` (at most ``limit`` bytes, checked before it is read; CRC checked)."""
    info = infos.get(name)
    if info is None or info.file_size > limit:
        found = "absent" if info is None else f"{info.file_size} bytes"
        raise TensorSpecError(field=where, expected=f"{name.split('/', 1)[-1]} of <= {limit} bytes", found=found)
    try:
        return archive.read(info)
    except _ZIP_ERRORS as exc:
        raise TensorSpecError(field=where, expected=f"a readable {name}", found=type(exc).__name__) from None


def _rebuild_args(value: Any, where: str) -> tuple[str, str, int, int, tuple[int, ...], tuple[int, ...]]:
    """What ``data.pkl`` says of its one tensor: dtype tag, storage key and elements, offset, size, stride."""
    v2 = Global("torch._utils", "_rebuild_tensor_v2")
    if not (isinstance(value, Built) and value.call == v2 and len(value.args) == 6 and value.state is None):
        raise TensorSpecError(field=where, expected=f"one tensor ({v2})", found=type(value).__name__)
    storage, offset, size, stride, _, hooks = value.args
    pid = storage.pid if isinstance(storage, Persistent) else None
    if not (
        isinstance(pid, tuple)
        and len(pid) == 5
        and pid[0] == "storage"
        and isinstance(pid[1], Global)
        and pid[1].name in STORAGE_TYPES
        and isinstance(pid[2], str)
        and pid[2].isalnum()
        and isinstance(pid[4], int)
        and 0 <= pid[4] < MAX_DIM
        and isinstance(offset, int)
        and 0 <= offset < MAX_DIM
        and isinstance(hooks, Built)
        and hooks.call == Global("collections", "OrderedDict")
        and hooks.args == ()
    ):
        raise TensorSpecError(field=where, expected="a storage reference, an offset and no hooks", found="other")
    dims, steps = shape_of(size, where, TensorSpecError), shape_of(stride, where, TensorSpecError)
    if len(steps) != len(dims):
        raise TensorSpecError(field=where, expected=f"{len(dims)} strides", found=len(steps))
    return STORAGE_TYPES[pid[1].name], pid[2], pid[4], offset, dims, steps


def _decode(buf: bytes, dtype: np.dtype[Any], sizes: tuple[int, ...], where: str) -> np.ndarray:
    """One chunk's ``torch.save`` archive, read as data: its tensor, checked (dtype, shape, and the
    storage holds every element the offset and strides reach)."""
    try:
        archive = zipfile.ZipFile(io.BytesIO(buf))
        infos = {info.filename: info for info in archive.infolist()}
    except _ZIP_ERRORS:
        expected = "a torch.save archive (DCP's torch_save serialization)"
        raise TensorSpecError(field=where, expected=expected, found="other bytes") from None
    prefixes = {name.split("/", 1)[0] for name in infos}
    if len(prefixes) != 1 or len(infos) > 16 or any(i.compress_type != zipfile.ZIP_STORED for i in infos.values()):
        raise TensorSpecError(field=where, expected="an uncompressed torch.save archive", found=f"{len(infos)} entries")
    prefix = prefixes.pop()
    if f"{prefix}/byteorder" in infos and _member(archive, infos, f"{prefix}/byteorder", 16, where) != b"little":
        raise TensorSpecError(field=where, expected="little-endian storage", found="another byte order")
    data = _member(archive, infos, f"{prefix}/data.pkl", _MAX_PICKLE_BYTES, where)
    what = "torch.save tensor classes"
    value = read_pickle(data, TENSOR_GLOBALS, where=where, what=what, error=TensorSpecError, persistent=True)
    tag, key, numel, offset, dims, steps = _rebuild_args(value, where)
    if (tag, dims) != (dtype_tag(dtype), sizes):
        raise TensorSpecError(field=where, expected=f"{dtype_tag(dtype)}{list(sizes)}", found=f"{tag}{list(dims)}")
    raw = _member(archive, infos, f"{prefix}/data/{key}", numel * dtype.itemsize, where)
    if len(raw) != numel * dtype.itemsize:
        raise TensorSpecError(field=where, expected=f"{numel * dtype.itemsize} storage bytes", found=len(raw))
    if not math.prod(dims):
        return np.empty(dims, dtype=dtype)
    reach = offset + sum((d - 1) * s for d, s in zip(dims, steps, strict=True))
    if reach >= numel:
        raise TensorSpecError(field=where, expected=f"offset and strides within {numel} elements", found=reach + 1)
    base = np.frombuffer(raw, dtype=dtype)[offset:]
    strides = tuple(s * dtype.itemsize for s in steps)
    return np.array(np.lib.stride_tricks.as_strided(base, shape=dims, strides=strides, writeable=False))


Planned = tuple[StoredItem, str, Chunk]


def _read_file(file: Path, planned: list[Planned], arrays: dict[str, np.ndarray], field: str) -> str:
    """Read ``file`` once, front to back: each planned chunk decoded into its tensor, every byte
    hashed on the way (the digest line of ``cairn.interop.weights.content_hash``)."""
    where = f"{field}: {file.name}"
    if not file.is_file():
        raise TensorSpecError("a data file the metadata names is missing", field=where, expected="a file", found="none")
    inner = hashlib.sha256()
    with open(file, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        pos = 0
        for item, key, chunk in sorted(planned, key=lambda p: p[0].offset):
            end = item.offset + item.length
            if end > size:
                raise TensorSpecError(
                    "truncated: shorter than its .metadata says", field=where, expected=f"{end} bytes", found=size
                )
            if item.offset < pos:
                raise TensorSpecError("items overlap", field=where, expected=f"offset >= {pos}", found=item.offset)
            while pos < item.offset:
                gap = f.read(min(8 << 20, item.offset - pos))
                if not gap:
                    raise TensorSpecError("truncated while read", field=where, expected=f"{end} bytes", found=pos)
                inner.update(gap)
                pos += len(gap)
            buf = f.read(item.length)
            if len(buf) != item.length:
                raise TensorSpecError(
                    "truncated while read", field=where, expected=f"{end} bytes", found=pos + len(buf)
                )
            inner.update(buf)
            pos = end
            region = tuple(slice(o, o + s) for o, s in zip(chunk.offsets, chunk.sizes, strict=True))
            arrays[key][region] = _decode(buf, arrays[key].dtype, chunk.sizes, f"{field}: {key}")
        while rest := f.read(8 << 20):
            inner.update(rest)
            pos += len(rest)
    return _digest_line(file, pos, inner.hexdigest())


def read_dcp_tensors(
    path: Path, metadata: DcpMetadata, keys: Collection[str], field: str = FIELD
) -> tuple[dict[str, np.ndarray], str]:
    """The tensors ``keys`` (flat keys of ``metadata.tensors``) of the DCP directory ``path``, every
    chunk bounded before it is read and checked after, and the directory's content hash: sha256
    over the name, size and bytes of ``.metadata`` and of every data file it names (as
    ``cairn.interop.weights.content_hash`` of those files), each read once."""
    arrays: dict[str, np.ndarray] = {}
    plan: dict[str, list[Planned]] = {}
    for key in keys:
        entry = metadata.tensors[key]
        _check_chunks(key, entry, field)
        dtype = dtype_from_tag(entry.dtype, f"{field}: {key}")
        arrays[key] = np.empty(entry.shape, dtype=dtype)
        for chunk in entry.chunks:
            item = metadata.items.get((key, chunk.offsets))
            if item is None:
                raise TensorSpecError(field=f"{field}: {key}", expected=f"bytes of chunk {chunk.offsets}", found="none")
            bound = math.prod(chunk.sizes) * dtype.itemsize + ITEM_SLACK
            if item.length > bound:
                raise SizeLimitError(field=f"{field}: {key}", expected=f"<= {bound} bytes", found=item.length)
            plan.setdefault(item.file, []).append((item, key, chunk))
    lines = {METADATA_FILE: metadata.digest}
    for name in sorted(metadata.files):
        lines[name] = _read_file(path / name, plan.get(name, []), arrays, field)
    return arrays, _combined(lines)


def _layouts(metadata: DcpMetadata, known: set[str]) -> list[tuple[str, dict[str, str], list[str]]]:
    """Each way the DCP may hold the model (``model.KEY``; ``KEY`` at the top level): its name,
    model key -> flat key, and the entries it leaves unexplained."""
    keys = sorted(set(metadata.tensors) | metadata.others)
    out = []
    for prefix, name in (("model.", "under model."), ("", "at the top level")):
        found, extra = {}, []
        for key in keys:
            group = key.split(".", 1)[0]
            if key.startswith(prefix) and (prefix or group not in OTHER_GROUPS) and key[len(prefix) :] in known:
                found[key[len(prefix) :]] = key
            elif group not in OTHER_GROUPS:
                extra.append(key)
        out.append((name, found, extra))
    return out


def read_dcp_weights(
    path: Path, trainer: WeightExchange, fresh: Mapping[str, np.ndarray], *, field: str = FIELD
) -> ImportedWeights:
    """The model weights of the DCP directory ``path`` under their checkpoint names, checked
    against ``fresh`` (the model's step-0 state) as ``read_weights`` checks a safetensors file:
    every weight present (under ``model.`` or at the top level; optimizer and TorchTitan's other
    state passed over: hashed, never decoded), nothing unknown, dtypes and shapes before a byte
    is read, values by the trainer's rules, a tied alias equal to its tensor."""
    metadata = read_dcp_metadata(path, field)
    names, aliases = trainer.exchange_names()
    candidates = []
    for layout, found, extra in _layouts(metadata, set(names) | set(aliases)):
        missing = sorted(set(names) - set(found))
        candidates.append((len(missing) + len(extra), layout, found, missing, extra))
    problems, layout, found, missing, extra = min(candidates, key=lambda c: c[0])
    if problems:
        raise TensorSpecError(
            "the DCP's entries are not this model's weights",
            field=field,
            expected=f"{len(names)} weights {layout}" + (f", missing {missing[:5]}" if missing else ""),
            found=f"{len(found)} of them" + (f", and unknown {extra[:5]}" if extra else ""),
        )
    for key, flat in found.items():
        want = fresh[names.get(key) or aliases[key]]
        entry = metadata.tensors.get(flat)
        if entry is None:
            raise TensorSpecError(field=f"{field}: {flat}", expected="a tensor", found="a pickled Python object")
        if (entry.dtype, entry.shape) != (dtype_tag(want.dtype), want.shape):
            raise TensorSpecError(
                field=f"{field}: {flat}",
                expected=f"{dtype_tag(want.dtype)}{list(want.shape)}",
                found=f"{entry.dtype}{list(entry.shape)}",
            )
    by_flat, digest = read_dcp_tensors(path, metadata, found.values(), field)
    arrays: dict[str, np.ndarray] = {}
    for key, flat in found.items():
        if key in names:
            trainer.check_values(names[key], by_flat[flat].reshape(-1))
            arrays[names[key]] = by_flat[flat]
    for key, flat in found.items():
        name = aliases.get(key)
        if name is not None and byte_view(by_flat[flat]) != byte_view(arrays[name]):
            raise TensorSpecError(
                "a tied weight differs from the tensor it is tied to",
                field=f"{field}: {flat}",
                expected=f"equal to {name}",
                found="other values",
            )
    return ImportedWeights(arrays, digest)
