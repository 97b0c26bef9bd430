"""Dataset files (``cairn.data``): a header that declares more than the file holds, values that are
not numeric and finite, and a path that is not a regular file are refused before anything is
allocated; a good file still loads, and hashes the same as .npz and as .npy."""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np
import pytest

from cairn import errors as E
from cairn.config import DatasetConfig
from cairn.data import load_dataset
from tests.conftest import guarded, refused_within_bounds, small_config


def _npy_header(shape: tuple[int, ...], descr: str = "<f8") -> bytes:
    import io

    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _file_config(path: Path) -> DatasetConfig:
    return small_config(data={"source": "file", "path": str(path), "n_features": 4, "n_classes": 3}).data


def test_a_dataset_header_that_lies_is_refused_before_allocating(tmp_path: Path) -> None:
    import zipfile

    lie = _npy_header((10**11, 5)) + b"\0" * 64  # declares 3.6 TiB in 200 bytes
    npy = tmp_path / "lie.npy"
    npy.write_bytes(lie)
    npz = tmp_path / "lie.npz"
    with zipfile.ZipFile(npz, "w") as archive:
        archive.writestr("x.npy", lie)
        archive.writestr("y.npy", _npy_header((3,), "<i8") + b"\0" * 24)
    for path in (npy, npz):
        err = refused_within_bounds(functools.partial(load_dataset, _file_config(path)), E.ConfigError)
        assert "declares more data than it holds" in str(err)


@pytest.mark.parametrize("kind", ["strings", "nan-labels", "complex"])
def test_dataset_values_must_be_numeric_and_finite(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "data.npz"
    x = np.zeros((6, 4))
    if kind == "strings":
        np.savez(path, x=x.astype(str), y=np.zeros(6, dtype=np.int64))
    elif kind == "nan-labels":
        np.savez(path, x=x, y=np.array([0.0, 1.0, np.nan, 2.0, 0.0, 1.0]))
    else:
        np.savez(path, x=x.astype(np.complex128), y=np.zeros(6, dtype=np.int64))
    with pytest.raises(E.ConfigError):
        load_dataset(_file_config(path))


def test_dataset_path_must_be_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "data.npz"
    os.mkfifo(fifo)
    exc = guarded(lambda: load_dataset(_file_config(fifo)))
    assert isinstance(exc, E.ConfigError) and "FIFO" in str(exc)


def test_a_good_dataset_file_still_loads_and_hashes(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((20, 4)), rng.integers(0, 3, 20)
    np.savez_compressed(tmp_path / "d.npz", x=x, y=y)
    np.save(tmp_path / "d.npy", np.column_stack([x, y]))
    a = load_dataset(_file_config(tmp_path / "d.npz"))
    b = load_dataset(_file_config(tmp_path / "d.npy"))
    assert a.content_hash == b.content_hash and a.x.shape == (20, 4)
