"""Datasets: generated deterministically from the config, or loaded from a user's file.

The dataset's content hash goes into every checkpoint's lineage; a checkpoint trained on
other data is refused on import.

A dataset file must be a regular file (never a FIFO or a device) of at most 4 GiB. Its
``.npy`` headers are read and checked before ``np.load`` allocates anything: numeric dtypes
only, at most ``MAX_DATASET_ELEMENTS`` values in ``x``, and every declared array must fit in
the bytes actually present (a 100-byte file declaring a 745 GiB array is refused, not
allocated). Arrays in an ``.npz`` are bounded by the uncompressed sizes the archive declares,
which ``zipfile`` enforces while inflating.
"""

from __future__ import annotations

import hashlib
import math
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from cairn.config import MAX_DATASET_ELEMENTS, DatasetConfig
from cairn.errors import ConfigError
from cairn.jsonio import open_regular_file

__all__ = ["Dataset", "load_dataset", "dataset_hash"]

MAX_FILE_BYTES = 4 << 30


@dataclass(frozen=True)
class Dataset:
    """Examples ``x`` (N x D, float64) with integer labels ``y`` (N,), plus their content hash."""

    x: np.ndarray
    y: np.ndarray
    content_hash: str
    version: str

    @property
    def n_examples(self) -> int:
        return int(self.x.shape[0])


def dataset_hash(x: np.ndarray, y: np.ndarray) -> str:
    """sha256 over shapes, dtypes and C-order bytes of both arrays."""
    h = hashlib.sha256()
    for arr in (x, y):
        h.update(f"{arr.dtype.str}{arr.shape}".encode())
        h.update(np.ascontiguousarray(arr).data)
    return "sha256:" + h.hexdigest()


def _synthetic(cfg: DatasetConfig) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian blobs around random class centres; a pure function of the config."""
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([cfg.seed, 0xDA7A])))
    centres = rng.standard_normal((cfg.n_classes, cfg.n_features)) * 2.0
    y = rng.integers(0, cfg.n_classes, size=cfg.n_examples, dtype=np.int64)
    x = centres[y] + cfg.noise * rng.standard_normal((cfg.n_examples, cfg.n_features))
    return x.astype(np.float64), y


_NPY_MAGIC = b"\x93NUMPY"
_ZIP_MAGICS = (b"PK\x03\x04", b"PK\x05\x06")


def _check_npy_header(fp: IO[bytes], available: int, where: str) -> int:
    """Read one .npy header from ``fp``; refuse unless its dtype is numeric and its declared data
    fits in ``available`` bytes (file or member size). Returns the declared element count."""
    try:
        version = np.lib.format.read_magic(fp)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(fp)
        elif version == (2, 0):
            shape, _, dtype = np.lib.format.read_array_header_2_0(fp)
        else:
            raise ConfigError(where, expected=".npy format version 1.0 or 2.0", found=version)
    except (ValueError, OSError, EOFError) as exc:
        raise ConfigError(f"{where}: not a readable .npy header: {exc}") from None
    if dtype.kind not in "biuf" or dtype.hasobject:
        raise ConfigError(where, expected="a numeric dtype (bool, int, uint, float)", found=dtype.str)
    elements = math.prod(shape)
    declared = elements * dtype.itemsize
    if declared > available - fp.tell():
        raise ConfigError(
            f"{where}: declares more data than it holds (truncated or forged header): "
            f"expected <= {available - fp.tell()} bytes, found {declared} bytes for shape {shape}"
        )
    return elements


def _check_headers(fp: IO[bytes], size: int, path: Path) -> None:
    """Bound what ``np.load`` will allocate, from the headers alone."""
    head = fp.read(6)
    fp.seek(0)
    if head.startswith(_ZIP_MAGICS):
        try:
            with zipfile.ZipFile(fp) as archive:
                members = {info.filename: info for info in archive.infolist()}
                if not {"x.npy", "y.npy"} <= set(members):
                    found = sorted(name.removesuffix(".npy") for name in members)
                    raise ConfigError("data.path", expected="arrays 'x' and 'y'", found=found)
                for name in ("x", "y"):
                    info = members[f"{name}.npy"]
                    with archive.open(info) as member:
                        elements = _check_npy_header(member, info.file_size, f"data.path: {path}[{name}]")
                    _check_elements(elements, f"{path}[{name}]")
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError) as exc:
            raise ConfigError(f"data.path: cannot read {path} as .npz: {exc}") from exc
    elif head.startswith(_NPY_MAGIC):
        _check_elements(_check_npy_header(fp, size, f"data.path: {path}"), str(path))
    else:
        raise ConfigError(f"data.path: {path} is neither .npy nor .npz (pickles are never loaded)")
    fp.seek(0)


def _check_elements(elements: int, where: str) -> None:
    if elements > MAX_DATASET_ELEMENTS:
        raise ConfigError(
            f"data.path: {where}: dataset too large", expected=f"<= {MAX_DATASET_ELEMENTS} values", found=elements
        )


def _from_file(cfg: DatasetConfig) -> tuple[np.ndarray, np.ndarray]:
    assert cfg.path is not None
    path = Path(cfg.path)
    with open_regular_file(path, what="dataset file (data.path)", max_bytes=MAX_FILE_BYTES) as fp:
        _check_headers(fp, os.fstat(fp.fileno()).st_size, path)
        try:
            # allow_pickle=False: a dataset file can never execute code on load.
            loaded = np.load(fp, allow_pickle=False)
            if isinstance(loaded, np.lib.npyio.NpzFile):
                with loaded:
                    missing = {"x", "y"} - set(loaded.files)
                    if missing:
                        raise ConfigError("data.path", expected="arrays 'x' and 'y'", found=sorted(loaded.files))
                    x, y = loaded["x"], loaded["y"]
            else:
                if loaded.ndim != 2 or loaded.shape[1] < 2:
                    raise ConfigError("data.path", expected="2-D array N x (D+1)", found=loaded.shape)
                x, y = loaded[:, :-1], loaded[:, -1]
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise ConfigError(f"data.path: cannot read {path} as .npy/.npz without pickle: {exc}") from exc
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise ConfigError("data.path", expected="x: N x D, y: N", found=f"x {x.shape}, y {y.shape}")
    if not np.all(np.isfinite(x)):
        raise ConfigError("data.path: x holds NaN or infinity")
    if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
        raise ConfigError("data.path: labels y hold NaN or infinity")
    y_int = y.astype(np.int64)
    if not np.array_equal(y_int, y):
        raise ConfigError("data.path: labels y must be integers")
    return np.ascontiguousarray(x, dtype=np.float64), y_int


def load_dataset(cfg: DatasetConfig) -> Dataset:
    """Build or load the dataset and check it against the config's declared sizes."""
    x, y = _synthetic(cfg) if cfg.source == "synthetic" else _from_file(cfg)
    if cfg.source == "file":
        if x.shape[1] != cfg.n_features:
            raise ConfigError("data.n_features", expected=x.shape[1], found=cfg.n_features)
        if y.size and (y.min() < 0 or y.max() >= cfg.n_classes):
            raise ConfigError(
                "data.n_classes",
                expected=f"> max label {int(y.max())}",
                found=cfg.n_classes,
            )
    return Dataset(x=x, y=y, content_hash=dataset_hash(x, y), version=cfg.version)
