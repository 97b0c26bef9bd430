"""The adapter's data splits: ``(x, y)`` pairs or map-style datasets, batched by index arrays."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import default_collate

from cairn.errors import ConfigError

__all__ = ["DataSplit", "Split", "as_tensor"]

DataSplit = tuple[Any, Any] | TorchDataset  # type: ignore[type-arg]


def as_tensor(value: Any) -> torch.Tensor:
    return value if isinstance(value, torch.Tensor) else torch.as_tensor(np.asarray(value))


class Split:
    """A data split with batch access by index array, and its content hash."""

    def __init__(self, data: DataSplit, name: str) -> None:
        self.name = name
        self.x: torch.Tensor | None = None
        self.y: torch.Tensor | None = None
        self.dataset: Any = None
        if isinstance(data, tuple):
            if len(data) != 2:
                raise ConfigError(f"{name} data", expected="an (x, y) pair", found=f"a tuple of {len(data)}")
            x, y = as_tensor(data[0]), as_tensor(data[1])
            if x.shape[0] != y.shape[0]:
                raise ConfigError(f"{name} data", expected="x and y of equal length", found=(x.shape, y.shape))
            self.x, self.y = x, y
            self.n = int(x.shape[0])
        else:
            self.dataset = data
            self.n = len(data)  # type: ignore[arg-type]

    def batch(self, idx: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        if self.x is not None and self.y is not None:
            index = torch.from_numpy(np.ascontiguousarray(idx, dtype=np.int64))
            return self.x[index], self.y[index]
        xb, yb = default_collate([self.dataset[int(i)] for i in idx])
        return xb, yb

    def content_hash(self, h: Any) -> None:
        h.update(f"{self.name}:{self.n}".encode())
        batches = [np.arange(s, min(s + 4096, self.n)) for s in range(0, self.n, 4096)]
        for idx in batches:
            for t in self.batch(idx):
                arr = t.detach().contiguous().numpy()
                h.update(f"{arr.dtype.str}{arr.shape}".encode())
                h.update(arr.tobytes())
