"""Datasets: generated deterministically from the config, or loaded from a user's file.

The dataset's content hash goes into every checkpoint's lineage; a checkpoint trained on
other data is refused on import.
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cairn.config import DatasetConfig
from cairn.errors import ConfigError

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


def _from_file(cfg: DatasetConfig) -> tuple[np.ndarray, np.ndarray]:
    assert cfg.path is not None
    path = Path(cfg.path)
    if not path.is_file():
        raise ConfigError(f"data.path: dataset file not found: {path}")
    if path.stat().st_size > MAX_FILE_BYTES:
        raise ConfigError("data.path", expected=f"<= {MAX_FILE_BYTES} bytes", found=f"{path.stat().st_size} bytes")
    try:
        # allow_pickle=False: a dataset file can never execute code on load.
        loaded = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile) as exc:
        raise ConfigError(f"data.path: cannot read {path} as .npy/.npz without pickle: {exc}") from exc
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
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise ConfigError("data.path", expected="x: N x D, y: N", found=f"x {x.shape}, y {y.shape}")
    if not np.all(np.isfinite(x)):
        raise ConfigError("data.path: x holds NaN or infinity")
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
